"""The app: both APIs mounted (OpenAI's under ``/v1``, :mod:`.openai`; Ollama's under ``/api``,
:mod:`.ollama`), plus ``/health`` and Prometheus ``/metrics``; the middleware every request passes
(the body limit, the shutdown that ends every response, the request log), and the error handlers:
every error in the shape of the API its path belongs to, never a traceback."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Callable, Optional

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from ..core import __version__
from . import ollama, openai
from .answering import ndjson, sse
from .bodies import Disconnected
from .errors import APIError, ModelError, internal, shutting_down, too_large
from .request_log import RequestLog
from .model_holds import HoldModels
from .state import ServerState
from .worker import log

__all__ = ["BodyLimit", "QuietShutdown", "ServerState", "create_app"]


def is_ollama(path: str) -> bool:
    return path.startswith("/api/")


def error_response(path: str, exc: APIError | ModelError) -> Response:
    """``exc`` answered as the API that ``path`` belongs to answers it."""
    api = ollama if is_ollama(path) else openai
    if isinstance(exc, ModelError):
        exc = api.model_error(exc)
    return exc.ollama_response() if api is ollama else exc.response()


# -- middleware ------------------------------------------------------------------------------------
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
            return await error_response(scope.get("path", ""), too_large(self.limit))(scope, receive, send)
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
                kind = dict(message.get("headers", [])).get(b"content-type", b"")
                sent["stream"] = "sse" if kind.startswith(b"text/event-stream") else \
                    "ndjson" if kind.startswith(b"application/x-ndjson") else False
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
                await error_response(scope.get("path", ""), error)(scope, receive, send)
            else:
                body = {"sse": sse(error.body()) + b"data: [DONE]\n\n", "ndjson": ndjson(error.ollama_body())}
                await send({"type": "http.response.body", "body": body.get(sent["stream"], b""), "more_body": False})


# -- the app ---------------------------------------------------------------------------------------
def _error_handlers(app: FastAPI) -> None:
    """Every error in its API's shape (OpenAI's, Ollama's ``{"error": ...}`` under ``/api/``); a
    client that went away gets nothing and logs nothing."""

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(request.url.path, exc)

    @app.exception_handler(ModelError)
    async def _model_error(request, exc: ModelError):
        return error_response(request.url.path, exc)

    @app.exception_handler(Disconnected)
    async def _gone(_request, _exc: Disconnected):
        return Response(status_code=499)   # goes nowhere (the connection is closed), logs nothing

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(request.url.path, APIError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def _unexpected(request, _exc: Exception):
        return error_response(request.url.path, internal())


def create_app(state: ServerState, *, on_shutdown: Optional[Callable[[], None]] = None) -> FastAPI:
    """The app with every route of both APIs; ``on_shutdown`` (closing the engines) runs once the
    engine threads have ended."""
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
    app.add_middleware(HoldModels)   # outermost: a request holds its model until its response has ended
    _error_handlers(app)

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

    openai.add_routes(app, state)
    ollama.add_routes(app, state)
    return app
