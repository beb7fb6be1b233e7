"""The server's errors, one copy of each shape: OpenAI's ``{"error": {"message", "type", "param",
"code"}}`` (``/v1``) and Ollama's ``{"error": "..."}`` (``/api``), with an HTTP status; and the
model manager's typed errors (:class:`ModelError`), which each API answers with its own status.

An error may quote what the client sent (a model name, a content part's type, a field's path); a
value that cannot be encoded as UTF-8 (a lone surrogate, ``"\\ud800"`` in JSON) is written escaped,
so that the answer itself never fails."""

from __future__ import annotations

from starlette.responses import JSONResponse


def encodable(text: str | None) -> str | None:
    """``text`` with what UTF-8 cannot encode (lone surrogates) written as ``\\udXXX`` escapes."""
    if text is None:
        return None
    text = str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


class APIError(Exception):
    """An error a client caused (or a refusal), answered with ``status`` and OpenAI's error body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None) -> None:
        message, param = encodable(message), encodable(param)
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """OpenAI's shape."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def ollama_body(self) -> dict:
        return {"error": self.message}

    def ollama_response(self) -> JSONResponse:
        """Ollama's shape: ``{"error": "..."}``."""
        return JSONResponse(self.ollama_body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def context_overflow(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="context_length_exceeded")


def queue_full(size: int) -> APIError:
    return APIError(429, f"The server is busy: {size} requests are already waiting. Retry shortly.",
                    type="requests", code="rate_limit_exceeded", headers={"Retry-After": "1"})


def unauthorized(given: bool) -> APIError:
    message = ("Incorrect API key provided." if given else
               "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.")
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server accepts ({limit} bytes; see --max-body).",
                    code="request_too_large")


def unknown_model(name: str, served: list[str]) -> APIError:
    return APIError(404, f"The model '{name}' does not exist; this server serves {', '.join(served)}.",
                    param="model", code="model_not_found")


def shutting_down(what: str = "The server is shutting down.") -> APIError:
    return APIError(503, what, type="server_error", code="server_shutting_down")


def internal(message: str = "The server failed while handling the request.") -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")


# -- the model manager's errors: what it could not do, typed; each API chooses status and shape ------
class ModelError(Exception):
    """A request's model could not be served; ``retry_after``: seconds a client may wait and retry."""

    def __init__(self, model: str, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.message = encodable(message)
        self.retry_after = retry_after


class ModelNotFound(ModelError):
    """The store holds no model by that name (or its record names files that are gone)."""


class ModelDoesNotFit(ModelError):
    """The model does not fit the memory budget even with no other model loaded."""


class ModelBusy(ModelError):
    """The model does not fit beside the loaded models, and they are all answering requests."""


class ModelLoadFailed(ModelError):
    """The model's record or files cannot be read or loaded."""
