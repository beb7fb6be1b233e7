"""Ollama's API on ``localspec serve``, as Ollama's own clients meet it: the real server in a
subprocess, the official ``ollama`` Python client, raw HTTP (httpx) for every error shape. Two
models: the embedded default, preloaded, and a second name created over the same files with a
Hermes-style tool template (loaded when a request names it)."""

from __future__ import annotations

import json
import threading
import time
from typing import Literal

import httpx
import ollama
import pytest
from pydantic import BaseModel

from serve_checks import KEY, MODEL, creates_model, ollama_client, ollama_error, running_server
from tool_templates import HERMES_TEMPLATE

SECOND = "smol-tools"
ARGS = ["--ctx", "1024", "--parallel", "1", "--policy", "fixed", "--draft-max", "4", "--queue-size", "2",
        "--api-key", KEY]
ASK = [{"role": "user", "content": "Name three colours of the rainbow."}]
GREEDY = {"temperature": 0, "num_predict": 16}


class Weather(BaseModel):
    city: Literal["Paris", "London", "Tokyo"]
    unit: Literal["celsius", "fahrenheit"]


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                                 "parameters": Weather.model_json_schema()}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("ollama_home")
    with running_server(home, *ARGS, setup=creates_model(home, SECOND, HERMES_TEMPLATE)) as srv:
        yield srv


client = ollama_client


# -- generation ------------------------------------------------------------------------------------
def test_chat_streamed_and_not_give_the_same_text_and_ollamas_fields(server):
    c = client(server)
    whole = c.chat(model=MODEL, messages=ASK, options=GREEDY)
    parts = list(c.chat(model=f"{MODEL}:latest", messages=ASK, options=GREEDY, stream=True))
    assert whole.message.role == "assistant" and whole.message.content
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    last = parts[-1]
    assert last.done_reason in ("stop", "length") and last.eval_count == whole.eval_count <= 16
    for r in (whole, last):
        assert r.prompt_eval_count > 0 and r.eval_count > 0
        assert r.total_duration >= r.eval_duration > 0 and r.prompt_eval_duration > 0   # nanoseconds
        assert r.total_duration > 1e6
    raw = server.http.post("/api/chat", json={"model": MODEL, "messages": ASK, "options": GREEDY, "stream": False})
    spec = raw.json()["speculative"]   # localspec's own block (the client's models drop unknown keys)
    assert spec["enabled"] is True and 0 <= spec["accepted"] <= spec["drafted"] and spec["cycles"] > 0
    assert raw.json()["message"]["content"] == whole.message.content


def test_generate_streamed_and_not(server):
    c = client(server)
    whole = c.generate(model=MODEL, prompt="The capital of France is", options=GREEDY)
    parts = list(c.generate(model=MODEL, prompt="The capital of France is", options=GREEDY, stream=True))
    assert whole.response and "".join(p.response for p in parts) == whole.response
    assert whole.done and whole.eval_count > 0 and whole.created_at.endswith("Z")
    raw = c.generate(model=MODEL, prompt="1, 2, 3, 4,", raw=True, options=GREEDY)
    assert raw.response and raw.prompt_eval_count < whole.prompt_eval_count   # no template around it


def test_greedy_api_chat_equals_v1_chat_completions(server):
    messages = [{"role": "system", "content": "You answer briefly."}, {"role": "user", "content": "What is 2 + 2?"}]
    for _ in range(2):   # the second of each: both prefill after the same request (see test_serve_agents)
        ours = client(server).chat(model=MODEL, messages=messages,
                                   options={"temperature": 0, "num_predict": 24, "seed": 3, "top_k": 20})
        v1 = server.http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 24, "seed": 3, "top_k": 20}).json()
    assert ours.message.content == v1["choices"][0]["message"]["content"] and ours.message.content
    assert ours.eval_count == v1["usage"]["completion_tokens"]


