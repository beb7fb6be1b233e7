"""OpenAI's ``/v1/chat/completions`` and ``/v1/completions``: a request to a prompt and a
:class:`GenerationConfig` (:mod:`..params`), run on its model's worker, answered whole or as
server-sent events ending in ``data: [DONE]``, with OpenAI's ``usage`` (plus localspec's
``speculative`` block) and llama-server's ``timings``."""

from __future__ import annotations

import time
import uuid
from typing import AsyncIterator, Optional

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from ...core.events import DoneEvent
from ...formats.chat_format import ToolCall
from ...formats.tool_calls import CallStream
from ..answering import event_stream, gathered, pending, run, sse
from ..features import ChatTools, answer_calls, chat_logprobs_content, completion_logprobs_content, prediction_usage
from ..models_manager import Loaded
from ..params import chat_request, completion_request
from ..schemas import ChatCompletionRequest, CompletionRequest
from ..state import ServerState
from ..stats import finish_reason, speculative, timings
from ..worker import Failed, Finished, Job, Text
from .errors import read


def usage(done: DoneEvent, drafts: int, predicted: bool = False) -> dict:
    """OpenAI's usage, plus what the speculation did for this request (``predicted``: the request
    brought a prediction, whose counts come in ``completion_tokens_details``)."""
    s = done.stats
    return {
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.generated_tokens,
        "total_tokens": s.prompt_tokens + s.generated_tokens,
        # the prompt's tokens whose KV the slot still held from an earlier request (not evaluated again)
        "prompt_tokens_details": {"cached_tokens": s.prompt_cached},
        **({"completion_tokens_details": prediction_usage(s)} if predicted else {}),
        "speculative": speculative(done, drafts),
    }


def tool_call_items(calls: list[ToolCall], *, streamed: bool) -> list[dict]:
    """OpenAI's ``tool_calls`` (a streamed one carries its ``index``)."""
    items = []
    for i, call in enumerate(calls):
        item = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        items.append({"index": i, **item} if streamed else item)
    return items


