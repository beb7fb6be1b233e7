"""Ollama's semantics on ``/api``, as the official ``ollama`` client meets them on a real
``localspec serve``: tool results paired by name and order (fewer results than calls accepted),
logprobs in Ollama's shape from the same recorder as ``/v1``, a last assistant message continued,
``context`` taken and given back, fill-in-the-middle with a GGUF's FIM tokens (a tiny target that
declares them; the embedded SmolLM2 declares none), and every refusal in Ollama's error shape."""

from __future__ import annotations

import json

import gguf
import pytest

from serve_checks import KEY, MODEL, ollama_client, ollama_error, running_server
from tiny_models import build_target, rewrite_gguf

FIM = "tiny-fim"
FIM_IDS = (3, 4, 5)      # three of the tokenizer's control tokens, declared as FIM_PRE, FIM_SUF, FIM_MID
ARGS = ["--ctx", "1024", "--parallel", "1", "--policy", "fixed", "--draft-max", "4", "--queue-size", "2",
        "--max-body", "64K", "--api-key", KEY]
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "num_predict": 12}
SYSTEM = {"role": "system", "content": "You answer briefly."}
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _fim_model(home) -> None:
    """A tiny target whose GGUF declares FIM tokens, created in the store as ``tiny-fim``."""
    plain = build_target(home / "tiny.gguf", "random")
    keys = ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id")
    rewrite_gguf(plain, home / "fim.gguf", {k: (t, gguf.GGUFValueType.UINT32) for k, t in zip(keys, FIM_IDS)})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("ollama_semantics")
    _fim_model(home)
    with running_server(home, *ARGS) as srv:
        created = srv.http.post("/api/create", json={"model": FIM, "from": str(home / "fim.gguf"), "stream": False})
        assert created.status_code == 200, created.text
        yield srv


client = ollama_client


# -- tools ---------------------------------------------------------------------------------------------
def test_fewer_tool_results_than_calls_is_answered(server):
    """Three identical calls, one result sent back by tool_name (what the 135M model does and what
    the client then sends): Ollama accepts it, and so does this server; no id the client never saw."""
    calls = [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}} for _ in range(3)]
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": calls},   # content null reads as ""
               {"role": "tool", "tool_name": "get_weather", "content": '{"temp": 21, "sky": "clear"}'}]
    reply = client(server).chat(model=MODEL, messages=history, tools=[WEATHER_TOOL], options=GREEDY)
    assert reply.done and reply.eval_count > 0
    streamed = list(client(server).chat(model=MODEL, messages=history, tools=[WEATHER_TOOL], options=GREEDY,
                                        stream=True))
    assert streamed[-1].done
    # a result that answers no call, and results in another order than the calls: as Ollama, accepted
    odd = history[:1] + [{"role": "tool", "tool_name": "get_weather", "content": "18 C"}]
    raw = server.http.post("/api/chat", json={"model": MODEL, "messages": odd, "options": GREEDY, "stream": False})
    assert raw.status_code == 200 and "call_" not in raw.text, raw.text


def test_a_tool_round_trip_with_the_client(server):
    """The client's own round trip: ask with tools, send back one result per name (fewer than the
    calls whenever the model repeats a call), get an answer."""
    c = client(server)
    ask = [{"role": "user", "content": "Call get_weather for Paris."}]
    first = c.chat(model=MODEL, messages=ask, tools=[WEATHER_TOOL], options={**GREEDY, "num_predict": 200})
    calls = first.message.tool_calls or []
    assert calls, first.message
    names = {call.function.name for call in calls}
    history = ask + [first.message] + [{"role": "tool", "tool_name": n, "content": "18 C, sunny"} for n in names]
    answer = c.chat(model=MODEL, messages=history, tools=[WEATHER_TOOL], options={**GREEDY, "num_predict": 200})
    assert answer.done and (answer.message.content or answer.message.tool_calls)


# -- logprobs --------------------------------------------------------------------------------------------
def test_logprobs_in_ollamas_shape_equal_v1s(server):
    messages = [SYSTEM, {"role": "user", "content": "Name three colours of the rainbow."}]
    reply = client(server).chat(model=MODEL, messages=messages, options=GREEDY, logprobs=True, top_logprobs=3)
    entries = reply.logprobs
    assert entries and "".join(e.token for e in entries) == reply.message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token   # greedy, no penalty: the chosen token is the most likely
    raw = server.http.post("/api/chat", json={"model": MODEL, "messages": messages, "options": GREEDY,
                                              "logprobs": True, "top_logprobs": 3, "stream": False}).json()
    assert set(raw["logprobs"][0]) == {"token", "logprob", "bytes", "top_logprobs"}
    v1 = server.http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": messages, "temperature": 0, "repeat_penalty": 1.0, "max_tokens": 12,
        "logprobs": True, "top_logprobs": 3}).json()
    content = v1["choices"][0]["logprobs"]["content"]
    assert [(e["token"], e["logprob"]) for e in content] == [(e.token, e.logprob) for e in entries]
    assert v1["choices"][0]["message"]["content"] == reply.message.content   # greedy text: the same on both APIs
    streamed = list(client(server).chat(model=MODEL, messages=messages, options=GREEDY, logprobs=True, stream=True))
    assert [e.token for p in streamed for e in (p.logprobs or [])] == [e.token for e in entries]
    assert all(not e.top_logprobs for p in streamed for e in (p.logprobs or []))   # none asked
    generated = client(server).generate(model=MODEL, prompt="1, 2, 3,", raw=True, options=GREEDY, logprobs=True)
    assert "".join(e.token for e in generated.logprobs) == generated.response
    plain = client(server).chat(model=MODEL, messages=messages, options=GREEDY, top_logprobs=3)
    assert plain.logprobs is None   # top_logprobs counts only with logprobs, as in Ollama


