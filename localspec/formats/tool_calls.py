"""Tool calling: how a model is told about tools, how its calls are constrained, and how they are read
back out of its text, per format.

- ``hermes``: Hermes 2/3, Qwen 2.5/3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- ``llama3``: Llama 3.x JSON ``{"name": ..., "parameters": {...}}`` (after ``<|python_tag|>`` or not);
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``;
- ``generic``: for a template without tool support (as llama-server does): a system message
  describes the tools and the answer is one JSON object, ``{"tool_call": {"name", "arguments"}}``
  (``{"tool_calls": [...]}`` for parallel calls) or ``{"response": "..."}``.

A native format renders through the chat template's own ``tools`` variable (Hugging Face's
convention). ``required`` and a named function constrain the whole answer to a call with a grammar
built from the parameters' JSON schema; under ``auto`` a native format's grammar is lazy (it applies
from the format's opening trigger on, so a started call stays valid), the generic one applies from
the start (its answer is always JSON).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..core.errors import LocalspecError
from .chat_format import Message, ToolCall
from .json_grammar import any_of, wrapped_grammar


@dataclass(frozen=True)
class Tool:
    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolRequest:
    """What a request asks: its tools, ``choice`` (auto / required / a tool's name; "none" is no
    request at all) and whether several calls may come in one answer."""

    tools: tuple[Tool, ...]
    choice: str = "auto"
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.choice != "auto"

    def offered(self) -> tuple[Tool, ...]:
        if self.choice in ("auto", "required"):
            return self.tools
        return tuple(t for t in self.tools if t.name == self.choice)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _call_schema(tool: Tool, arguments_key: str) -> dict:
    return {"type": "object", "properties": {"name": {"const": tool.name}, arguments_key: tool.parameters},
            "required": ["name", arguments_key], "additionalProperties": False}


def _arguments_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _calls_from(objects: Sequence[Any], arguments_key: str, short_ids: bool = False) -> list[ToolCall] | None:
    calls = []
    for obj in objects:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        call_id = uuid.uuid4().hex[:9] if short_ids else new_call_id()   # Mistral's templates want 9 characters
        calls.append(ToolCall(obj["name"], _arguments_text(obj.get(arguments_key, {})), call_id))
    return calls


def _complete_values(text: str, i: int, separators: str) -> list[Any]:
    """The JSON values that are complete in ``text`` from ``i`` on, separated by ``separators``
    (and white space), up to the first one cut short."""
    decoder, values = json.JSONDecoder(), []
    while i < len(text):
        while i < len(text) and text[i] in separators + " \t\r\n":
            i += 1
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:
            break
        values.append(value)
    return values


def _cut_calls(objects: Sequence[Any], arguments_key: str, short_ids: bool = False) -> list[ToolCall]:
    """The calls among ``objects`` that are whole calls (a name and the arguments)."""
    whole = [o for o in objects if isinstance(o, dict) and isinstance(o.get("name"), str) and arguments_key in o]
    return _calls_from(whole, arguments_key, short_ids) or []


def _partial_suffix(text: str, opening: str) -> int:
    """The length of the longest tail of ``text`` that is a beginning of ``opening`` (0: none)."""
    for k in range(min(len(opening) - 1, len(text)), 0, -1):
        if text.endswith(opening[:k]):
            return k
    return 0


def _template_arguments(arguments: str) -> Any:
    """A call's arguments for a template: the object (templates ``tojson`` it), or the text if it is not JSON."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class ToolFormat:
    """One family's way of calling tools (see the module's docstring)."""

    name = ""
    trigger = ""            # the text a call starts with (the lazy grammar's trigger)
    native = True           # tools render through the template's ``tools`` variable

    def grammar(self, request: ToolRequest) -> tuple[str, tuple[str, ...]]:
        """(GBNF, triggers): no triggers means the grammar applies from the first token."""
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) from a whole answer; text that is not a well-formed call stays content."""
        raise NotImplementedError

    def openings(self) -> tuple[str, ...]:
        """The texts a call may begin with (a stream holds back from the first on)."""
        return (self.trigger,)

    def started(self, text: str) -> int:
        """Where a call begins in ``text`` (-1: none began)."""
        found = [i for t in self.openings() if (i := text.find(t)) >= 0]
        return min(found) if found else -1

    def parse_cut(self, text: str, start: int) -> list[ToolCall]:
        """The complete calls of an answer cut inside its calls (by max_tokens or a stop string),
        whose calls begin at ``start``."""
        raise NotImplementedError

    def parse_answer(self, text: str, length: bool = False) -> tuple[str, list[ToolCall], bool]:
        """(content, calls, cut) from an answer that may have been cut: a call cut short is never
        content; the calls complete before the cut come back, and ``cut`` is True. ``length``: the
        answer ended at max_tokens, so a tail that begins an opening (``<tool_c``) began a call."""
        content, calls = self.parse(text)
        start = self.started(text)
        if calls:
            return content, calls, False
        if start < 0:
            partial = max(_partial_suffix(text, t) for t in self.openings()) if length else 0
            return (text[:len(text) - partial].strip(), [], True) if partial else (content, calls, False)
        return text[:start].strip(), self.parse_cut(text, start), True

    def history(self, messages: Sequence[Message]) -> list[dict]:
        """The conversation as template variables: assistant calls and tool results included."""
        out = []
        for m in messages:
            item: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                item["tool_calls"] = [{"id": c.id, "type": "function",
                                       "function": {"name": c.name, "arguments": _template_arguments(c.arguments)}}
                                      for c in m.tool_calls]
            if m.tool_call_id is not None:
                item["tool_call_id"] = m.tool_call_id
            if m.name is not None:
                item["name"] = m.name
            out.append(item)
        return out

    def render_variables(self, messages: Sequence[Message], request: ToolRequest | None) -> dict:
        """``messages`` (and ``tools``) for the chat template."""
        variables: dict[str, Any] = {"messages": self.history(messages)}
        if request is not None:
            variables["tools"] = [t.as_openai() for t in request.offered()]
        return variables


class HermesFormat(ToolFormat):
    name = "hermes"
    trigger = "<tool_call>"
    CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def grammar(self, request):
        schema = any_of([_call_schema(t, "arguments") for t in request.offered()])
        gbnf = wrapped_grammar(schema, prefix="<tool_call>\n", suffix="\n</tool_call>",
                               separator="\n" if request.parallel else None)
        return gbnf, (() if request.forced else (self.trigger,))

    def parse(self, text):
        start = text.find(self.trigger)
        if start < 0:
            return text, []
        objects = []
        for body in self.CALL.findall(text[start:]):
            try:
                objects.append(json.loads(body))
            except ValueError:
                return text, []
        calls = _calls_from(objects, "arguments")
        return (text[:start].strip(), calls) if calls else (text, [])

    def parse_cut(self, text, start):
        objects = []
        for body in text[start:].split(self.trigger)[1:]:
            objects += _complete_values(body, 0, "")[:1]
        return _cut_calls(objects, "arguments")


class Llama3Format(ToolFormat):
    name = "llama3"
    trigger = '{"name"'
    PYTHON_TAG = "<|python_tag|>"

    def grammar(self, request):
        schema = any_of([_call_schema(t, "parameters") for t in request.offered()])
        gbnf = wrapped_grammar(schema, prefix="", suffix="", separator="; " if request.parallel else None)
        return gbnf, (() if request.forced else (self.trigger,))

    def parse(self, text):
        body = text.replace(self.PYTHON_TAG, "")
        start = body.find("{")
        if start < 0:
            return text, []
        decoder, objects, i = json.JSONDecoder(), [], start
        while i < len(body):
            try:
                obj, i = decoder.raw_decode(body, i)
            except ValueError:
                return text, []
            objects.append(obj)
            while i < len(body) and body[i] in " \t\r\n;":
                i += 1
        if not objects or not all(isinstance(o, dict) and ("parameters" in o or "arguments" in o) for o in objects):
            return text, []
        key = "parameters" if "parameters" in objects[0] else "arguments"
        calls = _calls_from(objects, key)
        return (body[:start].strip(), calls) if calls else (text, [])

    def openings(self):
        return (self.PYTHON_TAG, self.trigger)

    def parse_cut(self, text, start):
        body = text[start:].replace(self.PYTHON_TAG, "")
        objects = _complete_values(body, 0, ";")
        key = "parameters" if any(isinstance(o, dict) and "parameters" in o for o in objects) else "arguments"
        return _cut_calls(objects, key)


class MistralFormat(ToolFormat):
    name = "mistral"
    trigger = "[TOOL_CALLS]"

    def grammar(self, request):
        calls = {"type": "array", "items": any_of([_call_schema(t, "arguments") for t in request.offered()]),
                 "minItems": 1}
        if not request.parallel:
            calls["maxItems"] = 1
        gbnf = wrapped_grammar(calls, prefix=self.trigger, suffix="", separator=None)
        return gbnf, (() if request.forced else (self.trigger,))

    def parse(self, text):
        start = text.find(self.trigger)
        if start < 0:
            return text, []
        try:
            objects, _ = json.JSONDecoder().raw_decode(text, start + len(self.trigger))
        except ValueError:
            return text, []
        calls = _calls_from(objects, "arguments", short_ids=True) if isinstance(objects, list) else None
        return (text[:start].strip(), calls) if calls else (text, [])

    def parse_cut(self, text, start):
        i = text.find("[", start + len(self.trigger))
        objects = _complete_values(text, i + 1, ",") if i >= 0 else []
        return _cut_calls(objects, "arguments", short_ids=True)


GENERIC_PROMPT = (
    "You can call the following tools. Each is given as a JSON object with its name, description and the "
    "JSON schema of its arguments:\n{tools}\n\n{answer}"
)
GENERIC_ANSWER = {
    "auto": 'Answer with one JSON object and nothing else: {call} to call a tool, or {{"response": "your answer"}} '
            "to answer the user directly.",
    "forced": "Answer with one JSON object and nothing else: {call}.",
}


def _partial_string(text: str) -> str:
    """The text of a JSON string cut short (``text`` starts at its opening quote)."""
    if not text.startswith('"'):
        return ""
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
        return value if isinstance(value, str) else ""
    except ValueError:
        pass
    for end in range(len(text), max(0, len(text) - 7), -1):   # an escape (\\uXXXX) cut in the middle
        try:
            return json.loads(text[:end] + '"')
        except ValueError:
            continue
    return ""


class GenericFormat(ToolFormat):
    name = "generic"
    native = False

    def _calls_schema(self, request: ToolRequest) -> tuple[str, dict]:
        one = any_of([_call_schema(t, "arguments") for t in request.offered()])
        if request.parallel:
            return "tool_calls", {"type": "array", "items": one, "minItems": 1}
        return "tool_call", one

    def grammar(self, request):
        key, calls = self._calls_schema(request)
        options = [{"type": "object", "properties": {key: calls}, "required": [key], "additionalProperties": False}]
        if not request.forced:
            options.append({"type": "object", "properties": {"response": {"type": "string"}},
                            "required": ["response"], "additionalProperties": False})
        return wrapped_grammar(any_of(options), prefix="", suffix="", separator=None), ()

    def parse(self, text):
        try:
            obj = json.loads(text)
        except ValueError:
            return text, []
        if not isinstance(obj, dict):
            return text, []
        if isinstance(obj.get("response"), str):
            return obj["response"], []
        objects = obj.get("tool_calls") if "tool_calls" in obj else [obj.get("tool_call")]
        calls = _calls_from(objects, "arguments") if isinstance(objects, list) else None
        return ("", calls) if calls else (text, [])

    OPENING = re.compile(r'\s*\{\s*"(tool_calls|tool_call|response)"\s*:\s*')

    def started(self, text):
        return 0 if self.OPENING.match(text) else -1

    def parse_answer(self, text, length=False):
        content, calls = self.parse(text)
        opening = self.OPENING.match(text)
        if calls or content != text:   # parsed: a call or a response
            return content, calls, False
        if opening is None:   # cut before its first key, or not JSON at all
            return ("", [], True) if length and text.lstrip().startswith("{") else (content, calls, False)
        key, i = opening.group(1), opening.end()
        if key == "response":   # a direct answer cut short: its text so far
            return _partial_string(text[i:]), [], True
        if key == "tool_calls":
            i = text.find("[", i) + 1 if text.find("[", i) >= 0 else len(text)
            return "", _cut_calls(_complete_values(text, i, ","), "arguments"), True
        return "", _cut_calls(_complete_values(text, i, "")[:1], "arguments"), True

    def history(self, messages):
        out = []
        for m in messages:
            if m.tool_calls:
                calls = [{"name": c.name, "arguments": _template_arguments(c.arguments)} for c in m.tool_calls]
                body = {"tool_calls": calls} if len(calls) > 1 else {"tool_call": calls[0]}
                out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
            elif m.role == "tool":
                result = {"tool_response": {"tool_call_id": m.tool_call_id, "content": m.content}}
                out.append({"role": "user", "content": json.dumps(result, ensure_ascii=False)})
            else:
                out.append({"role": m.role, "content": m.content})
        return out

    def render_variables(self, messages, request):
        history = self.history(messages)
        if request is not None:
            tools = "\n".join(json.dumps(t.as_openai()["function"], ensure_ascii=False) for t in request.offered())
            key = "tool_calls" if request.parallel else "tool_call"
            call = ('{"tool_calls": [{"name": "tool name", "arguments": {...}}, ...]}' if key == "tool_calls"
                    else '{"tool_call": {"name": "tool name", "arguments": {...}}}')
            answer = GENERIC_ANSWER["forced" if request.forced else "auto"].format(call=call)
            text = GENERIC_PROMPT.format(tools=tools, answer=answer)
            if history and history[0]["role"] == "system":
                history[0] = {"role": "system", "content": f"{history[0]['content']}\n\n{text}"}
            else:
                history.insert(0, {"role": "system", "content": text})
        return {"messages": history}


FORMATS = {f.name: f for f in (HermesFormat(), Llama3Format(), MistralFormat(), GenericFormat())}


def detect_format(template: str) -> ToolFormat:
    """The format a chat template's source speaks; generic when it does not use ``tools``."""
    if not re.search(r"\btools\b", template):
        return FORMATS["generic"]
    if "<tool_call>" in template:
        return FORMATS["hermes"]
    if "[TOOL_CALLS]" in template:
        return FORMATS["mistral"]
    if "<|python_tag|>" in template or "ipython" in template:
        return FORMATS["llama3"]
    return FORMATS["generic"]