class Reply:
    """One request's answer in the shape of its endpoint (chat or text completion); ``tools``: the
    chat's tool calling, whose calls are parsed out of the text."""

    def __init__(self, state: ServerState, chat: bool, model: Optional[str], tools: Optional[ChatTools] = None, *,
                 with_logprobs: bool = False, predicted: bool = False) -> None:
        self.chat = chat
        self.tools = tools
        self.with_logprobs = with_logprobs
        self.predicted = predicted
        self.calls = CallStream(tools.format) if tools is not None else None
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model = model or state.names[0]
        self.fingerprint = state.fingerprint
        self.offset = 0   # a text completion's characters whose logprobs went out (text_offset goes on from here)

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    def logprobs(self, entries: list) -> Optional[dict]:
        if not self.with_logprobs:
            return None
        if self.chat:
            return chat_logprobs_content(entries)
        content = completion_logprobs_content(entries, self.offset)   # a stream's chunks go on counting
        self.offset += sum(len(e.text) for e in entries)
        return content

    def finish_of(self, done: DoneEvent) -> str:
        """The finish reason ``/metrics`` counts: ``tool_calls`` when the answer is whole calls."""
        if self.tools is None or done.finish_reason == "cancelled":
            return done.finish_reason
        return answer_calls(self.tools, done.text, done.finish_reason)[2]

    def whole(self, text: str, done: DoneEvent, drafts: int, entries: list = ()) -> dict:
        finish = finish_reason(done)
        if self.chat:
            message = {"role": "assistant", "content": text}
            if self.tools is not None:   # a call cut short (max_tokens) is never content
                content, calls, finish = answer_calls(self.tools, text, finish)
                message = {"role": "assistant", "content": content}
                if calls:
                    message.update(content=content or None, tool_calls=tool_call_items(calls, streamed=False))
            choice = {"index": 0, "message": message, "logprobs": self.logprobs(entries), "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": self.logprobs(entries), "finish_reason": finish}
        return {**self.head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(done, drafts, self.predicted), "timings": timings(done)}

    def chunk(self, text: Optional[str], finish: Optional[str] = None, *, role: bool = False,
              calls: Optional[list[ToolCall]] = None, entries: list = ()) -> dict:
        logprobs = self.logprobs(entries) if entries else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            if calls:
                delta = {"tool_calls": tool_call_items(calls, streamed=True)}
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            return {**self.head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        return {**self.head("text_completion"), "choices": [choice]}

    def ending(self, end: Finished, include_usage: bool) -> list[bytes]:
        """The stream's last events: held-back text or calls, the finish, usage if asked, [DONE]."""
        out = []
        finish = finish_reason(end.done)
        if self.calls is not None:
            rest, calls = self.calls.finish(length=finish == "length")
            if rest:
                out.append(sse(self.chunk(rest)))
            if calls:
                out.append(sse(self.chunk(None, calls=calls)))
                finish = finish if self.calls.cut or finish == "length" else "tool_calls"
        final = self.chunk(None, finish)
        final["timings"] = timings(end.done)
        out.append(sse(final))
        if include_usage:   # OpenAI's rule: usage once, on a last chunk without choices
            out.append(sse({**self.head(final["object"]), "choices": [],
                            "usage": usage(end.done, end.drafts, self.predicted)}))
        return out + [b"data: [DONE]\n\n"]


async def stream(job: Job, reply: Reply, include_usage: bool, prefix: str = "") -> AsyncIterator[bytes]:
    """Server-sent events until ``data: [DONE]``; leaving early (the client disconnected) cancels.
    ``prefix``: text sent first (a completion's ``echo``)."""
    try:
        if reply.chat:
            yield sse(reply.chunk(None, role=True))
        if prefix:
            yield sse(reply.chunk(prefix))
        while True:
            items, text = await pending(job)   # what piled up meanwhile goes out as one chunk
            entries = [e for item in items if isinstance(item, Text) for e in item.logprobs]
            if reply.calls is not None:
                text = reply.calls.feed(text)   # a tool call is held back, then sent whole
            if text or entries:
                yield sse(reply.chunk(text, entries=entries))
            end = items[-1]
            if isinstance(end, Finished):
                for event in reply.ending(end, include_usage):
                    yield event
                return
            if isinstance(end, Failed):
                yield sse(end.error.body())
                yield b"data: [DONE]\n\n"
                return
    finally:
        job.cancel.set()   # a no-op once finished; otherwise the engine stops at its next cycle


async def answer(served: Loaded, request: Request, job: Job, reply: Reply, *, streaming: bool,
                 include_usage: bool, prefix: str = "") -> Response:
    async def whole() -> Response:
        text, entries, end = await gathered(job)
        if isinstance(end, Failed):
            return end.error.response()
        return JSONResponse(reply.whole(prefix + text, end.done, end.drafts, entries))

    return await run(served, request, job, streaming=streaming, whole=whole,
                     streamed=lambda: event_stream(stream(job, reply, include_usage, prefix)))


def add_routes(app: FastAPI, state: ServerState) -> None:
    """``/v1/chat/completions`` and ``/v1/completions`` on ``app``."""

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await read(state, request, ChatCompletionRequest)
        served = await state.models.acquire(body.model)
        prompt, config, tools = chat_request(body, served.spec, served.defaults, served.engine.formatter)
        include = bool(body.stream_options and body.stream_options.include_usage)
        offered = tools if tools is not None and tools.request is not None else None   # "none": no calls parsed
        reply = Reply(state, True, body.model or served.name, offered, with_logprobs=config.logprobs is not None,
                      predicted=config.prediction is not None)
        job = Job(prompt, config, param="messages", id=reply.id,
                  grammar_param="tools" if offered is not None else "response_format")
        job.finish_of = reply.finish_of
        return await answer(served, request, job, reply, streaming=body.stream, include_usage=include)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read(state, request, CompletionRequest)
        served = await state.models.acquire(body.model)
        prompt, config = completion_request(body, served.defaults)
        reply = Reply(state, False, body.model or served.name, with_logprobs=config.logprobs is not None)
        job = Job(prompt, config, param="prompt", id=reply.id)
        include = bool(body.stream_options and body.stream_options.include_usage)
        return await answer(served, request, job, reply, streaming=body.stream, include_usage=include,
                            prefix=prompt if body.echo else "")
