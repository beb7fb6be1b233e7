"""Ollama's API on the same server and port as ``/v1``: ``/api/chat`` and ``/api/generate`` here,
the model routes (tags, show, ps, pull, copy, delete, create) in :mod:`.ollama_models`.

Streaming is NDJSON and on by default; ``stream: false`` gives one object. The fields are
Ollama's, durations in nanoseconds; the speculative statistics come under ``speculative``. A
request is turned into the OpenAI request it means (:mod:`.ollama_params`) and runs on the same
path, on the worker of the model it names (loaded on demand, :mod:`.models_manager`). Every error
is Ollama's ``{"error": "..."}`` with the HTTP status (inside a stream: one such line).
"""

from __future__ import annotations

import json
import time
from typing import AsyncIterator

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ..core.events import DoneEvent
from ..formats.tool_calls import CallStream
from .answering import pending, run
from .errors import APIError
from .models_manager import Loaded
from .ollama_common import NDJSON, check_key, keep_alive_of, ndjson, now_iso, ollama_error, read_json
from .ollama_models import add_model_routes
from .ollama_params import chat_body, generate_body, read_options, with_policy
from .ollama_schemas import ChatRequest, GenerateRequest
from .params import chat_request, completion_request
from .worker import Failed, Finished, Job

DONE_REASONS = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


# -- answers -----------------------------------------------------------------------------------------
def speculative(done: DoneEvent, drafts: int) -> dict:
    """localspec's own block: what the speculation did for this request."""
    s = done.stats
    return {"enabled": s.spec, "drafts": drafts, "drafted": s.drafted, "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4), "cycles": s.cycles,
            "tokens_per_cycle": round(s.tokens_per_cycle, 4),
            "sources": {name: {"drafts": c, "drafted": d, "accepted": a} for name, (c, d, a) in sorted(s.sources.items())}}


class Answer:
    """One ``/api/chat`` or ``/api/generate`` answer: its chunks, its last object."""

    def __init__(self, model: str, chat: bool, tools, *, started: float, load_seconds: float) -> None:
        self.model, self.chat = model, chat
        self.calls = CallStream(tools.format) if tools is not None and tools.request is not None else None
        self.started, self.load_seconds = started, load_seconds
        self.failed: APIError | None = None   # the error that ended it

    def chunk(self, text: str, calls=None) -> dict:
        if self.chat:
            message: dict = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [{"function": {"index": i, "name": c.name, "arguments": _arguments(c)}}
                                         for i, c in enumerate(calls)]
            return {"model": self.model, "created_at": now_iso(), "message": message, "done": False}
        return {"model": self.model, "created_at": now_iso(), "response": text, "done": False}

    def last(self, text: str, done: DoneEvent, drafts: int, calls=None) -> dict:
        s = done.stats
        out = self.chunk(text, calls)
        out.update(done=True, done_reason=DONE_REASONS.get(done.finish_reason, "stop"),
                   total_duration=int((time.monotonic() - self.started) * 1e9),
                   load_duration=int(self.load_seconds * 1e9), prompt_eval_count=s.prompt_tokens,
                   prompt_eval_duration=int(s.prompt_seconds * 1e9), eval_count=s.generated_tokens,
                   eval_duration=int(s.generation_seconds * 1e9), speculative=speculative(done, drafts))
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
            if answer.calls is not None:
                text = answer.calls.feed(text)
            end = items[-1]
            if isinstance(end, Finished):
                calls = None
                if answer.calls is not None:
                    rest, calls = answer.calls.finish()
                    text += rest
                yield answer.last(text, end.done, end.drafts, calls)
                return
            if text:
                yield answer.chunk(text)
            if isinstance(end, Failed):
                answer.failed = end.error
                yield {"error": end.error.message}
                return
    finally:
        job.cancel.set()   # the client left (or it ended): the engine stops at its next step


async def _stream(job: Job, answer: Answer) -> AsyncIterator[bytes]:
    async for obj in _events(job, answer):
        yield ndjson(obj)


async def respond(served: Loaded, request: Request, job: Job, answer: Answer, streaming: bool) -> Response:
    async def whole() -> Response:
        text, last = "", None
        async for obj in _events(job, answer):
            if answer.failed is not None:
                return ollama_error(answer.failed)
            last = obj
            key = "message" if answer.chat else "response"
            if not obj["done"]:
                text += obj[key]["content"] if answer.chat else obj[key]
        if answer.chat:
            last["message"]["content"] = text + last["message"]["content"]
        else:
            last["response"] = text + last["response"]
        return JSONResponse(last)

    return await run(served, request, job, streaming=streaming, whole=whole,
                     streamed=lambda: StreamingResponse(_stream(job, answer), media_type=NDJSON))


# -- routes ------------------------------------------------------------------------------------------
def _loaded_only(model: str, served: Loaded, kind: str, unload: bool) -> dict:
    """Ollama's answer to an empty request: the model loaded (or unloaded, ``keep_alive: 0``)."""
    reason = "unload" if unload else "load"
    out = {"model": model, "created_at": now_iso(), "done": True, "done_reason": reason}
    out.update({"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""})
    return out


async def _generation(state, request: Request, schema, kind: str) -> Response:
    check_key(state.api_key, request)
    started = time.monotonic()
    req = await read_json(request, schema)
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
    if kind == "chat":
        body = chat_body(req, fields, served.name)
        prompt, config, tools = chat_request(body, served.spec, served.defaults, served.engine.formatter)
        param = "messages"
    else:
        body = generate_body(req, fields, served.name)
        if req.raw:
            (prompt, config), tools, param = completion_request(body, served.defaults), None, "prompt"
        else:
            prompt, config, tools = chat_request(body, served.spec, served.defaults, served.engine.formatter)
            param = "prompt"
    config = with_policy(config, policy)
    offered = tools is not None and tools.request is not None
    job = Job(prompt, config, param=param, id=f"{kind}-{time.time_ns():x}",
              grammar_param="tools" if offered else "format")
    answer = Answer(req.model, kind == "chat", tools, started=started, load_seconds=load_seconds)
    return await respond(served, request, job, answer, req.stream)


def add_ollama_routes(app: FastAPI, state) -> None:
    """Ollama's routes on ``app`` (``state``: the app's ServerState)."""
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

    add_model_routes(app, state)