def check_tools(tools: Sequence[Tool], choice: str) -> None:
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise LocalspecError("tool names must be unique")
    if choice not in ("auto", "required", "none") and choice not in names:
        raise LocalspecError(f"tool_choice names '{choice}', which is not among the tools")


class CallStream:
    """Streams an answer's content while holding back what may be a tool call: text from the format's
    trigger on (and a tail that could be the trigger's beginning); the generic format's whole answer
    (it is JSON). :meth:`finish` parses the whole answer."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.format = fmt
        self.text = ""          # the whole answer so far
        self.sent = 0           # characters of it already streamed as content
        self.in_call = False
        self.cut = False        # (after finish) the answer was cut inside its calls

    def feed(self, text: str) -> str:
        """The content that can stream now."""
        self.text += text
        if not self.format.native or self.in_call:
            return ""
        openings = self.format.openings()
        starts = [i for t in openings if (i := self.text.find(t, max(0, self.sent - len(t)))) >= 0]
        if starts:
            self.in_call = True
            end = min(starts)
        else:   # hold back a tail that may be an opening's beginning
            end = len(self.text) - max(_partial_suffix(self.text, t) for t in openings)
        out = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def finish(self, length: bool = False) -> tuple[str, list[ToolCall]]:
        """(content still to send, the calls); a call cut short is neither (:attr:`cut` says so).
        ``length``: the answer ended at max_tokens (see :meth:`ToolFormat.parse_answer`)."""
        content, calls, self.cut = self.format.parse_answer(self.text, length)
        if not self.format.native:
            return content, calls
        # the content before a call has been sent: what is held back is the call (or its opening, cut)
        return ("" if calls or self.cut else self.text[self.sent:]), calls
