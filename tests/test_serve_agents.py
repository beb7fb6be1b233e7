"""What agents and editors send, against the real server with the official openai client: tools
(the embedded default's generic JSON format, and the same model given a Hermes-style TEMPLATE
through a Modelfile), structured output, logprobs, Predicted Outputs, and the fields refused with
400. Greedy answers are checked against the engine's own plain decoding (no speculation)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Literal

import pytest
from pydantic import BaseModel, Field

import openai
from localspec.core.events import DoneEvent
from localspec.formats.chat_format import Message
from localspec.formats.json_grammar import schema_grammar
from localspec.runtime.config import GenerationConfig
from localspec.runtime.sampling import CHAT_SAMPLING, SamplingParams
from serve_checks import MODEL, POLICY, creates_model, error_of, reference, running_server  # noqa: F401  (reference: a fixture)
from tool_templates import HERMES_TEMPLATE

HERMES_MODEL = "smol-hermes"


class Weather(BaseModel):
    city: Literal["Paris", "London", "Tokyo"]
    unit: Literal["celsius", "fahrenheit"]


class Clock(BaseModel):
    timezone: Literal["UTC", "CET", "JST"]


TOOLS = [openai.pydantic_function_tool(Weather, name="get_weather", description="The current weather in a city"),
         openai.pydantic_function_tool(Clock, name="get_time", description="The time in a timezone")]
VALIDATORS = {"get_weather": Weather, "get_time": Clock}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The embedded default: its template has no tool support, so the generic format."""
    with running_server(tmp_path_factory.mktemp("agents_home")) as srv:
        yield srv


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A server of its own for the tests that compare with the engine's plain decoding: the target's
    logits after an EAGLE generation on another prompt differ (tests/test_kv_history.py), so these
    comparisons run on a history of their own requests only."""
    with running_server(tmp_path_factory.mktemp("clean_home")) as srv:
        yield srv


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    """The same model with a Hermes/Qwen-style tool template given as the Modelfile's TEMPLATE."""
    home = tmp_path_factory.mktemp("hermes_home")
    with running_server(home, HERMES_MODEL, "--ctx", "2048", "--api-key", "k",
                        setup=creates_model(home, HERMES_MODEL, HERMES_TEMPLATE)) as srv:
        srv.http.headers["Authorization"] = "Bearer k"
        yield srv


def client(srv) -> openai.OpenAI:
    return srv.client(api_key=srv.http.headers["Authorization"].split()[1])


# Both sides answer each compared request twice and compare the second answers: the engine reuses
# the KV cache of the previous request's prompt, which changes the prefill's batch shapes and so the
# logits' last bits (and a near-tie's argmax); after the same request, server and engine prefill alike.
def plain_events(engine, prompt, *, max_tokens: int, **fields) -> list:
    """The engine's own greedy answer without speculation (the request's other fields: chat defaults)."""
    params = SamplingParams(**{**asdict(CHAT_SAMPLING), "temperature": 0.0})
    config = GenerationConfig(max_tokens=max_tokens, sampling=params, policy=POLICY, spec=False, **fields)
    for _ in range(2):
        events = list(engine.generate(prompt, config))
    return events


def plain(engine, prompt, *, max_tokens: int, **fields) -> DoneEvent:
    return plain_events(engine, prompt, max_tokens=max_tokens, **fields)[-1]


def second(create, **kw):
    create(**kw)
    return create(**kw)


def checked_calls(message, expect: str | None = None) -> list[tuple[str, BaseModel]]:
    assert message.tool_calls, message
    out = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id
        assert expect is None or call.function.name == expect
        out.append((call.function.name, VALIDATORS[call.function.name].model_validate_json(call.function.arguments)))
    return out


def streamed(cli: openai.OpenAI, **kw):
    """(content, {index: [id, name, arguments]}, finish_reason) assembled from a stream."""
    content, calls, finish = "", {}, None
    for chunk in cli.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for call in choice.delta.tool_calls or ():
            entry = calls.setdefault(call.index, ["", "", ""])
            entry[0] += call.id or ""
            entry[1] += call.function.name or ""
            entry[2] += call.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize("which", ["server", "hermes"])
