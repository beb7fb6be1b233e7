"""The request fields that go beyond sampling: structured output (``response_format``), tools,
logprobs and Predicted Outputs, each turned into :class:`GenerationConfig` fields, and the fields
this server refuses (400 naming them) rather than drop.

The formats themselves live in :mod:`localspec.formats.tool_calls` and
:mod:`localspec.formats.json_grammar`; this module only reads the request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Optional, Sequence

from ..core.errors import LocalspecError
from ..core.options import TOP_LOGPROBS_MAX
from ..core.events import TokenLogprob
from ..formats.chat_format import ChatFormatter, Message, ToolCall
from ..formats.json_grammar import any_json_grammar, schema_grammar
from ..formats.tool_calls import Tool, ToolFormat, ToolRequest, check_tools, detect_format
from ..runtime.config import GenerationConfig
from .errors import bad_request
from .schemas import ChatCompletionRequest, CompletionRequest, ContentPart

# what a refused field's error adds (see schemas: an undeclared field is refused)
REFUSAL_HINTS = {
    "functions": "the legacy form of tools: send tools instead; ",
    "function_call": "the legacy form of tool_choice: send tool_choice instead; ",
    "audio": "a text model; ",
    "reasoning_effort": "it would change a reasoning model's answer and ",
    "web_search_options": "no web search here; ",
}


@dataclass
class ChatTools:
    """A chat request's tool calling: the format the template speaks, and what the request asks
    (``request`` None: tools are not offered, e.g. ``tool_choice: "none"``, but the history may
    still carry calls and results)."""

    format: ToolFormat
    request: Optional[ToolRequest]

    def render(self, formatter: ChatFormatter, messages: list[Message]) -> str:
        return formatter.render_variables(self.format.render_variables(messages, self.request))


# -- refusals ----------------------------------------------------------------------------------------
def refuse_unhonoured(req: ChatCompletionRequest | CompletionRequest) -> None:
    """Fields declared in the schema that this server honours only in some values."""
    if getattr(req, "modalities", None) not in (None, ["text"]):
        raise bad_request("modalities other than [\"text\"] are not supported: this server outputs text only.",
                          param="modalities")
    if req.logit_bias:
        raise bad_request("logit_bias is not supported by this server.", param="logit_bias")
    if getattr(req, "best_of", None) not in (None, 1):
        raise bad_request("best_of must be 1: this server generates one choice per request.", param="best_of")


def message_calls(message, index: int) -> tuple[ToolCall, ...]:
    calls = []
    for j, call in enumerate(message.tool_calls or ()):
        try:
            json.loads(call.function.arguments)
        except ValueError:
            raise bad_request("A tool call's arguments must be JSON text.",
                              param=f"messages.{index}.tool_calls.{j}.function.arguments") from None
        calls.append(ToolCall(call.function.name, call.function.arguments, call.id))
    return tuple(calls)


def check_tool_answers(messages) -> None:
    """OpenAI's rule: each of an assistant message's ``tool_calls`` is answered by a ``tool`` message
    (its ``tool_call_id``) among the messages right after it, and a ``tool`` message answers such a call."""
    pending: set[str] = set()
    where = 0
    for i, message in enumerate(messages + [None]):
        if message is not None and message.role == "tool":
            if message.tool_call_id not in pending:
                raise bad_request("Invalid parameter: messages with role 'tool' must be a response to a preceding "
                                  "message with 'tool_calls' (their tool_call_id).", param=f"messages[{i}].tool_call_id")
            pending.discard(message.tool_call_id)
            continue
        if pending:
            raise bad_request("An assistant message with 'tool_calls' must be followed by tool messages responding "
                              "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                              f"{', '.join(sorted(pending))}.", param=f"messages[{where}].tool_calls")
        pending = {call.id for call in (message.tool_calls if message is not None else None) or ()}
        where = i


def content_text(content: str | list[ContentPart] | None, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise bad_request(f"content parts of type '{part.type}' are not supported (text only).", param=param)
        parts.append(part.text)
    return "".join(parts)


# -- structured output and tools -------------------------------------------------------------------
def response_grammar(req: ChatCompletionRequest) -> Optional[str]:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return any_json_grammar()
    if fmt.json_schema is None or fmt.json_schema.schema_ is None:
        raise bad_request("response_format of type json_schema needs json_schema.schema.",
                          param="response_format")
    try:
        return schema_grammar(fmt.json_schema.schema_)
    except LocalspecError as exc:
        raise bad_request(f"{exc}.", param="response_format") from None


def chat_tools(req: ChatCompletionRequest, template: str) -> Optional[ChatTools]:
    """None when neither the request nor its history involves tools (the plain chat path)."""
    history = any(m.tool_calls or m.role == "tool" for m in req.messages)
    if not req.tools:
        if req.tool_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools.", param="tool_choice")
        return ChatTools(detect_format(template), None) if history else None
    tools = tuple(Tool(t.function.name, t.function.description or "",
                       t.function.parameters or {"type": "object", "properties": {}}) for t in req.tools)
    choice = req.tool_choice or "auto"
    if not isinstance(choice, str):
        choice = choice.function.name
    try:
        check_tools(tools, choice)
    except LocalspecError as exc:
        raise bad_request(f"{exc}.", param="tool_choice" if "tool_choice" in str(exc) else "tools") from None
    request = None if choice == "none" else ToolRequest(tools, choice, req.parallel_tool_calls is not False)
    return ChatTools(detect_format(template), request)


def tool_grammar(tools: Optional[ChatTools]) -> tuple[Optional[str], tuple[str, ...]]:
    if tools is None or tools.request is None:
        return None, ()
    try:
        return tools.format.grammar(tools.request)
    except LocalspecError as exc:
        raise bad_request(f"A tool's parameters: {exc}.", param="tools") from None


def answer_calls(tools: ChatTools, text: str, finish: str) -> tuple[str, list[ToolCall], str]:
    """(content, calls, finish_reason) of an answer given tools: ``tool_calls`` when it is whole
    calls; an answer cut by max_tokens (``finish``: length) keeps its finish reason and the calls
    complete before the cut, and the cut call's text is never content."""
    length = finish in ("length", "context")
    content, calls, cut = tools.format.parse_answer(text, length=length)
    return content, calls, ("tool_calls" if calls and not cut and not length else finish)


