"""OpenAI's Responses API, ``POST /v1/responses`` (openai-agents' default API), on the chat
completions' path: the request becomes a chat request (``input`` items to messages, ``tools``,
``text.format`` to ``response_format``), runs as a :class:`~.worker.Job` on the same worker, and
its answer comes back as Responses output items (``message``, ``function_call``), whole or as
Responses' typed server-sent events (``response.created`` ... ``response.completed``).

Nothing is stored: ``previous_response_id`` is refused (send the whole conversation in
``input``, as ``store: false`` clients do). ``usage`` carries the same ``speculative`` object as
chat completions, the response llama-server's ``timings``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from ...core.events import DoneEvent
from ...formats.chat_format import ToolCall
from ...formats.tool_calls import CallStream
from ..answering import event_stream, gathered, pending, run, sse
from ..bodies import validated
from ..errors import APIError, bad_request
from ..features import ChatTools, answer_calls
from ..models_manager import Loaded
from ..params import chat_request
from ..schemas import (INPUT_ITEMS, ChatCompletionRequest, ContentPart, ResponseFunctionCall, ResponseInputMessage,
                       ResponsesRequest)
from ..state import ServerState
from ..stats import finish_reason, timings
from ..worker import Failed, Finished, Job
from .chat import usage
from .errors import read, refused

# a chat request's field -> the Responses field an error names
PARAMS = {"messages": "input", "response_format": "text.format", "max_completion_tokens": "max_output_tokens"}
TEXT_PARTS = ("input_text", "output_text", "text")


def _param(param: Optional[str]) -> Optional[str]:
    for chat, field in PARAMS.items():
        if param is not None and (param == chat or param.startswith((chat + ".", chat + "["))):
            return field
    return param


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


# -- the request, as a chat request ------------------------------------------------------------------
def _item(i: int, raw: Any):
    """``input[i]`` as its item model (by ``type``; a message may leave ``type`` out)."""
    kind = raw.get("type", "message") if isinstance(raw, dict) else None
    model = INPUT_ITEMS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise bad_request(f"Input items of type '{kind}' are not supported here (message, function_call, "
                          "function_call_output).", param=f"input.{i}.type" if isinstance(raw, dict) else f"input.{i}")
    return validated(model, raw, refused, rename=lambda loc: f"input.{i}" + (f".{loc}" if loc else ""))


def _text(content: str | list[ContentPart], param: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.type in TEXT_PARTS and part.text is not None:
            parts.append(part.text)
        elif part.type == "refusal" and isinstance((part.model_extra or {}).get("refusal"), str):
            parts.append(part.model_extra["refusal"])
        else:
            raise bad_request(f"content parts of type '{part.type}' are not supported (text only).", param=param)
    return "".join(parts)


def chat_messages(req: ResponsesRequest) -> list[dict]:
    """``instructions`` and ``input`` as chat messages: consecutive ``function_call`` items join one
    assistant message's ``tool_calls``, a ``function_call_output`` is a ``tool`` message."""
    out: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    for i, raw in enumerate(req.input):
        item = _item(i, raw)
        if isinstance(item, ResponseInputMessage):
            out.append({"role": item.role, "content": _text(item.content, f"input.{i}.content")})
        elif isinstance(item, ResponseFunctionCall):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"input.{i}.output")})
    return out


def _refuse(req: ResponsesRequest) -> None:
    if req.previous_response_id is not None:
        raise bad_request("previous_response_id is not supported: this server stores no responses; send the "
                          "conversation in input.", param="previous_response_id")
    if req.reasoning and any(v is not None for v in req.reasoning.values()):
        raise bad_request("reasoning is not supported by this server.", param="reasoning")
    if req.background:
        raise bad_request("background responses are not supported by this server.", param="background")
    if req.include:
        raise bad_request("include is not supported by this server.", param="include")


def _response_format(req: ResponsesRequest) -> Optional[dict]:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return None if fmt is None else {"type": fmt.type}
    if fmt.schema_ is None:
        raise bad_request("text.format of type json_schema needs a schema.", param="text.format.schema")
    spec = {"name": fmt.name or "response", "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
    return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v is not None}}


