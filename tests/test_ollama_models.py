"""Models loaded on demand within the memory budget (``serve --ram``): the least recently used
idle model is unloaded when the next one does not fit beside it, a model that does not fit even
alone is one clear error, ``--max-loaded`` (with the pull test); and ``/api/pull`` from a local stand-in of the Hub
(tests/hub_stub.py), with Ollama's NDJSON progress. The real server, the ``ollama`` client."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import ollama
import pytest

from cli_run import run_cli
from hub_stub import FakeHub, _listing_handler
from serve_checks import KEY, MODEL, running_server, seed_calibration, shared_default_target

ASK = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0, "num_predict": 8}
ARGS = ["--ctx", "1024", "--parallel", "1", "--queue-size", "2", "--api-key", KEY]


def client(srv) -> ollama.Client:
    return ollama.Client(host=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def loaded(c) -> set[str]:
    return {m.model.removesuffix(":latest") for m in c.ps().models}


def _create(env, name: str, *lines: str, source=None) -> None:
    from localspec.store.models import resolve

    modelfile = Path(env["LOCALSPEC_HOME"]) / f"{name}.Modelfile"
    modelfile.write_text(f"FROM {source or resolve(None).target}\n" + "".join(f"{line}\n" for line in lines))
    proc = run_cli("create", name, "-f", str(modelfile), env=env)   # in-process: no interpreter start
    assert proc.returncode == 0, proc.stderr


def plan_bytes(target) -> int:
    """What the plan of ``target`` at ARGS' context uses (the budget is sized from it)."""
    from localspec.memory.pair import plan_engine
    from localspec.store.models import ModelSpec

    plan = plan_engine(ModelSpec("x", target), n_ctx=1024, parallel=1)["memory_plan"]
    return sum(d.used_bytes for d in plan.devices)


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory):
    """Two tiny models over the same file, and a RAM budget that holds one of them, not two; the
    embedded default does not fit it even alone."""
    import tiny_models
    from localspec.store.models import resolve

    home = tmp_path_factory.mktemp("budget_home")
    tiny = tiny_models.build_target(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_THREADS", "1")
        one = plan_bytes(tiny)
        assert plan_bytes(resolve(None).target) > 2 * one
    ram = int(one / 0.95 * 1.3)

    def setup(env):
        _create(env, "tiny-a", source=tiny)
        _create(env, "tiny-b", "SYSTEM You are brief.", source=tiny)

    with running_server(home, "tiny-a", *ARGS, "--ram", str(ram), setup=setup) as srv:
        yield srv


def test_the_lru_idle_model_is_unloaded_when_the_next_does_not_fit(budget_server):
    c = client(budget_server)
    assert loaded(c) == {"tiny-a"}
    assert c.chat(model="tiny-b", messages=ASK, options=GREEDY).done
    assert loaded(c) == {"tiny-b"}
    assert c.chat(model="tiny-a:latest", messages=ASK, options=GREEDY).done
    assert loaded(c) == {"tiny-a"}
    log = budget_server.log.read_text()
    assert "unloading tiny-a to make room for tiny-b" in log and "unloading tiny-b to make room for tiny-a" in log


def test_a_model_that_does_not_fit_alone_is_one_clear_error(budget_server):
    r = budget_server.http.post("/api/chat", json={"model": MODEL, "messages": ASK, "stream": False})
    assert r.status_code == 507 and set(r.json()) == {"error"}
    assert "cannot be loaded" in r.json()["error"] and "does not fit" in r.json()["error"]
    v1 = budget_server.http.post("/v1/chat/completions", json={"model": MODEL, "messages": ASK})
    assert v1.status_code == 507 and v1.json()["error"]["code"] == "model_load_failed"
    assert client(budget_server).chat(model="tiny-a", messages=ASK, options=GREEDY).done   # still serving


def test_v1_lists_every_model_and_selects_one(budget_server):
    http = budget_server.http
    ids = [m["id"] for m in http.get("/v1/models").json()["data"]]
    assert {MODEL, "tiny-a", "tiny-b"} <= set(ids)
    r = http.post("/v1/chat/completions", json={"model": "tiny-b", "messages": ASK, "max_tokens": 4})
    assert r.status_code == 200 and r.json()["model"] == "tiny-b"
    assert loaded(client(budget_server)) == {"tiny-b"}


# -- pull ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    import tiny_models

    d = tmp_path_factory.mktemp("hub_files")
    target = tiny_models.build_target(d / "tiny-target.gguf")
    fake = FakeHub()
    fake.add("test/tiny-GGUF", "tiny-target.gguf", target.read_bytes())
    server = ThreadingHTTPServer(("127.0.0.1", 0), _listing_handler(fake))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", fake
    server.shutdown()
    server.server_close()


def test_pull_from_the_registry_with_ollamas_progress_and_max_loaded(hub, tmp_path):
    from localspec.store.models import default_model

    url, fake = hub
    (tmp_path / "models.toml").write_text(
        'schema = 1\n[models.tiny]\ndescription = "tiny test target"\n'
        '[models.tiny.target]\nrepo = "test/tiny-GGUF"\nfile = "tiny-target.gguf"\n', encoding="utf-8")

    def online(env):
        # the preloaded default is never asked for text here: its background calibration would only
        # take a core while the pull runs
        seed_calibration(tmp_path, shared_default_target(tmp_path), default_model().drafter)
        env.update(HF_ENDPOINT=url, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
        env.pop("HF_HUB_CACHE", None)
        env.pop("HF_TOKEN", None)

    with running_server(tmp_path, *ARGS, "--max-loaded", "1", setup=online) as srv:
        c = client(srv)
        progress = list(c.pull("tiny:latest", stream=True))
        assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
        files = [p for p in progress if p.status.startswith("pulling ") and p.total]
        assert files and files[0].completed == files[0].total > 0 and files[0].digest.startswith("sha256:")
        assert "tiny:latest" in {m.model for m in c.list().models}
        assert c.pull("tiny", stream=False).status == "success"   # already there
        assert c.show("tiny").details.family == "llama"
        assert loaded(c) == {MODEL}
        assert c.generate(model="tiny", prompt="Hi", options={"num_predict": 4}).done
        assert loaded(c) == {"tiny"}   # --max-loaded 1: the default went first, though both fit
        assert any("/test/tiny-GGUF/" in path for _, path, _ in fake.log)
        assert f"{MODEL}: calibrated (cached)" in srv.log.read_text()   # the seed was read: no calibration
        r = httpx.post(srv.url + "/api/pull", json={"model": "absent", "stream": False},
                       headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 404 and "catalog" in r.json()["error"]
