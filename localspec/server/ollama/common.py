"""What Ollama's routes share: how ``/api`` words what it refuses and answers the model manager's
typed errors (Ollama's ``{"error": "..."}``, with its statuses), request bodies, ``created_at``
and ``keep_alive``."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

from fastapi import Request
from pydantic import BaseModel

from ..bodies import check_key, read_body
from ..errors import APIError, ModelBusy, ModelDoesNotFit, ModelError, ModelNotFound, bad_request
from ..models_manager import parse_keep_alive


def refused(param: str) -> str:
    return (f"Unrecognized field: {param} (this server does not honour it; see docs/server.md's table of "
            "Ollama fields).")


async def read(state, request: Request, schema: type[BaseModel]):
    """The API key checked, then the body as ``schema`` (an empty body is ``{}``, as Ollama reads it)."""
    check_key(state.api_key, request)
    return await read_body(request, schema, refused, empty={})


def model_error(exc: ModelError) -> APIError:
    """A model the manager could not serve, as ``/api`` answers it (Ollama: 404 for a name it
    does not have, 500 for a model that fails to load)."""
    if isinstance(exc, ModelNotFound):
        return APIError(404, exc.message)
    if isinstance(exc, ModelBusy):
        return APIError(503, exc.message, headers={"Retry-After": str(exc.retry_after or 5)})
    if isinstance(exc, ModelDoesNotFit):
        return APIError(507, exc.message)
    return APIError(500, exc.message)


def now_iso() -> str:
    """RFC 3339 in UTC with nanoseconds' digits, as Ollama writes ``created_at``."""
    t = time.time_ns()
    return datetime.fromtimestamp(t // 10**9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{t % 10**9:09d}Z"


def keep_alive_of(value) -> object:
    """A request's ``keep_alive`` in seconds (None: keep; ``...``: not given)."""
    if value is None:
        return ...
    try:
        return parse_keep_alive(value)
    except ValueError:
        raise bad_request(f"keep_alive must be a duration (\"5m\", \"1h30m\"), seconds, 0 or -1, got "
                          f"{json.dumps(value)[:40]}.", param="keep_alive") from None
