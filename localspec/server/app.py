"""The HTTP routes: OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``,
plus ``/health`` and Prometheus ``/metrics``. Every error is OpenAI's error shape, never a traceback."""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from ..core import __version__
from ..core.events import DoneEvent
from ..formats.chat_format import ToolCall
from ..formats.tool_calls import CallStream
from .answering import event_stream, gathered, pending, run
from .errors import APIError, bad_request, internal, shutting_down, too_large, unauthorized
from .features import (REFUSAL_HINTS, ChatTools, answer_calls, chat_logprobs_content, completion_logprobs_content,
                       prediction_usage)
from .params import chat_request, completion_request
from .request_log import RequestLog
from .schemas import ChatCompletionRequest, CompletionRequest
from .models_manager import Loaded, ModelManager, openai_models, unknown
from .ollama import add_ollama_routes
from .ollama_common import is_ollama, ollama_error
from .worker import Failed, Finished, Job, Text, log

FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


class ServerState:
    """What the routes share: the loaded models (:mod:`.models_manager`), the settings."""

    def __init__(self, models: ModelManager, *, api_key: Optional[str], max_body: int, expose_paths: bool = False,
                 log_requests: bool = True) -> None:
        self.models = models
        self.expose_paths = expose_paths   # /v1/models shows the models' files (serve --expose-paths)
        self.log_requests = log_requests   # one log line per request (serve --quiet: none)
        self.api_key = api_key
        self.max_body = max_body
        self.created = int(time.time())
        self.fingerprint = f"localspec-{__version__}"
        self.on_close: Optional[Callable[[], None]] = None
        self._closed = False

    @property
    def names(self) -> list[str]:
        """The default model's names (the one a request without ``model`` gets)."""
        return [self.models.default_name()]

    def close(self) -> None:
        """Stop the workers and close their engines, then call ``on_close``; once."""
        if self._closed:
            return
        self._closed = True
        self.models.close()
        if self.on_close is not None:
            self.on_close()


# -- request bodies ------------------------------------------------------------------------------
class BodyLimit:
    """ASGI middleware: 413 for a body over ``limit`` bytes, declared or streamed."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await too_large(self.limit).response()(scope, receive, send)
        received = 0

        async def limited():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large(self.limit)
            return message

        await self.app(scope, limited, send)


class Disconnected(Exception):
    """The client closed its connection before its request body arrived: nobody to answer."""


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON value")


def _invalid_text(data) -> Optional[str]:
    """The path (``messages.0.content``) of the first string, or key, in ``data`` that is not valid
    Unicode (a lone surrogate such as ``"\\ud800"``, which JSON can spell but UTF-8 cannot hold)."""
    todo: list[tuple[tuple, object]] = [((), data)]
    while todo:                                   # no recursion: any depth the parser took is fine
        path, value = todo.pop()
        if isinstance(value, dict):
            items = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            items = []
        for key, item in reversed(items):
            for text in (key, item):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError:
                        return ".".join(str(p) for p in (*path, key))
            todo.append(((*path, key), item))
    return None


class QuietShutdown:
    """ASGI middleware: a response that uvicorn cancels at shutdown (it outlived the grace period,
    or a second Ctrl-C cut the wait short) still ends properly: a stream with an error event and
    ``[DONE]``, a response not yet begun with a 503; one log line, no traceback."""

    def __init__(self, app, worker) -> None:   # worker: what says whether shutdown has begun (``closing``)
        self.app = app
        self.worker = worker

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sent = {"started": False, "stream": False, "complete": False}

        async def tracking_send(message) -> None:
            if message["type"] == "http.response.start":
                sent["started"] = True
                sent["stream"] = dict(message.get("headers", [])).get(b"content-type", b"").startswith(
                    b"text/event-stream")
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                sent["complete"] = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except asyncio.CancelledError:
            if not self.worker.closing:
                raise
            if sent["complete"]:
                return
            log(f"shutting down: ended a {scope.get('path', '')} response early (the grace period was over)")
            error = shutting_down()
            if not sent["started"]:
                await error.response()(scope, receive, send)
            else:
                body = sse(error.body()) + b"data: [DONE]\n\n" if sent["stream"] else b""
                await send({"type": "http.response.body", "body": body, "more_body": False})


async def read_body(request: Request, schema: type[BaseModel]):
    """The request body as ``schema``; anything the JSON parser or the schema cannot take is a 400."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise Disconnected() from None
    try:
        data = json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        raise APIError(400, "We could not parse the JSON body of your request: it is nested too deeply.",
                       code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}.",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    bad_text = _invalid_text(data)
    if bad_text is not None:
        raise bad_request(f"Invalid value for '{bad_text}': the text holds a lone surrogate, which is not "
                          "valid Unicode.", param=bad_text, code="invalid_text")
    try:
        return schema.model_validate(data)
    except RecursionError:
        raise bad_request("The request body is nested too deeply.") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":   # OpenAI's own words for a field it does not know
            raise bad_request(f"Unrecognized request argument supplied: {param} ({REFUSAL_HINTS.get(param, '')}"
                              "this server does not honour it; see the README's list of fields).", param=param) from None
        raise bad_request(f"Invalid value for '{param}': {first['msg']}." if param else first["msg"],
                          param=param) from None


