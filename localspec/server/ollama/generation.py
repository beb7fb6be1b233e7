"""Ollama's API on the same server and port as ``/v1``: ``/api/chat`` and ``/api/generate`` here,
the model routes (tags, show, ps, pull, copy, delete, create) in :mod:`.models`.

Streaming is NDJSON and on by default; ``stream: false`` gives one object. The fields are
Ollama's, durations in nanoseconds; the speculative statistics come under ``speculative``. A
request is turned into the OpenAI request it means (:mod:`.params`) and runs on the same
path, on the worker of the model it names (loaded on demand, :mod:`.models_manager`). Every error
is Ollama's ``{"error": "..."}`` with the HTTP status (inside a stream: one such line).
"""

from __future__ import annotations

import json
import time
from typing import AsyncIterator

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from ...formats.tool_calls import CallStream
from ..answering import ndjson, ndjson_stream, pending, run
from ..bodies import check_key
from ..errors import APIError
from ..models_manager import Loaded
from ..params import chat_request, completion_request
from ..stats import finish_reason, speculative
from ..worker import Failed, Finished, Job, Text
from .common import keep_alive_of, now_iso, read
from .params import chat_body, generate_body, in_ollamas_words, prefill, read_options, with_policy
from .prompts import context_text, fim_text, rendered
from .schemas import ChatRequest, GenerateRequest


# -- answers -----------------------------------------------------------------------------------------
def logprobs_of(entries) -> list[dict]:
    """Ollama's ``logprobs``: per token its text, logprob and bytes, and ``top_logprobs`` when asked."""
    def one(e) -> dict:
        return {"token": e.text, "logprob": max(float(e.logprob), -9999.0), "bytes": list(e.bytes)}

    return [{**one(e), **({"top_logprobs": [one(t) for t in e.top]} if e.top else {})} for e in entries]


class Answer:
    """One ``/api/chat`` or ``/api/generate`` answer: its chunks, its last object. ``logprobs``: the
    request asked for them; ``context``: the last object carries ``context``, the prompt's tokens
    and the answer's (a templated ``/api/generate``'s, as Ollama's)."""

    def __init__(self, model: str, chat: bool, tools, *, started: float, load_seconds: float,
                 logprobs: bool = False, context: bool = False) -> None:
        self.model, self.chat = model, chat
        self.calls = CallStream(tools.format) if tools is not None and tools.request is not None else None
        self.started, self.load_seconds = started, load_seconds
        self.logprobs, self.context = logprobs, context
        self.failed: APIError | None = None   # the error that ended it

    def chunk(self, text: str, calls=None, entries=()) -> dict:
        if self.chat:
            message: dict = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [{"function": {"index": i, "name": c.name, "arguments": _arguments(c)}}
                                         for i, c in enumerate(calls)]
            out = {"model": self.model, "created_at": now_iso(), "message": message, "done": False}
        else:
            out = {"model": self.model, "created_at": now_iso(), "response": text, "done": False}
        if self.logprobs and entries:
            out["logprobs"] = logprobs_of(entries)
        return out

    def last(self, text: str, end: Finished, prompt: list[int], calls=None, entries=()) -> dict:
        done, s = end.done, end.done.stats
        out = self.chunk(text, calls, entries)
        out.update(done=True, done_reason=finish_reason(done),
                   total_duration=int((time.monotonic() - self.started) * 1e9),
                   load_duration=int(self.load_seconds * 1e9), prompt_eval_count=s.prompt_tokens,
                   prompt_eval_duration=int(s.prompt_seconds * 1e9), eval_count=s.generated_tokens,
                   eval_duration=int(s.generation_seconds * 1e9), speculative=speculative(done, end.drafts))
        if self.context:
            out["context"] = list(prompt) + list(done.tokens)
        return out


def _arguments(call) -> dict:
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {"value": value}


async def _events(job: Job, answer: Answer) -> AsyncIterator[dict]:
    """The answer's objects from the job's events (text piled up meanwhile goes out as one)."""
    try:
        while True:
            items, text = await pending(job)
            entries = [e for item in items if isinstance(item, Text) for e in item.logprobs]
            if answer.calls is not None:
                text = answer.calls.feed(text)
            end = items[-1]
            if isinstance(end, Finished):
                calls = None
                if answer.calls is not None:
                    rest, calls = answer.calls.finish()
                    text += rest
                yield answer.last(text, end, job.tokens or [], calls, entries)
                return
            if text or (answer.logprobs and entries):
                yield answer.chunk(text, entries=entries)
            if isinstance(end, Failed):
                answer.failed = end.error
                yield end.error.ollama_body()
                return
    finally:
        job.cancel.set()   # the client left (or it ended): the engine stops at its next step


async def _stream(job: Job, answer: Answer) -> AsyncIterator[bytes]:
    async for obj in _events(job, answer):
        yield ndjson(obj)