def test_forced_tool_calls_validate_and_stream_the_same(which, request):
    srv = request.getfixturevalue(which)
    cli = client(srv)
    for choice, expect in (("required", None), ({"type": "function", "function": {"name": "get_time"}}, "get_time")):
        kw = dict(model=MODEL if which == "server" else HERMES_MODEL, messages=ASK, tools=TOOLS, tool_choice=choice,
                  temperature=0, max_tokens=80, parallel_tool_calls=False)
        reply = cli.chat.completions.create(**kw)
        assert reply.choices[0].finish_reason == "tool_calls"
        calls = checked_calls(reply.choices[0].message, expect)
        assert len(calls) == 1
        # once more, so that the stream and the answer it is compared with both follow the same
        # request: the prompt prefix reused from the previous request changes the batch shapes and
        # so a near-tie's argmax (docs: what "lossless" means here)
        reply = cli.chat.completions.create(**kw)
        checked_calls(reply.choices[0].message, expect)
        content, streamed_calls, finish = streamed(cli, **kw)
        assert finish == "tool_calls" and list(streamed_calls) == [0]
        call_id, name, arguments = streamed_calls[0]
        assert call_id.startswith("call_") and (name, json.loads(arguments)) == (
            reply.choices[0].message.tool_calls[0].function.name,
            json.loads(reply.choices[0].message.tool_calls[0].function.arguments))


@pytest.mark.parametrize("which", ["server", "hermes"])
def test_a_conversation_with_a_tool_result_gets_an_answer(which, request):
    srv = request.getfixturevalue(which)
    cli = client(srv)
    model = MODEL if which == "server" else HERMES_MODEL
    first = cli.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                                        max_tokens=80, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "sunny"})}]
    for choice in ("none", "auto"):
        answer = cli.chat.completions.create(model=model, messages=history, tools=TOOLS, tool_choice=choice,
                                             temperature=0, max_tokens=40)
        message = answer.choices[0].message
        if choice == "none" or not message.tool_calls:
            assert message.content and message.content.strip(), answer
            assert answer.choices[0].finish_reason in ("stop", "length")
        else:
            checked_calls(message)
    # the tool result is part of the prompt: it is longer than the question alone
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens + 10


class City(BaseModel):
    name: str = Field(max_length=24)
    country: str = Field(max_length=24)
    population_millions: int
    capital: bool


PROMPTS = ["Describe Paris as JSON.", "Give me one large city in Japan.", "A city in Brazil, please.",
           "Tell me about Cairo."]


def test_json_schema_outputs_validate_and_equal_plain_decoding(clean, reference):
    cli = client(clean)
    schema = {"type": "json_schema", "json_schema": {"name": "city", "strict": True,
                                                     "schema": City.model_json_schema()}}
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        reply = second(cli.chat.completions.create, model=MODEL, messages=messages, response_format=schema,
                       temperature=0, max_tokens=120)
        text = reply.choices[0].message.content
        City.model_validate_json(text)
        expected = plain(reference, [Message("user", prompt)], max_tokens=120,
                         grammar=schema_grammar(City.model_json_schema()))
        assert text == expected.text
    parsed = cli.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}],
                                        response_format=City, temperature=0, max_tokens=120)
    assert isinstance(parsed.choices[0].message.parsed, City)
    reply = cli.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "List two colours."}],
                                        response_format={"type": "json_object"}, temperature=0, max_tokens=60)
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:
        assert reply.choices[0].message.content.lstrip().startswith("{")


