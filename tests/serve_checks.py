"""The server as the tests start it: ``localspec serve`` on a free port (:func:`running_server`),
the engine as the server builds it in this process (the ``reference`` fixture), and OpenAI's error
shape (:func:`error_of`). Shared by the server's test modules."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cli_run import default_sigint, run_cli

from localspec.runtime.engine import GenerationConfig
from localspec.core.events import DoneEvent
from localspec.runtime.sampling import CHAT_SAMPLING, SamplingParams
from localspec.speculation.policy import PolicyConfig

KEY = "sk-test-localspec"
MODEL = "smollm2-135m"
CTX = 1024
QUEUE = 2
MAX_BODY = 256 * 1024
# fixed drafting depth: the drafts (and so the sampler's random draws) depend only on the tokens,
# which makes the server's output reproducible by a separate engine
SERVE_ARGS = ["--policy", "fixed", "--draft-max", "4", "--ctx", str(CTX), "--queue-size", str(QUEUE),
              "--max-body", "256K", "--api-key", KEY]
POLICY = PolicyConfig(name="fixed", draft_max=4)


class Server:
    def __init__(self, proc: subprocess.Popen, url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", KEY), max_retries=0, timeout=120,
                             **kw)

    def metrics(self) -> dict[tuple, float]:
        """{(sample name, sorted labels without model_name): value}"""
        text = httpx.get(self.url + "/metrics", timeout=30).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
                out[(s.name, labels)] = s.value
        return out


_DERIVED: list[Path] = []   # this process's default target, derived once (see shared_default_target)


def shared_default_target(home: Path) -> Path:
    """The embedded target as ``home`` uses it (``models/SmolLM2-135M-Instruct.Q4_0.gguf``, which
    store.models.default_target derives from the shipped F16 on a home's first use: ~1.3 s of CPU on an
    idle core), linked to one copy derived once per test process: every server's home is fresh."""
    from localspec.store.models import default_target

    if not _DERIVED:
        cache = Path(tempfile.mkdtemp(prefix="localspec_target_"))
        atexit.register(shutil.rmtree, cache, True)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("LOCALSPEC_HOME", str(cache))
            _DERIVED.append(default_target())
    link = home / "models" / _DERIVED[0].name
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(_DERIVED[0])
    return link


@contextmanager
def running_server(home: Path, *args: str, setup: Callable[[dict], None] | None = None) -> Iterator[Server]:
    """``localspec serve`` on a free port with LOCALSPEC_HOME ``home`` and ``args`` after the model
    flags (default: SERVE_ARGS on the default model); ``setup(env)`` runs first (e.g. ``create``)."""
    env = dict(os.environ, LOCALSPEC_HOME=str(home), LOCALSPEC_THREADS="1", HF_HUB_OFFLINE="1")
    env.pop("LOCALSPEC_API_KEY", None)
    if "--target" not in args:
        shared_default_target(home)
    if setup is not None:
        setup(env)
    log = home / "server.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", "0", *(args or SERVE_ARGS)],
                                stdout=sink, stderr=subprocess.STDOUT, env=env, preexec_fn=default_sigint)
    try:
        url = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the server exited: {log.read_text()}"
            if url is None and (m := re.search(r"Listening on (http://127\.0\.0\.1:\d+)", log.read_text())):
                url = m.group(1)
            if url is not None:
                try:
                    if httpx.get(url + "/health", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        else:
            pytest.fail(f"the server did not come up: {log.read_text()}")
        srv = Server(proc, url, log)
        yield srv
        assert proc.poll() is None, f"the server died: {log.read_text()}"
        srv.http.close()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert "Traceback" not in log.read_text(), log.read_text()


def creates_model(home: Path, name: str, template: str) -> Callable[[dict], None]:
    """``setup`` for :func:`running_server`: ``localspec create name`` in the server's environment
    (in this process: no interpreter start), from a Modelfile in ``home`` that takes the default
    model's files (:func:`shared_default_target`) with ``template`` as its TEMPLATE."""
    modelfile = home / "Modelfile"
    modelfile.write_text(f'FROM {shared_default_target(home)}\nTEMPLATE """{template}"""\n')

    def setup(env: dict) -> None:
        proc = run_cli("create", name, "-f", str(modelfile), env=env)
        assert proc.returncode == 0, proc.stderr
    return setup


@pytest.fixture(scope="module")
def reference():
    """The engine itself, built as the server builds it, in this process."""
    from localspec.cli.common import open_engine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_THREADS", "1")
        _, engine = open_engine(None, None, None, ctx=CTX, threads=None, gpu_layers=None, verbose=False)
    with engine:
        yield engine


def engine_output(engine, prompt, *, max_tokens: int, **sampling) -> DoneEvent:
    params = SamplingParams(**{**asdict(CHAT_SAMPLING), **sampling})   # what a request leaves out: the chat defaults
    config = GenerationConfig(max_tokens=max_tokens, sampling=params, policy=POLICY)
    return [e for e in engine.generate(prompt, config) if isinstance(e, DoneEvent)][0]


def seed_calibration(home: Path, target: Path, drafter: Path | None) -> None:
    """A calibration of ``target`` + ``drafter`` (one thread, CPU, F16 KV cache) in ``home``'s cache,
    as an earlier run leaves it: a server of that model reads it at load and calibrates nothing.
    For servers whose tests are not about the calibration: a background calibration takes a core
    for up to cost_measure.BUDGET_SECONDS, away from the other test worker (xdist)."""
    from localspec.speculation.cost_cache import file_key, machine_key

    from engine_checks import seed_calibration as seed

    seed(home / "calibration.json", "|".join((machine_key(1, 0), "kv=f16", file_key(target), file_key(drafter))))


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"]), body
    assert "Traceback" not in response.text
    return body["error"]


def ollama_error(response: httpx.Response, status: int) -> str:
    """Ollama's error shape, ``{"error": "..."}`` with ``status``: its message."""
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    assert "Traceback" not in response.text
    return body["error"]


def ollama_client(srv: Server) -> "ollama.Client":
    """The official ``ollama`` client on ``srv``, with its API key."""
    import ollama

    return ollama.Client(host=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


class Served:
    """A ``localspec serve`` child (SIGINT at its default, in a session of its own) and its log."""

    def __init__(self, home: Path, *args: str) -> None:
        env = dict(os.environ, LOCALSPEC_HOME=str(home), LOCALSPEC_THREADS="1", HF_HUB_OFFLINE="1")
        env.pop("LOCALSPEC_API_KEY", None)
        if "--target" not in args:
            shared_default_target(home)
        self.log = home / "server.log"
        with open(self.log, "w") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "localspec", "serve", "--port", "0", *args], stdout=sink,
                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited: {self.text()}"
            if m := re.search(r"Listening on http://\S+?:(\d+)", self.text()):
                self.url = f"http://127.0.0.1:{m.group(1)}"
                try:
                    if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"the server did not come up: {self.text()}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