def test_tools_round_trip(server):
    c = client(server)
    ask = [{"role": "user", "content": "Call get_weather for Paris in celsius."}]
    for _ in range(2):   # the second: after the same request, as the streamed one below (see test_serve_agents)
        reply = c.chat(model=MODEL, messages=ask, tools=[WEATHER_TOOL], options={"temperature": 0, "num_predict": 200})
    calls = reply.message.tool_calls
    assert calls, reply.message
    call = calls[0].function
    assert call.name == "get_weather" and isinstance(call.arguments, dict)
    Weather.model_validate(call.arguments)
    streamed = list(c.chat(model=MODEL, messages=ask, tools=[WEATHER_TOOL], stream=True,
                           options={"temperature": 0, "num_predict": 200}))
    assert [p.message.tool_calls for p in streamed if p.message.tool_calls][0][0].function.arguments == call.arguments
    history = ask + [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": call.name,
                                                                                       "arguments": call.arguments}}]},
                     {"role": "tool", "tool_name": "get_weather", "content": '{"temp": 21, "sky": "clear"}'}]
    # room for a whole answer or call: a call cut by num_predict is neither content nor a call (done_reason length)
    answer = c.chat(model=MODEL, messages=history, tools=[WEATHER_TOOL], options={"temperature": 0, "num_predict": 200})
    assert answer.done and (answer.message.content or answer.message.tool_calls), answer


def test_format_schema_gives_valid_json(server):
    reply = client(server).chat(model=MODEL, messages=[{"role": "user", "content": "The weather in Tokyo, as JSON."}],
                                format=Weather.model_json_schema(), options={"temperature": 0, "num_predict": 60})
    Weather.model_validate_json(reply.message.content)
    loose = client(server).generate(model=MODEL, prompt="Your name and age as JSON.", format="json",
                                    options={"temperature": 0, "num_predict": 60})
    assert loose.response.lstrip().startswith("{")
    if loose.done_reason == "stop":
        assert isinstance(json.loads(loose.response), dict)


# -- models ----------------------------------------------------------------------------------------
def test_version_list_show(server):
    c = client(server)
    assert [int(x) for x in httpx.get(server.url + "/api/version").json()["version"].split(".")] >= [0, 6, 4]
    names = {m.model for m in c.list().models}
    assert {f"{MODEL}:latest", f"{SECOND}:latest"} <= names
    listed = {m.model: m for m in c.list().models}[f"{MODEL}:latest"]
    assert listed.size > 0 and listed.digest and listed.details.format == "gguf" and listed.details.family == "llama"
    plain, tools = c.show(MODEL), c.show(f"{SECOND}:latest")
    assert plain.capabilities == ["completion"] and tools.capabilities == ["completion", "tools"]
    assert plain.details.quantization_level and plain.details.parameter_size.endswith("M")
    assert plain.modelinfo["general.architecture"] == "llama" and plain.modelinfo["llama.context_length"] > 0
    assert "FROM " in plain.modelfile and tools.template == HERMES_TEMPLATE
    draft = server.http.post("/api/show", json={"model": MODEL}).json()["draft"]
    assert draft["drafter"]["variant"] and "eagle" in draft["sources"] and draft["policy"]["draft_max"] == 4


def test_two_models_in_turn_with_keep_alive_expiring(server):
    c = client(server)
    c.chat(model=MODEL, messages=ASK, options=GREEDY)
    first = c.chat(model=SECOND, messages=ASK, options=GREEDY, keep_alive="2s")
    loaded = {m.model: m for m in c.ps().models}
    assert set(loaded) == {f"{MODEL}:latest", f"{SECOND}:latest"}
    assert loaded[f"{SECOND}:latest"].size > 0 and loaded[f"{SECOND}:latest"].context_length == 1024
    assert loaded[f"{SECOND}:latest"].expires_at.timestamp() - time.time() < 3
    deadline = time.monotonic() + 20
    while f"{SECOND}:latest" in {m.model for m in c.ps().models}:
        assert time.monotonic() < deadline, "keep_alive did not expire"
        time.sleep(0.2)
    again = c.chat(model=SECOND, messages=ASK, options=GREEDY, keep_alive=0)   # loads again, unloads after
    assert again.load_duration > 0 and again.message.content == first.message.content
    deadline = time.monotonic() + 10
    while f"{SECOND}:latest" in {m.model for m in c.ps().models}:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # an empty request loads a model; with keep_alive 0 it unloads it (Ollama's load / unload)
    assert c.generate(model=SECOND, keep_alive=-1).done_reason == "load"
    assert f"{SECOND}:latest" in {m.model for m in c.ps().models}
    assert c.generate(model=SECOND, keep_alive=0).done_reason == "unload"
    assert f"{SECOND}:latest" not in {m.model for m in c.ps().models}