def check_api_key(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise unauthorized(bool(header))


async def serving(state: ServerState, name: Optional[str]) -> Loaded:
    """The loaded model a request's ``model`` names (loaded now if need be; 404 if the store has none)."""
    return await state.models.acquire(name)


# -- answers ---------------------------------------------------------------------------------------
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
        "speculative": {
            "enabled": s.spec,
            "drafts": drafts,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4),
            "cycles": s.cycles,
            "tokens_per_cycle": round(s.tokens_per_cycle, 4),
            "accepted_per_position": list(s.accepted_per_position),
            "drafted_per_position": list(s.drafted_per_position),
            "sources": {name: {"drafts": c, "drafted": d, "accepted": a}
                        for name, (c, d, a) in sorted(s.sources.items())},
        },
    }


def timings(done: DoneEvent) -> dict:
    """llama-server's ``timings`` object."""
    s = done.stats
    return {
        "prompt_n": s.prompt_tokens,
        "prompt_ms": round(s.prompt_seconds * 1e3, 3),
        "prompt_per_second": round(s.prompt_tokens_per_second, 2),
        "predicted_n": s.generated_tokens,
        "predicted_ms": round(s.generation_seconds * 1e3, 3),
        "predicted_per_second": round(s.tokens_per_second, 2),
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
        finish = FINISH_REASONS.get(done.finish_reason, "stop")
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


def sse(data) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


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
                finish = FINISH_REASONS.get(end.done.finish_reason, "stop")
                if reply.calls is not None:
                    rest, calls = reply.calls.finish(length=finish == "length")
                    if rest:
                        yield sse(reply.chunk(rest))
                    if calls:
                        yield sse(reply.chunk(None, calls=calls))
                        finish = finish if reply.calls.cut or finish == "length" else "tool_calls"
                final = reply.chunk(None, finish)
                final["timings"] = timings(end.done)
                yield sse(final)
                if include_usage:   # OpenAI's rule: usage once, on a last chunk without choices
                    yield sse({**reply.head(final["object"]), "choices": [],
                               "usage": usage(end.done, end.drafts, reply.predicted)})
                yield b"data: [DONE]\n\n"
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


# -- the app ---------------------------------------------------------------------------------------
def _error_handlers(app: FastAPI) -> None:
    """Every error is OpenAI's error shape (Ollama's ``{"error": ...}`` under ``/api/``); a client
    that went away gets nothing and logs nothing."""

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return ollama_error(exc) if is_ollama(request) else exc.response()

    @app.exception_handler(Disconnected)
    async def _gone(_request, _exc: Disconnected):
        return Response(status_code=499)   # goes nowhere (the connection is closed), logs nothing

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        error = APIError(exc.status_code, str(exc.detail), code=code)
        return ollama_error(error) if is_ollama(request) else error.response()

    @app.exception_handler(Exception)
    async def _unexpected(request, _exc: Exception):
        return ollama_error(internal()) if is_ollama(request) else internal().response()


def create_app(state: ServerState, *, on_shutdown: Optional[Callable[[], None]] = None) -> FastAPI:
    """The app; ``on_shutdown`` (closing the engine) runs once the engine thread has ended."""
    state.on_close = on_shutdown

    @asynccontextmanager
    async def lifespan(_app):
        state.models.start()
        try:
            yield
        finally:
            state.close()

    app = FastAPI(title="localspec", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.add_middleware(BodyLimit, limit=state.max_body)
    app.add_middleware(QuietShutdown, worker=state.models)
    app.add_middleware(RequestLog, enabled=state.log_requests)
    _error_handlers(app)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        check_api_key(state, request)
        body = await read_body(request, ChatCompletionRequest)
        served = await serving(state, body.model)
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
        check_api_key(state, request)
        body = await read_body(request, CompletionRequest)
        served = await serving(state, body.model)
        prompt, config = completion_request(body, served.defaults)
        reply = Reply(state, False, body.model or served.name, with_logprobs=config.logprobs is not None)
        job = Job(prompt, config, param="prompt", id=reply.id)
        include = bool(body.stream_options and body.stream_options.include_usage)
        return await answer(served, request, job, reply, streaming=body.stream, include_usage=include,
                            prefix=prompt if body.echo else "")

    @app.get("/v1/models")
    async def models(request: Request):
        check_api_key(state, request)
        return {"object": "list", "data": openai_models(state.models, state.created, paths=state.expose_paths)}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        check_api_key(state, request)
        name = state.models.canonical(model_id)   # 404 for a model the store does not hold
        for listed in openai_models(state.models, state.created, paths=state.expose_paths):
            if listed["id"] == name:
                return listed
        raise unknown(model_id)

    @app.get("/health")
    async def health():
        models = state.models
        return {"status": "ok", "model": state.names[0], "requests_processing": models.running_count(),
                "requests_deferred": models.waiting_count(), "queue_size": models.settings.queue_size,
                "loaded": list(models.loaded), "loading": models.loading()}

    @app.get("/metrics")
    async def metrics():
        content, media_type = state.models.metrics.exposition()
        return Response(content, media_type=media_type)

    add_ollama_routes(app, state)
    return app