# -- prefill, context ----------------------------------------------------------------------------------
def test_a_last_assistant_message_is_continued(server):
    start = "The three colours are"
    messages = [SYSTEM, {"role": "user", "content": "Name three colours of the rainbow."},
                {"role": "assistant", "content": start}]
    reply = client(server).chat(model=MODEL, messages=messages, options=GREEDY)
    prompt = ("<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\nName three colours of the "
              f"rainbow.<|im_end|>\n<|im_start|>assistant\n{start}")
    raw = client(server).generate(model=MODEL, prompt=prompt, raw=True, options=GREEDY)
    assert reply.message.content == raw.response and reply.prompt_eval_count == raw.prompt_eval_count
    assert not reply.message.content.startswith(start)   # the answer is what follows the prefill


def test_context_is_returned_and_taken(server):
    c = client(server)
    first = c.generate(model=MODEL, prompt="My name is Ada.", options=GREEDY)
    assert first.context and all(isinstance(t, int) for t in first.context)
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    alone = c.generate(model=MODEL, prompt="What is my name?", options=GREEDY)
    after = c.generate(model=MODEL, prompt="What is my name?", context=first.context, options=GREEDY)
    assert after.prompt_eval_count == len(first.context) + alone.prompt_eval_count
    assert after.context[: len(first.context)] == list(first.context)
    http = server.http
    for bad in ([-1], [10**9]):
        assert "context" in ollama_error(http.post("/api/generate", json={"model": MODEL, "prompt": "x",
                                                                          "context": bad}), 400)
    assert "context" in ollama_error(http.post("/api/generate", json={"model": MODEL, "prompt": "x", "raw": True,
                                                                      "context": [1, 2]}), 400)
    raw = c.generate(model=MODEL, prompt="1, 2,", raw=True, options=GREEDY)
    assert raw.context is None   # a raw prompt has no template turn to continue, as in Ollama


# -- fill-in-the-middle --------------------------------------------------------------------------------
def test_suffix_uses_the_models_fim_tokens(server):
    c = client(server)
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    fim = c.generate(model=FIM, prompt=prefix, suffix=suffix, options=GREEDY)
    pre, suf, mid = ("<repo_name>", "<reponame>", "<file_sep>")   # tokens 3, 4, 5 of SmolLM2's tokenizer
    same = c.generate(model=FIM, prompt=pre + prefix + suf + suffix + mid, raw=True, options=GREEDY)
    assert fim.response == same.response and fim.prompt_eval_count == same.prompt_eval_count
    error = ollama_error(server.http.post("/api/generate", json={"model": MODEL, "prompt": "x", "suffix": "y"}), 400)
    assert "suffix" in error and "FIM" in error and MODEL in error
    assert "system" in ollama_error(server.http.post("/api/generate", json={
        "model": FIM, "prompt": "x", "suffix": "y", "system": "s"}), 400)
    assert "context" in ollama_error(server.http.post("/api/generate", json={
        "model": FIM, "prompt": "x", "suffix": "y", "context": [1, 2]}), 400)


# -- bad input, in Ollama's shape --------------------------------------------------------------------------
def test_refusals_in_ollamas_shape(server):
    http = server.http
    big = json.dumps({"model": MODEL, "prompt": "x" * (70 * 1024)})
    assert "max-body" in ollama_error(http.post("/api/generate", content=big), 413)
    v1 = http.post("/v1/completions", content=big)
    assert v1.status_code == 413 and v1.json()["error"]["code"] == "request_too_large"
    created = http.post("/api/create", json={"model": "x", "from": MODEL, "messages": [{"role": "tool"}]})
    assert "messages.0.role" in ollama_error(created, 400)
    assert "Traceback" not in server.log.read_text()
    schema = http.post("/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                          "format": {"type": "bogus"}})   # refused by the shared chat path
    assert "format" in ollama_error(schema, 400) and "response_format" not in schema.text
    for body, field in (({"template": "{{ .Prompt }}"}, "template"), ({"images": ["aGk="]}, "images"),
                        ({"top_logprobs": 21}, "top_logprobs"), ({"bogus": 1}, "bogus")):
        assert field in ollama_error(http.post("/api/generate", json={"model": MODEL, "prompt": "x", **body}), 400)
