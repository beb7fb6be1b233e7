"""Hardening, fourth round (issue 44), class 2: the model manager under churn, on a real server
with real clients (openai, ollama, httpx) and the CLI in another process.

- ``--max-loaded 1``: 30 concurrent requests over 3 models are all answered 200 (or 429 at the
  queue bound), each equal to its model's answer alone; never a 503 "shutting down".
- Hostile ``keep_alive`` (1e12, 1e300, "99999999999h") is a 400 in Ollama's shape, as Ollama's
  ``time.ParseDuration`` refuses it; the longest duration Go holds is taken; ``/api/ps`` never fails.
- ``/api/ps``, ``/api/tags``, ``/api/show`` and ``/v1/models`` survive a loaded model's GGUF vanishing.
- ``/api/copy`` and ``localspec create`` (another process) over a loaded model take effect for the
  next request; ``localspec rm`` of a loaded model makes the next request a 404.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from cli_run import run_cli
from serve_checks import KEY, running_server
from tiny_models import build_target

MODELS = {"churn-a": "You are A.", "churn-b": "You are B, a brief assistant.", "churn-c": "Answer as C would."}
ASK = [{"role": "user", "content": "Say something."}]
QUEUE = 32


def _create(env: dict, name: str, target: Path, system: str) -> None:
    modelfile = Path(env["LOCALSPEC_HOME"]) / f"{name}.Modelfile"
    modelfile.write_text(f"FROM {target}\nSYSTEM {system}\n")
    proc = run_cli("create", name, "-f", str(modelfile), env=env)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("churn_home")
    target = build_target(home / "tiny.gguf", "random")
    gone = shutil.copy(target, home / "gone.gguf")

    def setup(env: dict) -> None:
        for name, system in MODELS.items():
            _create(env, name, target, system)
        _create(env, "copy-src", target, "You speak like a pirate.")
        _create(env, "copy-dst", target, "You speak like a judge.")
        _create(env, "gone", Path(gone), "You are about to vanish.")

    args = ["churn-a", "--ctx", "256", "--parallel", "2", "--no-spec", "--max-loaded", "1",
            "--queue-size", str(QUEUE), "--api-key", KEY]
    with running_server(home, *args, setup=setup) as srv:
        srv.home, srv.target = home, target
        yield srv


def answer(srv, model: str, *, stream: bool = False) -> str:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    if not stream:
        r = client.chat.completions.create(model=model, messages=ASK, max_tokens=8, temperature=0)
        return r.choices[0].message.content
    parts = client.chat.completions.create(model=model, messages=ASK, max_tokens=8, temperature=0, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)


def loaded(srv) -> set[str]:
    r = srv.http.get("/api/ps")
    assert r.status_code == 200, r.text
    return {m["name"].removesuffix(":latest") for m in r.json()["models"]}


def test_thirty_concurrent_requests_over_three_models_with_one_loaded(server):
    solo = {name: answer(server, name) for name in MODELS}
    assert len(set(solo.values())) > 1, solo   # the models answer differently: a mix-up would show
    results: list = [None] * 30

    def one(i: int) -> None:
        name = list(MODELS)[i % 3]
        try:
            results[i] = (name, answer(server, name, stream=i % 2 == 1))
        except openai.APIStatusError as exc:
            results[i] = (name, exc.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for name, got in results:
        assert got == 429 or got == solo[name], (name, got, solo[name])
    assert sum(1 for _, got in results if got != 429) >= 27, results   # the queue (32) holds every waiter here
    log = server.log.read_text()
    assert "shutting down" not in log and "does not fit beside" not in log, log[-3000:]
    assert "to make room for" in log


@pytest.mark.parametrize("keep", [1e12, 1e300, "99999999999h", "-99999999999h", "1e400s"])
def test_a_keep_alive_past_go_s_durations_is_a_400_and_ps_goes_on(server, keep):
    r = server.http.post("/api/generate", json={"model": "churn-a", "keep_alive": keep})
    assert r.status_code == 400 and set(r.json()) == {"error"} and "keep_alive" in r.json()["error"], r.text
    assert server.http.get("/api/ps").status_code == 200


def test_the_longest_keep_alive_go_holds_is_taken(server):
    c = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    for keep in ("2562047h", 9_000_000_000, -1):
        assert c.generate(model="churn-a", keep_alive=keep).done
        r = server.http.get("/api/ps")
        assert r.status_code == 200, r.text
        (model,) = [m for m in r.json()["models"] if m["name"] == "churn-a:latest"]
        assert 2300 <= datetime.fromisoformat(model["expires_at"]).year <= 2320   # now + 292 years at most
    assert c.generate(model="churn-a", keep_alive="5m").done


def test_listing_routes_survive_a_loaded_model_s_file_vanishing(server):
    assert answer(server, "gone")
    assert "gone" in loaded(server)
    (server.home / "gone.gguf").unlink()
    http = server.http
    ps = http.get("/api/ps")
    assert ps.status_code == 200 and ps.json()["models"][0]["details"]["format"] == "gguf", ps.text
    show = http.post("/api/show", json={"model": "gone"})
    assert show.status_code == 200 and show.json()["system"] == "You are about to vanish.", show.text
    assert http.get("/api/tags").status_code == 200
    assert http.get("/v1/models").status_code == 200
    assert http.get("/v1/models/gone").status_code in (200, 404)
    assert "Traceback" not in server.log.read_text()


def test_a_copy_over_a_loaded_model_takes_effect_for_the_next_request(server):
    pirate, judge = answer(server, "copy-src"), answer(server, "copy-dst")
    assert pirate != judge
    assert loaded(server) == {"copy-dst"}
    r = server.http.post("/api/copy", json={"source": "copy-src", "destination": "copy-dst"})
    assert r.status_code == 200, r.text
    assert answer(server, "copy-dst") == pirate
    show = server.http.post("/api/show", json={"model": "copy-dst"}).json()
    assert show["system"] == "You speak like a pirate."


def test_create_from_another_process_over_a_loaded_model_takes_effect(server):
    judge_again = answer(server, "churn-b")   # "You are B, a brief assistant."
    assert answer(server, "copy-dst")
    assert "copy-dst" in loaded(server)
    env = dict(os.environ, LOCALSPEC_HOME=str(server.home), LOCALSPEC_THREADS="1", HF_HUB_OFFLINE="1")
    _create(env, "copy-dst", server.target, MODELS["churn-b"])
    assert answer(server, "copy-dst") == judge_again


def test_rm_from_another_process_of_a_loaded_model_makes_the_next_request_a_404(server):
    assert answer(server, "copy-src")
    assert "copy-src" in loaded(server)
    env = dict(os.environ, LOCALSPEC_HOME=str(server.home), LOCALSPEC_THREADS="1", HF_HUB_OFFLINE="1")
    proc = run_cli("rm", "copy-src", env=env)
    assert proc.returncode == 0, proc.stderr
    r = server.http.post("/v1/chat/completions", json={"model": "copy-src", "messages": ASK, "max_tokens": 2})
    assert r.status_code == 404, r.text
    assert answer(server, "churn-a")   # the next model loads in its place
    assert "copy-src" not in loaded(server)


def test_delete_of_a_loaded_model_lets_its_running_stream_finish(server):
    r = server.http.post("/api/create", json={"model": "doomed", "from": str(server.target), "system": "Doomed.",
                                              "stream": False})
    assert r.status_code == 200, r.text
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    ask = dict(model="doomed", messages=ASK, max_tokens=200, temperature=0)
    alone = client.chat.completions.create(**ask).choices[0].message.content
    parts, deleted = [], None
    for chunk in client.chat.completions.create(**ask, stream=True):
        parts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        if deleted is None and len(parts) > 2:   # the stream runs: the model goes from the store
            deleted = server.http.request("DELETE", "/api/delete", json={"model": "doomed"})
    assert deleted is not None and deleted.status_code == 200, deleted
    assert "".join(parts) == alone   # not cut short by the delete
    r = server.http.post("/v1/chat/completions", json={"model": "doomed", "messages": ASK, "max_tokens": 2})
    assert r.status_code == 404, r.text
    deadline = time.monotonic() + 10
    while "doomed" in loaded(server):   # idle and removed: unloaded without another request
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_an_unload_waits_for_the_other_client_s_stream(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    ask = dict(model="churn-c", messages=ASK, max_tokens=200, temperature=0)
    alone = client.chat.completions.create(**ask).choices[0].message.content
    parts, unloaded = [], None
    for chunk in client.chat.completions.create(**ask, stream=True):
        parts.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        if unloaded is None and len(parts) > 2:   # Ollama's unload, from another client, mid-stream
            out: list = []
            unloaded = threading.Thread(target=lambda: out.append(server.http.post(
                "/api/generate", json={"model": "churn-c", "keep_alive": 0})))
            unloaded.start()
    unloaded.join(timeout=60)
    assert "".join(parts) == alone   # not cut short with a 503
    assert out[0].status_code == 200 and out[0].json()["done_reason"] == "unload", out[0].text
    assert "churn-c" not in loaded(server)