def chat_body(req: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that ``req`` asks for (errors name the Responses fields)."""
    _refuse(req)
    choice = req.tool_choice
    fields = dict(
        model=req.model, messages=chat_messages(req), response_format=_response_format(req),
        tools=[{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
               for t in req.tools or ()] or None,
        tool_choice={"type": "function", "function": {"name": choice.name}} if choice is not None and
        not isinstance(choice, str) else choice,
        parallel_tool_calls=req.parallel_tool_calls, max_completion_tokens=req.max_output_tokens,
        **{name: getattr(req, name) for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                                                 "frequency_penalty", "repeat_penalty", "repeat_last_n", "seed",
                                                 "rows_match")})
    return validated(ChatCompletionRequest, {k: v for k, v in fields.items() if v is not None}, refused, rename=_param)


# -- the answer ----------------------------------------------------------------------------------------
def response_usage(done: DoneEvent, drafts: int) -> dict:
    """The Responses API's usage, with the chat completions' ``speculative`` object."""
    u = usage(done, drafts)
    return {"input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"],
                                     "cache_write_tokens": 0},
            "output_tokens": u["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"], "speculative": u["speculative"]}


class ResponseReply:
    """One request's answer as a Responses ``response`` object and its output items."""

    def __init__(self, state: ServerState, req: ResponsesRequest, tools: Optional[ChatTools], served_name: str) -> None:
        self.id = _new_id("resp_")
        self.message_id = _new_id("msg_")
        self.created = int(time.time())
        self.tools = tools
        self.calls = CallStream(tools.format) if tools is not None else None
        text = req.text.model_dump(by_alias=True, exclude_none=True) if req.text is not None else {}
        self.settings = {   # the request's settings, echoed as OpenAI does
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "model": req.model or served_name, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "temperature": req.temperature, "top_p": req.top_p,
            "tool_choice": req.tool_choice.model_dump() if req.tool_choice is not None and
            not isinstance(req.tool_choice, str) else (req.tool_choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
            "text": {"format": {"type": "text"}, **text}, "truncation": "disabled",
            "metadata": req.metadata or {}, "store": bool(req.store), "user": req.user,
            "previous_response_id": None, "reasoning": None, "background": False}

    def finish_of(self, done: DoneEvent) -> str:
        """The finish reason ``/metrics`` counts (as chat completions': ``tool_calls`` for whole calls)."""
        if self.tools is None or done.finish_reason == "cancelled":
            return done.finish_reason
        return answer_calls(self.tools, done.text, done.finish_reason)[2]

    def response(self, status: str, output: list[dict], end: Optional[Finished] = None) -> dict:
        body = {"id": self.id, "object": "response", "created_at": self.created, "status": status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                "output": output, **self.settings, "usage": None}
        if end is not None:
            body.update(usage=response_usage(end.done, end.drafts), timings=timings(end.done),
                        completed_at=int(time.time()) if status == "completed" else None)
        return body

    def message(self, text: str, status: str) -> dict:
        content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "in_progress" \
            or text else []
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    @staticmethod
    def call(call: ToolCall, status: str = "completed") -> dict:
        return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
                "name": call.name, "arguments": call.arguments if status == "completed" else "", "status": status}

    @staticmethod
    def status(done: DoneEvent) -> str:
        """``incomplete`` for an answer cut by max_output_tokens or the context's end."""
        return "incomplete" if finish_reason(done) == "length" else "completed"

    def whole(self, text: str, end: Finished) -> dict:
        content, calls = text, []
        if self.tools is not None:   # a call cut short (max_output_tokens) is never text
            content, calls, _ = answer_calls(self.tools, text, end.done.finish_reason)
        status = self.status(end.done)
        output = ([self.message(content, status)] if content or not calls else []) + [self.call(c) for c in calls]
        return self.response(status, output, end)


# -- streaming: Responses' typed events ----------------------------------------------------------------------
class Events:
    """Server-sent events of the Responses API: ``event: TYPE`` and the data, numbered."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, kind: str, **fields) -> bytes:
        data = {"type": kind, "sequence_number": self.n, **fields}
        self.n += 1
        return sse(data, kind)


class _Message:
    """The streamed message item: opened at its first text, closed at the end."""

    def __init__(self, reply: ResponseReply, events: Events) -> None:
        self.reply, self.events = reply, events
        self.text = ""
        self.open = False
        self.where = {"item_id": reply.message_id, "output_index": 0}

    def add(self, text: str) -> list[bytes]:
        out = []
        if not self.open:
            self.open = True
            out.append(self.events("response.output_item.added", output_index=0,
                                   item=self.reply.message("", "in_progress")))
            out.append(self.events("response.content_part.added", **self.where, content_index=0,
                                   part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        self.text += text
        return out + [self.events("response.output_text.delta", **self.where, content_index=0, delta=text, logprobs=[])]

    def close(self, status: str) -> list[bytes]:
        item = self.reply.message(self.text, status)
        return [self.events("response.output_text.done", **self.where, content_index=0, text=self.text, logprobs=[]),
                self.events("response.content_part.done", **self.where, content_index=0, part=item["content"][0]),
                self.events("response.output_item.done", output_index=0, item=item)]


def _call_events(events: Events, reply: ResponseReply, call: ToolCall, index: int) -> list[bytes]:
    item = reply.call(call)
    where = {"item_id": item["id"], "output_index": index}
    return [events("response.output_item.added", output_index=index, item=reply.call(call, "in_progress")),
            events("response.function_call_arguments.delta", **where, delta=call.arguments),
            events("response.function_call_arguments.done", **where, name=call.name, arguments=call.arguments),
            events("response.output_item.done", output_index=index, item=item)]


def _ending(events: Events, reply: ResponseReply, message: _Message, end: Finished) -> list[bytes]:
    """The events after the last token: what the held-back text was (calls, or text), the items
    closed, and ``response.completed`` (or ``response.incomplete``) with the usage."""
    out, calls = [], []
    if reply.calls is not None:
        # a call cut short is neither text nor a call
        rest, calls = reply.calls.finish(length=reply.status(end.done) == "incomplete")
        if rest:
            out += message.add(rest)
    status = reply.status(end.done)
    output = []
    if message.open:
        out += message.close(status)
        output.append(reply.message(message.text, status))
    for call in calls:
        out += _call_events(events, reply, call, len(output))
        output.append(reply.call(call))
    if not output:   # nothing at all was generated: an empty message, as a whole answer has
        out += message.add("") + message.close(status)
        output.append(reply.message("", status))
    final = reply.response(status, output, end)
    return out + [events("response.completed" if status == "completed" else "response.incomplete", response=final)]


async def stream(job: Job, reply: ResponseReply) -> AsyncIterator[bytes]:
    events = Events()
    message = _Message(reply, events)
    try:
        yield events("response.created", response=reply.response("in_progress", []))
        yield events("response.in_progress", response=reply.response("in_progress", []))
        while True:
            items, text = await pending(job)
            if reply.calls is not None:
                text = reply.calls.feed(text)
            for chunk in message.add(text) if text else ():
                yield chunk
            end = items[-1]
            if isinstance(end, Finished):
                for chunk in _ending(events, reply, message, end):
                    yield chunk
                return
            if isinstance(end, Failed):
                error = end.error
                yield events("error", code=error.code, message=error.message, param=error.param, **error.body())
                return
    finally:
        job.cancel.set()


async def respond(served: Loaded, request: Request, job: Job, reply: ResponseReply, streaming: bool) -> Response:
    async def whole() -> Response:
        text, _entries, end = await gathered(job)
        if isinstance(end, Failed):
            return end.error.response()
        return JSONResponse(reply.whole(text, end))

    return await run(served, request, job, streaming=streaming, whole=whole,
                     streamed=lambda: event_stream(stream(job, reply)))


def add_routes(app: FastAPI, state: ServerState) -> None:
    """``POST /v1/responses`` on ``app``."""

    @app.post("/v1/responses")
    async def responses(request: Request):
        body = await read(state, request, ResponsesRequest)
        served = await state.models.acquire(body.model)
        try:
            chat = chat_body(body)
            prompt, config, tools = chat_request(chat, served.spec, served.defaults, served.engine.formatter)
        except APIError as exc:
            exc.param = _param(exc.param)
            raise
        offered = tools if tools is not None and tools.request is not None else None
        reply = ResponseReply(state, body, offered, served.name)
        job = Job(prompt, config, param="input", id=reply.id,
                  grammar_param="tools" if offered is not None else "text.format")
        job.finish_of = reply.finish_of
        return await respond(served, request, job, reply, body.stream)