async def respond(served: Loaded, request: Request, job: Job, answer: Answer, streaming: bool) -> Response:
    async def whole() -> Response:
        text, logprobs, last = "", [], None
        async for obj in _events(job, answer):
            if answer.failed is not None:
                return answer.failed.ollama_response()
            last = obj
            logprobs += obj.get("logprobs", [])
            if not obj["done"]:
                text += obj["message"]["content"] if answer.chat else obj["response"]
        if answer.chat:
            last["message"]["content"] = text + last["message"]["content"]
        else:
            last["response"] = text + last["response"]
        if answer.logprobs:
            last["logprobs"] = logprobs
        return JSONResponse(last)

    return await run(served, request, job, streaming=streaming, whole=whole,
                     streamed=lambda: ndjson_stream(_stream(job, answer)))


# -- requests ----------------------------------------------------------------------------------------
def _loaded_only(model: str, served: Loaded, kind: str, unload: bool) -> dict:
    """Ollama's answer to an empty request: the model loaded (or unloaded, ``keep_alive: 0``)."""
    reason = "unload" if unload else "load"
    out = {"model": model, "created_at": now_iso(), "done": True, "done_reason": reason}
    out.update({"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""})
    return out


def chat_job(req: ChatRequest, fields: dict, served: Loaded):
    """See :func:`_chat_job`; its errors name the ``/api`` fields."""
    try:
        return _chat_job(req, fields, served)
    except APIError as exc:
        raise in_ollamas_words(exc) from None


def generate_job(req: GenerateRequest, fields: dict, served: Loaded):
    """See :func:`_generate_job`; its errors name the ``/api`` fields."""
    try:
        return _generate_job(req, fields, served)
    except APIError as exc:
        raise in_ollamas_words(exc) from None


def _chat_job(req: ChatRequest, fields: dict, served: Loaded):
    """(prompt, config, tools, context): ``/api/chat`` on the chat path ``/v1`` takes, tool results
    paired as Ollama pairs them; a last assistant message is continued (its text ends the prompt);
    ``context`` False: no ``context`` in the answer."""
    body = chat_body(req, fields, served.name)
    prompt, config, tools = chat_request(body, served.spec, served.defaults, served.engine.formatter, paired=False)
    start = prefill(req)
    if start is not None:
        prompt = rendered(served.engine, prompt, "messages") + start
    return prompt, config, tools, False


def _generate_job(req: GenerateRequest, fields: dict, served: Loaded):
    """(prompt, config, tools, context): ``/api/generate`` as a text completion (``raw``; ``suffix``:
    fill-in-the-middle) or a one-message chat after an earlier answer's ``context``; ``context``
    True: the answer gives the prompt's tokens and its own back as ``context``, as Ollama does."""
    engine = served.engine
    if req.suffix:
        text = fim_text(engine, req.model, req.prompt, req.suffix, req.system)
        prompt, config = completion_request(generate_body(req, fields, served.name, text), served.defaults)
        return prompt, config, None, False
    body = generate_body(req, fields, served.name)
    if req.raw:
        return (*completion_request(body, served.defaults), None, False)
    prompt, config, tools = chat_request(body, served.spec, served.defaults, engine.formatter)
    prompt = (context_text(engine, req.context) if req.context else "") + rendered(engine, prompt, "prompt")
    return prompt, config, tools, True


async def _generation(state, request: Request, schema, kind: str) -> Response:
    started = time.monotonic()
    req = await read(state, request, schema)
    keep = keep_alive_of(req.keep_alive)
    models = state.models
    was_loaded = models.canonical(req.model) in models.loaded
    served = await models.acquire(req.model, keep)
    load_seconds = 0.0 if was_loaded else served.load_seconds
    empty = not req.messages if kind == "chat" else (not req.prompt and not req.suffix)
    if empty:
        unload = keep == 0
        if unload:
            await models.unload(served.name)
        return JSONResponse(_loaded_only(req.model, served, kind, unload))
    fields, policy = read_options(req.options, served.engine.n_ctx)
    prompt, config, tools, context = (chat_job if kind == "chat" else generate_job)(req, fields, served)
    config = with_policy(config, policy)
    offered = tools is not None and tools.request is not None
    job = Job(prompt, config, param="messages" if kind == "chat" else "prompt", id=f"{kind}-{time.time_ns():x}",
              grammar_param="tools" if offered else "format")
    answer = Answer(req.model, kind == "chat", tools, started=started, load_seconds=load_seconds,
                    logprobs=config.logprobs is not None, context=context)
    return await respond(served, request, job, answer, req.stream)


def add_routes(app: FastAPI, state) -> None:
    """``/api/chat``, ``/api/generate`` and the refused embeddings routes on ``app``."""
    @app.post("/api/chat")
    async def chat(request: Request):
        return await _generation(state, request, ChatRequest, "chat")

    @app.post("/api/generate")
    async def generate(request: Request):
        return await _generation(state, request, GenerateRequest, "generate")

    @app.post("/api/embed")
    @app.post("/api/embeddings")
    async def embed(request: Request):
        check_key(state.api_key, request)
        raise APIError(400, "embeddings are not supported: this server serves text generation models only "
                            "(no embedding model).", param="model")