def test_refused_fields_name_their_param(server):
    url = "/v1/chat/completions"
    good = {"model": MODEL, "messages": ASK, "max_tokens": 2}
    refused = [
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"n": 3}, "n"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"something_new": 1}, "something_new"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
         "response_format"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
         "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
         "messages[0].content"),
        ({"prediction": {"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}},
         "prediction.content"),
        ({"messages": ASK + [{"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}]},
         "messages[1].function_call"),
        ({"messages": [{"role": "user", "content": "Hi", "cache_control": {}}]}, "messages.0.cache_control"),
    ]
    for extra, param in refused:
        r = server.http.post(url, json={**good, **extra})
        assert r.status_code == 400 and error_of(r)["param"] == param, (extra, r.text)
    completions = [({"best_of": 2}, "best_of"), ({"logprobs": 2, "echo": True}, "echo"), ({"suffix": "x"}, "suffix"),
                   ({"logprobs": 21}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs")]
    for extra, param in completions:
        r = server.http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, **extra})
        assert r.status_code == 400 and error_of(r)["param"] == param, (extra, r.text)
    harmless = {"user": "u-1", "metadata": {"app": "test"}, "store": False, "service_tier": "auto",
                "prompt_cache_key": "k", "safety_identifier": "s", "parallel_tool_calls": True,
                "modalities": ["text"], "logit_bias": {}, "stream_options": None}
    r = server.http.post(url, json={**good, **harmless})
    assert r.status_code == 200, r.text
    echoed = {"role": "assistant", "content": "Sunny.", "refusal": None, "annotations": [], "audio": None,
              "function_call": None, "tool_calls": None}     # an earlier answer sent back as it came
    r = server.http.post(url, json={**good, "messages": ASK + [echoed, {"role": "user", "content": "Thanks"}]})
    assert r.status_code == 200, r.text


def test_logprobs_spell_the_content_and_equal_plain_decoding(clean, reference):
    from localspec.core.events import TokenEvent

    cli = client(clean)
    question = "Name three colours of the rainbow."
    kw = dict(model=MODEL, messages=[{"role": "user", "content": question}], temperature=0, max_tokens=24)
    reply = second(cli.chat.completions.create, logprobs=True, top_logprobs=3, **kw)
    content = reply.choices[0].logprobs.content
    assert b"".join(bytes(t.bytes) for t in content).decode() == reply.choices[0].message.content
    assert len(content) == reply.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True) and t.logprob <= values[0] + 1e-6
    events = [e for e in plain_events(reference, [Message("user", question)], max_tokens=24, logprobs=3)
              if isinstance(e, TokenEvent)]
    expected = [entry for e in events for entry in e.logprobs]
    assert [t.token for t in content] == [e.text for e in expected]
    for got, want in zip(content, expected):
        assert abs(got.logprob - want.logprob) < 1e-3
        assert [a.token for a in got.top_logprobs] == [t.text for t in want.top]
        assert all(abs(a.logprob - t.logprob) < 1e-3 for a, t in zip(got.top_logprobs, want.top))
    chunks = [c for c in cli.chat.completions.create(logprobs=True, top_logprobs=3, stream=True, **kw)
              if c.choices and c.choices[0].logprobs]
    assert [t.token for c in chunks for t in c.choices[0].logprobs.content] == [t.token for t in content]
    legacy = cli.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert "".join(lp.tokens) == legacy.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) <= 2 and top for top in lp.top_logprobs)


def test_streamed_completion_logprobs_count_text_offset_across_chunks(clean):
    """Each chunk's ``text_offset`` goes on from the text already streamed (it restarted at 0 in
    every chunk): the offsets of all chunks are those of one whole answer, and spell its text."""
    cli = client(clean)
    kw = dict(model=MODEL, prompt="Count: one, two, three,", max_tokens=32, temperature=0, logprobs=1)
    chunks = [c.choices[0] for c in cli.completions.create(stream=True, **kw) if c.choices]
    parts = [c.logprobs for c in chunks if c.logprobs and c.logprobs.tokens]
    assert len(parts) > 1, "the answer came in one chunk: nothing to check across chunks"
    tokens = [t for p in parts for t in p.tokens]
    offsets = [o for p in parts for o in p.text_offset]
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert "".join(tokens) == "".join(c.text for c in chunks)


EDIT = '''def area(width, height):
    """The area of a rectangle."""
    return width * height


def perimeter(width, height):
    return 2 * (width + height)
'''


def test_a_prediction_keeps_the_text_and_its_tokens_are_accepted(server):
    cli = client(server)
    kw = dict(model=MODEL, temperature=0, max_tokens=80,
              messages=[{"role": "user", "content": "Repeat this code exactly, changing nothing:\n" + EDIT}])
    cli.chat.completions.create(**kw)    # the same request first: the same prefix reused for both (see above)
    without = cli.chat.completions.create(**kw)
    with_prediction = cli.chat.completions.create(prediction={"type": "content", "content": EDIT}, **kw)
    assert with_prediction.choices[0].message.content == without.choices[0].message.content
    details = with_prediction.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0 and details.rejected_prediction_tokens >= 0
    parts = cli.chat.completions.create(prediction={"type": "content", "content": [{"type": "text", "text": EDIT}]}, **kw)
    assert parts.choices[0].message.content == without.choices[0].message.content


def no_call_syntax(text: str | None) -> None:
    """A cut call's text is never passed off as content (issue 37)."""
    text = text or ""
    assert "tool_call" not in text and "[TOOL_CALLS]" not in text and not text.lstrip().startswith("{"), text


@pytest.mark.parametrize("which", ["server", "hermes"])
def test_a_call_cut_by_max_tokens_is_never_content(which, request):
    srv = request.getfixturevalue(which)
    cli = client(srv)
    kw = dict(model=MODEL if which == "server" else HERMES_MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
              temperature=0)
    whole = cli.chat.completions.create(max_tokens=120, **kw)
    assert whole.choices[0].finish_reason == "tool_calls"
    n = whole.usage.completion_tokens
    complete_before_cut = 0
    for cut in (4, 12, n - 3, n - 2, n - 1):
        reply = cli.chat.completions.create(max_tokens=cut, **kw)
        choice = reply.choices[0]
        assert choice.finish_reason == "length", reply
        no_call_syntax(choice.message.content)
        if choice.message.tool_calls:   # the calls complete before the cut, and only those
            assert [c.function.name for c in choice.message.tool_calls] == \
                   [c.function.name for c in whole.choices[0].message.tool_calls][:len(choice.message.tool_calls)]
            checked_calls(choice.message)
            complete_before_cut += 1
        content, calls, finish = streamed(cli, max_tokens=cut, **kw)
        no_call_syntax(content)
        assert finish == "length" and len(calls) == len(choice.message.tool_calls or ())
    if which == "server":   # the generic format closes its call object before '] }': a cut there keeps it
        assert complete_before_cut >= 1


def test_the_issues_cut_conversation(server):
    """The request of issue 37: a tool result in the history, tool_choice auto, max_tokens 40."""
    cli = client(server)
    first = cli.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0,
                                        max_tokens=80)
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": "18 C, sunny"} for c in first.choices[0].message.tool_calls]
    for max_tokens in (10, 25, 40):
        reply = cli.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, tool_choice="auto",
                                            temperature=0, max_tokens=max_tokens)
        no_call_syntax(reply.choices[0].message.content)
        if reply.choices[0].message.tool_calls:
            checked_calls(reply.choices[0].message)


