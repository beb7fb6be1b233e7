"""What issue 37 found missing in the server, through the real server process and the official
``openai`` client: the Responses API (``client.responses``: whole, streamed, tools round trip,
structured output), usage sent once in a stream, the request log line, ``/v1/models`` without the
user's paths (unless ``--expose-paths``) and ``/v1/models/{id}``, tool_calls finishes in ``/metrics``."""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import pytest
from pydantic import BaseModel

from serve_checks import MODEL, SERVE_ARGS, error_of, running_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("responses_home")) as srv:
        yield srv


class Weather(BaseModel):
    city: Literal["Paris", "London", "Tokyo"]
    unit: Literal["celsius", "fahrenheit"]


class City(BaseModel):
    name: str
    country: str


WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The current weather in a city",
                "parameters": Weather.model_json_schema(), "strict": True}
QUESTION = "Name three colours of the rainbow."
ASK = "What is the weather like in Paris right now?"


def test_a_response_whole_and_streamed_is_the_chat_answer(server):
    cli = server.client()
    messages = [{"role": "user", "content": QUESTION}]
    # each compared request follows the same request (the reused prefix changes a near-tie's argmax)
    cli.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    chat = cli.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)
    whole = cli.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=24)
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.output_text == chat.choices[0].message.content
    assert whole.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert whole.usage.input_tokens == chat.usage.prompt_tokens
    assert whole.usage.output_tokens == chat.usage.completion_tokens
    spec = whole.usage.model_extra["speculative"]
    assert spec["enabled"] is True and 0 <= spec["accepted"] <= spec["drafted"]

    events = list(cli.responses.create(model=MODEL, input=QUESTION, temperature=0, max_output_tokens=24, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.incomplete" if whole.status == "incomplete" else "response.completed")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.model_extra["speculative"]["enabled"] is True
    # the SDK's own stream helper checks the events' order and indices as it assembles them
    with cli.responses.stream(model=MODEL, input=[{"role": "user", "content": QUESTION}], temperature=0,
                              max_output_tokens=24, instructions="Answer briefly.") as stream:
        final = stream.get_final_response()
    assert final.output_text and final.instructions == "Answer briefly."


def test_a_tool_round_trip(server):
    cli = server.client()
    kw = dict(model=MODEL, tools=[WEATHER_TOOL], temperature=0)
    first = cli.responses.create(input=ASK, tool_choice="required", max_output_tokens=80, **kw)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed" and calls[0].name == "get_weather" and calls[0].call_id
    Weather.model_validate_json(calls[0].arguments)
    with cli.responses.stream(input=ASK, tool_choice="required", max_output_tokens=80, **kw) as stream:
        streamed = stream.get_final_response()
    assert [(c.name, json.loads(c.arguments)) for c in streamed.output if c.type == "function_call"] == \
           [(c.name, json.loads(c.arguments)) for c in calls]
    history = [{"role": "user", "content": ASK}, *[item.model_dump(exclude_none=True) for item in first.output],
               *[{"type": "function_call_output", "call_id": c.call_id, "output": "18 C, sunny"} for c in calls]]
    second = cli.responses.create(input=history, tool_choice="none", max_output_tokens=40, **kw)
    assert second.output_text.strip() and not [i for i in second.output if i.type == "function_call"]
    assert second.usage.input_tokens > first.usage.input_tokens + 10   # the call and its result are in the prompt
    # a call without its output is refused, as OpenAI refuses it
    r = server.http.post("/v1/responses", json={"model": MODEL, "tools": [WEATHER_TOOL], "input": history[:-1]})
    assert r.status_code == 400 and error_of(r)["param"] == "input", r.text
    # cut by max_output_tokens inside the call: incomplete, and the cut call is not text
    cut = cli.responses.create(input=ASK, tool_choice="required", max_output_tokens=6, **kw)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert "tool_call" not in cut.output_text and not cut.output_text.startswith("{")


def test_structured_output_through_text_format(server):
    cli = server.client()
    parsed = cli.responses.parse(model=MODEL, input="A large city in Japan, as JSON.", text_format=City,
                                 temperature=0, max_output_tokens=120)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, City)
    loose = cli.responses.create(model=MODEL, input="Two colours, as JSON.", text={"format": {"type": "json_object"}},
                                 temperature=0, max_output_tokens=60)
    assert loose.output_text.lstrip().startswith("{")


def test_responses_refusals_name_their_field(server):
    good = {"model": MODEL, "input": "Hi", "max_output_tokens": 2}
    refused = [({"previous_response_id": "resp_1"}, "previous_response_id"),
               ({"something_new": 1}, "something_new"),
               ({"reasoning": {"effort": "high"}}, "reasoning"),
               ({"include": ["reasoning.encrypted_content"]}, "include"),
               ({"temperature": -1}, "temperature"),
               ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
               ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
               ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
                "input.0.content"),
               ({"input": [{"role": "user", "content": "Hi", "extra": 1}]}, "input.0.extra"),
               ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
               ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}},
                "text.format"),
               ({"model": "gpt-4"}, "model")]
    for extra, param in refused:
        r = server.http.post("/v1/responses", json={**good, **extra})
        assert r.status_code in (400, 404) and error_of(r)["param"] == param, (extra, r.text)
    harmless = {"store": False, "metadata": {"app": "t"}, "user": "u", "truncation": "disabled", "include": [],
                "parallel_tool_calls": True, "reasoning": {"effort": None}}
    r = server.http.post("/v1/responses", json={**good, **harmless})
    assert r.status_code == 200 and r.json()["status"] in ("incomplete", "completed"), r.text


