"""Tool-call formats (formats/tool_calls.py) and JSON grammars (formats/json_grammar.py): rendering
through templates of each family's shape, parsing the model's calls, grammars that llama.cpp's own
parser reads, and the held-back stream. Real templates (read from the pinned sdist, fetched once:
``sdist_templates``) and small templates of the same shape, written here."""

from __future__ import annotations

import json

import pytest

from localspec.core.errors import LocalspecError
from localspec.formats.chat_format import ChatFormatter, Message, ToolCall
from localspec.formats.json_grammar import any_json_grammar, schema_grammar
from localspec.formats.tool_calls import FORMATS, CallStream, Tool, ToolRequest, detect_format
from sdist_templates import templates_dir
from tool_templates import HERMES_TEMPLATE, LLAMA3_TEMPLATE, MISTRAL_TEMPLATE


WEATHER = Tool("get_weather", "Current weather in a city",
               {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"]})
TIME = Tool("get_time", "The time in a timezone", {"type": "object", "properties": {"tz": {"type": "string"}},
                                                    "required": ["tz"]})

# a Hermes/Qwen-shaped template: tools in the system turn, <tool_call> in assistant turns, tool results
HISTORY = [Message("user", "Weather in Paris?"),
           Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city": "Paris"}', "abc123def"),)),
           Message("tool", "18 C, sunny", tool_call_id="abc123def", name="get_weather")]


def test_a_template_is_recognised_by_its_format():
    assert detect_format(HERMES_TEMPLATE).name == "hermes"
    assert detect_format(LLAMA3_TEMPLATE).name == "llama3"
    assert detect_format(MISTRAL_TEMPLATE).name == "mistral"
    assert detect_format("{% for message in messages %}{{ message.content }}{% endfor %}").name == "generic"


@pytest.mark.parametrize("template, expected", [
    (HERMES_TEMPLATE, ['<tools>', '"name": "get_weather"', '<tool_call>\n{"name": "get_weather", "arguments": '
                       '{"city": "Paris"}}\n</tool_call>', "<tool_response>\n18 C, sunny\n</tool_response>"]),
    (LLAMA3_TEMPLATE, ['Tools: {', '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                       "ipython<|end_header_id|>\n\n18 C, sunny"]),
    (MISTRAL_TEMPLATE, ["[AVAILABLE_TOOLS]", "[TOOL_CALLS]", '"arguments": {"city": "Paris"}',
                        "[TOOL_RESULTS]18 C, sunny[/TOOL_RESULTS]"]),
])
def test_native_formats_render_tools_and_history_through_the_template(template, expected):
    fmt = detect_format(template)
    text = ChatFormatter(template).render_variables(fmt.render_variables(HISTORY, ToolRequest((WEATHER,))))
    for piece in expected:
        assert piece in text, (piece, text)


def test_generic_format_describes_the_tools_in_a_system_message():
    fmt = FORMATS["generic"]
    variables = fmt.render_variables([Message("system", "Be brief.")] + HISTORY, ToolRequest((WEATHER,), "auto", False))
    messages = variables["messages"]
    assert "tools" not in variables and messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("Be brief.") and '"name": "get_weather"' in messages[0]["content"]
    assert '{"response": "your answer"}' in messages[0]["content"]
    assert json.loads(messages[2]["content"]) == {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert messages[3]["role"] == "user"
    assert json.loads(messages[3]["content"])["tool_response"]["content"] == "18 C, sunny"
    text = ChatFormatter(None).render_variables(variables)   # ChatML fallback: renders
    assert "<|im_start|>system\nBe brief." in text
    forced = fmt.render_variables(HISTORY, ToolRequest((WEATHER,), "required", True))["messages"][0]["content"]
    assert '"response"' not in forced and '"tool_calls"' in forced


@pytest.mark.parametrize("name", ["NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "Qwen-Qwen2.5-7B-Instruct",
                                  "Qwen-Qwen3-0.6B", "meta-llama-Llama-3.1-8B-Instruct",
                                  "meta-llama-Llama-3.3-70B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407"])
def test_real_templates_from_the_sdist(name):
    source = (templates_dir() / f"{name}.jinja").read_text()
    fmt = detect_format(source)
    assert fmt.name == {"N": "hermes", "Q": "hermes", "m": "llama3"}[name[0]] if "Mistral" not in name \
        else fmt.name == "mistral"
    text = ChatFormatter(source, bos_token="<s>", eos_token="</s>").render_variables(
        fmt.render_variables(HISTORY, ToolRequest((WEATHER, TIME))))
    assert "get_time" in text and "18 C, sunny" in text and "Paris" in text


@pytest.mark.parametrize("fmt, text, content, calls", [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>',
     "Let me check.", [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "CET"})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}', "",
     [("get_weather", {"city": "Oslo"})]),    # ended (EOS) before the closing tag
    ("hermes", "It is sunny.", "It is sunny.", []),
    ("hermes", "<tool_call>\n{broken</tool_call>", "<tool_call>\n{broken</tool_call>", []),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', "",
     [("get_weather", {"city": "Paris"})]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "A"}}; {"name": "get_time", "parameters": {"tz": "B"}}',
     "", [("get_weather", {"city": "A"}), ("get_time", {"tz": "B"})]),
    ("llama3", "Paris is {sunny}.", "Paris is {sunny}.", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', "",
     [("get_weather", {"city": "Paris"})]),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "",
     [("get_weather", {"city": "Paris"})]),
    ("generic", '{"tool_calls": [{"name": "get_time", "arguments": {"tz": "UTC"}}]}', "", [("get_time", {"tz": "UTC"})]),
    ("generic", '{"response": "Hello!"}', "Hello!", []),
    ("generic", "not json", "not json", []),
])
def test_calls_are_parsed_out_of_the_answer(fmt, text, content, calls):
    got_content, got = FORMATS[fmt].parse(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert len({c.id for c in got}) == len(got) and all(c.id for c in got)


def test_mistral_call_ids_are_nine_characters():
    _, calls = FORMATS["mistral"].parse('[TOOL_CALLS][{"name": "f", "arguments": {}}]')
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral", "generic"])
@pytest.mark.parametrize("choice, parallel", [("auto", True), ("required", False), ("get_time", True)])
def test_grammars_constrain_to_the_offered_tools(name, choice, parallel):
    request = ToolRequest((WEATHER, TIME), choice, parallel)
    gbnf, triggers = FORMATS[name].grammar(request)
    assert gbnf.count("root ::=") == 1
    lazy = name != "generic" and choice == "auto"
    assert triggers == ((FORMATS[name].trigger,) if lazy else ())
    assert ('"\\"get_time\\""' in gbnf) and (('"\\"get_weather\\""' in gbnf) == (choice != "get_time"))
    several = {"hermes": 'root ::= one ("\\n" one)*', "llama3": 'root ::= one ("; " one)*',
               "mistral": '("," space value-item)*', "generic": '"\\"tool_calls\\""'}[name]
    assert (several in gbnf) == parallel, gbnf


def test_json_grammars():
    assert "root   ::= object" in any_json_grammar()
    gbnf = schema_grammar({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    assert "root ::= \"{\" space n-kv \"}\" space" in gbnf and "n-kv ::= \"\\\"n\\\"\" space" in gbnf
    with pytest.raises(LocalspecError, match="cannot be turned into a grammar"):
        schema_grammar({"type": "object", "properties": {"a": {"$ref": "https://example.com/x"}}})
    with pytest.raises(LocalspecError, match="cannot be turned into a grammar"):
        schema_grammar({"type": "nonsense"})
    with pytest.raises(LocalspecError, match="is an object"):
        schema_grammar(["not", "a", "schema"])


def test_a_stream_holds_back_a_call_and_sends_the_content_before_it():
    stream = CallStream(FORMATS["hermes"])
    sent = [stream.feed(t) for t in ["Sure, ", "<tool", '_call>\n{"name": "get_time", ', '"arguments": {"tz": "UTC"}}',
                                     "\n</tool_call>"]]
    assert sent == ["Sure, ", "", "", "", ""]
    rest, calls = stream.finish()
    assert rest == "" and [(c.name, c.arguments) for c in calls] == [("get_time", '{"tz": "UTC"}')]
    stream = CallStream(FORMATS["hermes"])
    assert [stream.feed(t) for t in ["a <to", "o b", " c<"]] == ["a ", "<too b", " c"]
    assert stream.finish() == ("<", [])   # a held-back tail that was not a call goes out at the end
    stream = CallStream(FORMATS["generic"])
    assert stream.feed('{"response": "Hi"}') == "" and stream.finish() == ("Hi", [])


@pytest.mark.parametrize("fmt, text, content, calls", [
    # the answer: two parallel calls, cut by max_tokens inside the second
    ("generic", '{ "tool_calls": [{"name": "get_weather", "arguments": { "city": "Paris" } }, {"name": "get_ti',
     "", [("get_weather", {"city": "Paris"})]),
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa', "", []),
    ("generic", '{"tool_call": {"name": "get_time", "arguments": {"tz": "UTC"}}', "", [("get_time", {"tz": "UTC"})]),
    ("generic", '{"tool_call": {"name": "get_time", "argum', "", []),
    ("generic", '{"response": "It is sunny in Par', "It is sunny in Par", []),
    ("generic", '{"response": "caf\\u00', "caf", []),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "argu', "Let me look.", [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>\n{"name": "get_wea', "", []),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "A"}}; {"name": "get_time"',
     "", [("get_weather", {"city": "A"})]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_t',
     "", [("get_weather", {"city": "Paris"})]),
])
def test_a_cut_answer_keeps_its_whole_calls_and_never_their_syntax(fmt, text, content, calls):
    got_content, got, cut = FORMATS[fmt].parse_answer(text)
    assert cut and got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    stream = CallStream(FORMATS[fmt])
    sent = "".join(stream.feed(text[i:i + 7]) for i in range(0, len(text), 7))
    rest, streamed = stream.finish()
    assert stream.cut and (sent + rest).strip() == content
    assert [c.name for c in streamed] == [name for name, _ in calls]


@pytest.mark.parametrize("fmt, text, content", [("hermes", "Let me see. <tool_c", "Let me see."), ("hermes", "<tool_call", ""),
                                               ("generic", '{"', ""), ("llama3", "<|python", ""),
                                               ("mistral", "[TOOL", "")])
def test_an_answer_cut_inside_a_calls_opening_drops_it(fmt, text, content):
    assert FORMATS[fmt].parse_answer(text, length=True) == (content, [], True)
    stream = CallStream(FORMATS[fmt])
    sent = stream.feed(text)
    assert (sent + stream.finish(length=True)[0]).strip() == content and stream.cut
    assert FORMATS[fmt].parse_answer(text)[2] is False     # a whole answer's text stays as it is


def test_a_whole_answer_is_not_cut():
    for fmt, text in (("generic", '{"response": "Hi"}'), ("hermes", "Plain text."),
                      ("hermes", '<tool_call>{"name": "f", "arguments": {}}</tool_call>')):
        assert FORMATS[fmt].parse_answer(text)[2] is False
