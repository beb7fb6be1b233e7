"""``localspec serve --parallel 4`` as clients meet it: a tiny model served in a subprocess, the
official ``openai`` client streaming several requests at once, each answer equal to the same
request served alone (the engine in this process), one cancelled stream leaving the others
unchanged, a long prompt joining streams under way, a follow-up turn reusing its slot's KV, and
slots that do not fit refused with one error line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import httpx
import openai
import pytest

from engine_checks import NEAR_TIE, run
from cli_run import default_sigint
from serve_checks import running_server
from localspec import Engine
from localspec.runtime.sampling import CHAT_SAMPLING

# what a request that sets only temperature 0 gets: the chat defaults (a repeat penalty among them)
GREEDY = replace(CHAT_SAMPLING, temperature=0.0)
from tiny_models import build_target

CTX = 2048
MODEL = "noisy.gguf"
SLOTS = 4
ARGS = ["--parallel", str(SLOTS), "--ctx", str(CTX), "--queue-size", "8", "--policy", "fixed", "--draft-max", "4"]
PROMPTS = ["Hello world, this is", "The quick brown fox jumps over the lazy dog.", "def fibonacci(n):",
           "1, 2, 3, 4, 5,", "Once upon a time", "SELECT * FROM users WHERE"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_target(tmp_path_factory.mktemp("serve_slots") / "noisy.gguf", "noisy", noise=0.006)


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("serve_slots_home"), "--target", str(tiny), *ARGS) as served:
        assert f"{SLOTS} slots of context {CTX}" in served.log.read_text()
        yield served.url


@pytest.fixture(scope="module")
def alone(tiny):
    """Each prompt alone (greedy with the chat defaults' repeat penalty, on a fresh cache, logit
    margins kept): what every answer must be."""
    cache = {}
    engine = Engine(tiny, n_ctx=CTX)

    def answer(prompt: str, max_tokens: int):
        key = (prompt, max_tokens)
        if key not in cache:
            engine.clear_cache()
            cache[key] = run(engine, prompt, max_tokens=max_tokens, spec=False, record_margins=True, sampling=GREEDY)
        return cache[key]
    yield answer, engine
    engine.close()


def assert_same(alone, prompt: str, max_tokens: int, text: str) -> None:
    """``text`` is the answer alone, or leaves it first at a numerical near-tie."""
    answer, engine = alone
    ref = answer(prompt, max_tokens)
    if text == ref.text:
        return
    for i in range(len(ref.tokens)):
        if not text.startswith(engine.model.detokenize(ref.tokens[:i + 1])):
            assert ref.margins[i] < NEAR_TIE, f"{prompt!r} diverged at token {i} with a clear gap {ref.margins[i]:.4f}"
            return
    raise AssertionError(f"{prompt!r}: {text!r} != {ref.text!r}")


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


class Stream(threading.Thread):
    """One streamed completion in a thread: its text, chunk arrival times, and (``stop_after``) a
    client that closes the stream after that many chunks."""

    def __init__(self, url: str, prompt: str, max_tokens: int, stop_after: int | None = None) -> None:
        super().__init__()
        self.url, self.prompt, self.max_tokens, self.stop_after = url, prompt, max_tokens, stop_after
        self.text, self.times, self.finish, self.error = "", [], None, None

    def run(self) -> None:
        try:
            stream = client(self.url).completions.create(model=MODEL, prompt=self.prompt, max_tokens=self.max_tokens,
                                                         temperature=0, stream=True)
            for chunk in stream:
                self.times.append(time.monotonic())
                self.text += chunk.choices[0].text or ""
                self.finish = chunk.choices[0].finish_reason or self.finish
                if self.stop_after is not None and len(self.times) >= self.stop_after:
                    stream.close()
                    return
        except Exception as exc:   # reported by the test
            self.error = repr(exc)


def streams(url: str, specs) -> list[Stream]:
    out = [Stream(url, *spec) for spec in specs]
    for s in out:
        s.start()
    for s in out:
        s.join(300)
    assert not any(s.error for s in out), [s.error for s in out]
    return out


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return float(re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M).group(1))


def test_four_simultaneous_streams_equal_each_request_alone(server, alone):
    done = streams(server, [(p, 64) for p in PROMPTS[:SLOTS]])
    for s in done:
        assert s.finish == "length"
        assert_same(alone, s.prompt, 64, s.text)
    # decoded together: every stream had its first chunk before any had its last
    assert max(s.times[0] for s in done) < min(s.times[-1] for s in done)


def test_a_cancelled_stream_leaves_the_others_unchanged(server, alone):
    done = streams(server, [(PROMPTS[0], 200), (PROMPTS[1], 200, 5), (PROMPTS[2], 200)])
    assert len(done[1].times) == 5
    for s in (done[0], done[2]):
        assert s.finish == "length"
        assert_same(alone, s.prompt, 200, s.text)
    deadline = time.monotonic() + 30
    while metric(server, "llamacpp:requests_processing") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metric(server, "llamacpp:requests_processing") == 0


def test_a_long_prompt_joins_streams_under_way(server, alone):
    """A prompt of more than two batches (512 rows) arrives while two streams run: every answer is
    the one it gets alone."""
    long_prompt = " ".join(f"item {i}," for i in range(250))
    early = [Stream(server, p, 150) for p in PROMPTS[3:5]]
    for s in early:
        s.start()
    while not all(len(s.times) >= 3 for s in early) and all(s.is_alive() for s in early):
        time.sleep(0.01)
    late = streams(server, [(long_prompt, 40)])[0]
    for s in early:
        s.join(300)
        assert s.error is None and s.finish == "length"
        assert_same(alone, s.prompt, 150, s.text)
    assert_same(alone, long_prompt, 40, late.text)


def test_a_follow_up_turn_reuses_its_slots_cache(server):
    c = client(server)
    first = c.completions.create(model=MODEL, prompt=PROMPTS[5], max_tokens=16, temperature=0)
    follow = PROMPTS[5] + first.choices[0].text + " and then"
    second = c.completions.create(model=MODEL, prompt=follow, max_tokens=4, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens < cached < second.usage.prompt_tokens


def test_slots_that_do_not_fit_are_refused_with_one_error_line(smollm2, tmp_path):
    env = dict(os.environ, LOCALSPEC_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "localspec", "serve", "--target", str(smollm2), "--port", "0",
                        "--parallel", "64", "--ctx", "8192", "--ram", "1G"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode != 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: 64 slots of context 8192 do not fit the memory budget"), \
        r.stderr
    assert "--parallel" in lines[0]


def test_shutdown_stops_every_running_slot_and_refuses_the_waiting(tiny, tmp_path):
    """SIGINT with two slots running and one request waiting: both streams end with the
    shutting-down error event and [DONE], the waiting one gets 503, one log line each."""
    import json

    env = dict(os.environ, LOCALSPEC_HOME=str(tmp_path), LOCALSPEC_THREADS="1", HF_HUB_OFFLINE="1")
    log = tmp_path / "server.log"
    with open(log, "w") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--target", str(tiny), "--port", "0",
                                 "--parallel", "2", "--ctx", "4096", "--no-spec"], stdout=sink,
                                stderr=subprocess.STDOUT, env=env, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 120
        while not (m := re.search(r"Listening on (http://127\.0\.0\.1:\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        url = m.group(1)
        body = {"model": MODEL, "prompt": "1, 2, 3, 4,", "max_tokens": 4000, "temperature": 0, "stream": True}
        outs = [{}, {}, {}]

        def read(out: dict) -> None:
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                out["status"], out["lines"] = r.status_code, [line for line in r.iter_lines() if line]

        threads = [threading.Thread(target=read, args=(o,)) for o in outs]
        for t in threads[:2]:
            t.start()
        health = lambda: httpx.get(url + "/health", timeout=10).json()   # noqa: E731
        while health()["requests_processing"] < 2:
            time.sleep(0.05)
        threads[2].start()
        while health()["requests_deferred"] < 1:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        for t in threads:
            t.join(60)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text, text
    for out in outs[:2]:
        assert out["status"] == 200 and out["lines"][-1] == "data: [DONE]", out
        assert json.loads(out["lines"][-2][len("data: "):])["error"]["code"] == "server_shutting_down"
    assert outs[2]["status"] == 503, outs[2]
    assert len([line for line in text.splitlines() if "shutting down: stopped" in line]) == 2, text
    assert len([line for line in text.splitlines() if "shutting down: refused" in line]) == 1, text