def test_a_loaded_model_answers_while_another_loads(server):
    assert f"{SECOND}:latest" not in {m.model for m in client(server).ps().models}
    finished: dict = {}

    def load():
        client(server).chat(model=SECOND, messages=ASK, options={"num_predict": 1}, keep_alive=0)
        finished["second"] = time.monotonic()

    thread = threading.Thread(target=load)
    thread.start()
    deadline = time.monotonic() + 30
    while SECOND not in httpx.get(server.url + "/health").json()["loading"]:
        assert time.monotonic() < deadline and thread.is_alive()
        time.sleep(0.01)
    assert client(server).chat(model=MODEL, messages=ASK, options={"temperature": 0, "num_predict": 2}).done
    answered = time.monotonic()
    thread.join(120)
    assert answered < finished["second"]
    wait_unloaded = time.monotonic() + 10
    while f"{SECOND}:latest" in {m.model for m in client(server).ps().models}:
        assert time.monotonic() < wait_unloaded
        time.sleep(0.1)


def test_requests_for_a_model_being_loaded_wait_under_the_queue_bound(server):
    """QUEUE (2) requests may wait for a load; more at once get 429 in Ollama's shape."""
    assert f"{SECOND}:latest" not in {m.model for m in client(server).ps().models}
    results: list = []
    body = {"model": SECOND, "messages": ASK, "options": {"temperature": 0, "num_predict": 2}, "stream": False,
            "keep_alive": 0}
    barrier = threading.Barrier(5)

    def ask():
        barrier.wait()
        results.append(server.http.post("/api/chat", json=body))

    threads = [threading.Thread(target=ask) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    codes = sorted(r.status_code for r in results)
    assert codes.count(200) >= 2 and 429 in codes, codes
    assert all("busy" in ollama_error(r, 429) for r in results if r.status_code == 429)


def test_copy_create_delete(server):
    c = client(server)
    c.copy(MODEL, "smol-copy")
    assert c.show("smol-copy").details.family == "llama"
    progress = list(c.create(model="smol-pirate", from_="smol-copy", system="You are a pirate.",
                             parameters={"temperature": 0.2, "stop": ["Arr"]}, stream=True))
    assert progress[-1].status == "success"
    shown = c.show("smol-pirate")
    assert "temperature" in shown.parameters and '"Arr"' in shown.parameters and "You are a pirate." in shown.modelfile
    assert server.http.post("/api/show", json={"model": "smol-pirate"}).json()["system"] == "You are a pirate."
    assert c.chat(model="smol-pirate", messages=ASK, options=GREEDY, keep_alive=0).message.content
    from localspec.store.models import default_model

    default = default_model()   # localspec's own field: the drafter
    r = server.http.post("/api/create", json={"model": "smol-drafted", "from": str(default.target),
                                              "draft": str(default.drafter), "stream": False})
    assert r.json() == {"status": "success"}
    drafted = server.http.post("/api/show", json={"model": "smol-drafted"}).json()["draft"]
    assert drafted["drafter"]["file"] == default.drafter.name and "eagle" in drafted["sources"]
    c.delete("smol-drafted")
    c.delete("smol-pirate")
    c.delete("smol-copy:latest")
    assert not {"smol-pirate:latest", "smol-copy:latest"} & {m.model for m in c.list().models}
    with pytest.raises(ollama.ResponseError) as err:
        c.show("smol-pirate")
    assert err.value.status_code == 404


def test_a_cancelled_stream_leaves_the_other_models_stream_untouched(server):
    c = client(server)
    long = {"temperature": 0, "num_predict": 200}
    alone = c.chat(model=SECOND, messages=ASK, options=GREEDY).message.content
    got: dict = {}

    def other():
        got["text"] = "".join(p.message.content for p in client(server).chat(
            model=SECOND, messages=ASK, options=GREEDY, stream=True))

    stream = c.chat(model=MODEL, messages=ASK, options=long, stream=True)
    next(stream)
    thread = threading.Thread(target=other)
    thread.start()
    next(stream)
    stream.close()   # the client goes away mid-stream
    thread.join(120)
    assert got["text"] == alone
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok"


def test_keep_alive_values():
    from localspec.server.models_manager import parse_keep_alive

    assert [parse_keep_alive(v) for v in ("5m", "1h30m", "10s", "1.5s", "300", 300, 0, "0")] == \
        [300.0, 5400.0, 10.0, 1.5, 300.0, 300.0, 0.0, 0.0]
    assert parse_keep_alive(-1) is None and parse_keep_alive("-1m") is None   # negative: keep
    for bad in ("soon", "5x", "", True, "m5"):
        with pytest.raises(ValueError):
            parse_keep_alive(bad)


# -- errors, raw HTTP ------------------------------------------------------------------------------
@pytest.mark.parametrize("body, status, words", [
    ({"model": "no-such-model", "messages": ASK}, 404, "not found"),
    ({"model": MODEL, "messages": ASK, "options": {"temperature": -1}}, 400, "option temperature must be"),
    ({"model": MODEL, "messages": ASK, "options": {"mirostat": 2}}, 400, "option mirostat"),
    ({"model": MODEL, "messages": ASK, "options": {"num_thread": 3}}, 400, "option num_thread"),
    ({"model": MODEL, "messages": ASK, "options": {"bogus": 1}}, 400, "option bogus"),
    ({"model": MODEL, "messages": ASK, "options": {"draft_max": 999}}, 400, "option draft_max must be"),
    ({"model": MODEL, "messages": ASK, "options": {"top_k": 1.5}}, 400, "option top_k expects an integer"),
    ({"model": MODEL, "messages": ASK, "options": {"num_ctx": 100000}}, 400, "option num_ctx"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400, "images"),
    ({"model": MODEL, "messages": ASK, "think": True}, 400, "thinking"),
    ({"model": MODEL, "messages": ASK, "keep_alive": "soon"}, 400, "keep_alive"),
    ({"model": MODEL, "messages": ASK, "format": "yaml"}, 400, "format"),
    ({"model": MODEL, "messages": ASK, "unknown_field": 1}, 400, "unknown_field"),
    ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
])
def test_chat_errors_in_ollamas_shape(server, body, status, words):
    assert words in ollama_error(server.http.post("/api/chat", json=body), status)


def test_no_op_defaults_are_accepted(server):
    options = {"mirostat": 0, "typical_p": 1.0, "num_gpu": -1, "num_thread": 0, "num_keep": 5, "num_ctx": 512,
               "num_predict": 4, "temperature": 0, "draft_max": 2, "draft_policy": "fixed"}
    r = server.http.post("/api/chat", json={"model": MODEL, "messages": ASK, "options": options, "stream": False})
    assert r.status_code == 200 and r.json()["done"] is True


def test_other_errors_in_ollamas_shape(server):
    http = server.http
    assert "embedding" in ollama_error(http.post("/api/embed", json={"model": MODEL, "input": "x"}), 400)
    assert "embedding" in ollama_error(http.post("/api/embeddings", json={"model": MODEL, "prompt": "x"}), 400)
    ollama_error(http.post("/api/generate", content=b"{not json"), 400)
    ollama_error(http.post("/api/generate", json={"model": MODEL, "prompt": "x", "suffix": "y"}), 400)
    ollama_error(http.post("/api/generate", json={"model": MODEL, "prompt": "x", "raw": True, "context": [1, 2]}), 400)
    ollama_error(http.get("/api/nothing-here"), 404)
    ollama_error(http.get("/api/chat"), 405)
    ollama_error(http.post("/api/show", json={"model": "no-such-model"}), 404)
    ollama_error(http.request("DELETE", "/api/delete", json={"model": "no-such-model"}), 404)
    ollama_error(http.post("/api/copy", json={"source": "no-such-model", "destination": "x"}), 404)
    ollama_error(http.post("/api/create", json={"model": "x"}), 400)
    ollama_error(http.post("/api/create", json={"model": "x", "from": MODEL, "quantize": "q4_K_M"}), 400)
    ollama_error(http.post("/api/create", json={"model": "x", "from": MODEL, "parameters": {"top_p": 7}}), 400)
    ollama_error(http.post("/api/pull", json={"model": "not-in-catalog", "stream": False}), 404)
    ollama_error(httpx.post(server.url + "/api/chat", json={"model": MODEL, "messages": ASK}), 401)
    lines = [json.loads(x) for x in http.post("/api/pull", json={"model": "not-in-catalog"}).text.splitlines()]
    assert "error" in lines[-1]