def test_every_tool_call_needs_its_tool_message(server):
    two_calls = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": '{"timezone": "CET"}'}}]}
    answer_a = {"role": "tool", "tool_call_id": "call_a", "content": "18 C"}
    answer_b = {"role": "tool", "tool_call_id": "call_b", "content": "14:00"}
    good = {"model": MODEL, "tools": TOOLS, "max_tokens": 2}
    cases = [(ASK + [two_calls, answer_a], "messages[1].tool_calls", "call_b"),
             (ASK + [two_calls, answer_a, {"role": "user", "content": "And?"}], "messages[1].tool_calls", "call_b"),
             (ASK + [two_calls], "messages[1].tool_calls", "call_a"),
             (ASK + [answer_a], "messages[1].tool_call_id", "tool"),
             (ASK + [two_calls, answer_a, answer_b, answer_b], "messages[4].tool_call_id", "tool")]
    for messages, param, named in cases:
        r = server.http.post("/v1/chat/completions", json={**good, "messages": messages})
        assert r.status_code == 400 and error_of(r)["param"] == param and named in error_of(r)["message"], r.text
    r = server.http.post("/v1/chat/completions", json={**good, "messages": ASK + [two_calls, answer_b, answer_a]})
    assert r.status_code == 200, r.text


def test_responses_calls_in_a_native_format(hermes):
    """The Responses API on a template with its own tool format (Hermes' <tool_call>)."""
    cli = client(hermes)
    tools = [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in TOOLS]
    kw = dict(model=HERMES_MODEL, input=ASK[0]["content"], tools=tools, tool_choice="required", temperature=0,
              max_output_tokens=80, parallel_tool_calls=False)
    whole = cli.responses.create(**kw)
    calls = [(i.name, json.loads(i.arguments)) for i in whole.output if i.type == "function_call"]
    assert whole.status == "completed" and len(calls) == 1 and "tool_call" not in whole.output_text
    VALIDATORS[calls[0][0]].model_validate(calls[0][1])
    with cli.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert [(i.name, json.loads(i.arguments)) for i in final.output if i.type == "function_call"] == calls
    cut = cli.responses.create(**{**kw, "max_output_tokens": 5})
    assert cut.status == "incomplete" and "tool_call" not in cut.output_text