# -- logprobs and predictions -------------------------------------------------------------------
def chat_logprobs(req: ChatCompletionRequest) -> Optional[int]:
    if req.logprobs not in (None, True, False):
        raise bad_request("logprobs is a boolean for chat completions (use top_logprobs for alternatives).",
                          param="logprobs")
    top = req.top_logprobs
    if top is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true.", param="top_logprobs")
    if top is not None and not 0 <= top <= TOP_LOGPROBS_MAX:
        raise bad_request(f"top_logprobs must be between 0 and {TOP_LOGPROBS_MAX}.", param="top_logprobs")
    return (top or 0) if req.logprobs else None


def completion_logprobs(req: CompletionRequest) -> Optional[int]:
    if req.top_logprobs is not None:
        raise bad_request("top_logprobs is a chat field; completions take logprobs (an integer).",
                          param="top_logprobs")
    value = req.logprobs
    if value is None or value is False:
        return None
    if value is True or not 0 <= value <= TOP_LOGPROBS_MAX:
        raise bad_request(f"logprobs must be an integer between 0 and {TOP_LOGPROBS_MAX}.", param="logprobs")
    if req.echo:
        raise bad_request("echo with logprobs is not supported (prompt tokens get no logprobs here).",
                          param="echo")
    return value


def prediction_text(req: ChatCompletionRequest) -> Optional[str]:
    if req.prediction is None:
        return None
    text = content_text(req.prediction.content, "prediction.content")
    return text or None


def with_features(config: GenerationConfig, **fields) -> GenerationConfig:
    """``config`` with the feature fields set (checked again by GenerationConfig itself)."""
    try:
        return replace(config, **fields)
    except LocalspecError as exc:
        raise bad_request(f"{exc}.") from None


# -- logprobs in OpenAI's shapes ---------------------------------------------------------------------
def _rounded(x: float) -> float:
    return max(float(x), -9999.0)     # -inf is not JSON; OpenAI reports -9999.0 for "impossible"


def chat_logprobs_content(entries: Sequence[TokenLogprob]) -> dict:
    """``choices[].logprobs`` of a chat completion (or chunk)."""
    return {"content": [{"token": e.text, "logprob": _rounded(e.logprob), "bytes": list(e.bytes),
                         "top_logprobs": [{"token": t.text, "logprob": _rounded(t.logprob), "bytes": list(t.bytes)}
                                          for t in e.top]} for e in entries],
            "refusal": None}


def completion_logprobs_content(entries: Sequence[TokenLogprob], offset: int = 0) -> dict:
    """``choices[].logprobs`` of a text completion (the legacy shape); ``offset``: where the text starts."""
    tokens, values, tops, offsets = [], [], [], []
    for e in entries:
        tokens.append(e.text)
        values.append(_rounded(e.logprob))
        tops.append({t.text: _rounded(t.logprob) for t in e.top})
        offsets.append(offset)
        offset += len(e.text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def prediction_usage(stats) -> dict:
    """``usage.completion_tokens_details`` of a request with a prediction (the runtime counts them
    as OpenAI defines them: the prediction's tokens that appear in the answer, and the others)."""
    return {"accepted_prediction_tokens": stats.accepted_prediction_tokens or 0,
            "rejected_prediction_tokens": stats.rejected_prediction_tokens or 0}