def sse_chunks(server, body: dict) -> list:
    with server.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_streamed_usage_comes_once_on_the_last_chunk(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 12, "temperature": 0}
    chunks = sse_chunks(server, {**body, "stream_options": {"include_usage": True}})
    with_usage = [c for c in chunks if c.get("usage")]
    assert with_usage == [chunks[-1]] and chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] > 0 and "speculative" in chunks[-1]["usage"]
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    chunks = sse_chunks(server, body)
    assert not [c for c in chunks if "usage" in c] and all(c["choices"] for c in chunks)


def test_models_by_id_and_without_paths(server):
    listed = server.http.get("/v1/models").json()["data"][0]
    assert listed["id"] == MODEL and "/" not in json.dumps(listed["meta"]), listed
    assert listed["meta"]["target"].endswith(".gguf")
    one = server.client().models.retrieve(MODEL)
    assert one.id == MODEL and one.model_extra["meta"] == listed["meta"]
    r = server.http.get("/v1/models/gpt-4")
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"


def test_metrics_count_tool_call_finishes(server):
    def tool_calls_total():
        return server.metrics().get(("vllm:request_success_total", (("finished_reason", "tool_calls"),)), 0.0)

    before = tool_calls_total()
    reply = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], temperature=0, max_tokens=80, tool_choice="required",
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}])
    assert reply.choices[0].finish_reason == "tool_calls"
    assert tool_calls_total() == before + 1


LOG_LINE = re.compile(r"localspec serve: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| (\d{3}) \|\s+[\d.]+ s \| 127\.0\.0\.1 \| "
                      r"(\w+) (\S+)(?: \| prompt (\d+), output (\d+) tokens, [\d.]+ tok/s \| drafted (\d+), accepted (\d+))?$")


def log_lines(server) -> list[tuple]:
    return [m.groups() for m in map(LOG_LINE.match, server.log.read_text().splitlines()) if m]


def test_one_log_line_per_request(server):
    before = len(log_lines(server))
    reply = server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                    max_tokens=8, temperature=0)
    server.http.get("/v1/nothing-here")
    httpx.get(server.url + "/health")        # monitors' polls are not logged
    lines = log_lines(server)[before:]
    assert len(lines) == 2, server.log.read_text()
    status, method, path, prompt, output, drafted, accepted = lines[0]
    assert (status, method, path) == ("200", "POST", "/v1/chat/completions")
    assert (int(prompt), int(output)) == (reply.usage.prompt_tokens, reply.usage.completion_tokens)
    spec = reply.usage.model_extra["speculative"]
    assert (int(drafted), int(accepted)) == (spec["drafted"], spec["accepted"])
    assert lines[1][:3] == ("404", "GET", "/v1/nothing-here") and lines[1][3] is None


def test_quiet_logs_nothing_and_expose_paths_shows_them(tmp_path):
    with running_server(tmp_path, *SERVE_ARGS, "--quiet", "--expose-paths") as srv:
        srv.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        meta = srv.http.get("/v1/models").json()["data"][0]["meta"]
        assert meta["target"].startswith("/") and meta["drafter"].startswith("/")
        assert not log_lines(srv), srv.log.read_text()
