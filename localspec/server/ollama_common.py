"""What Ollama's routes share (:mod:`.ollama`, :mod:`.ollama_models`): its error shape
``{"error": "..."}``, NDJSON lines, request bodies, ``keep_alive`` and the API key."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Optional

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from .body_limits import check_items
from .errors import APIError, bad_request, unauthorized
from .models_manager import parse_keep_alive

NDJSON = "application/x-ndjson"


def is_ollama(request) -> bool:
    return request.url.path.startswith("/api/")


def ollama_error(exc: APIError) -> JSONResponse:
    """An error in Ollama's shape: ``{"error": "..."}``."""
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)


def now_iso() -> str:
    """RFC 3339 in UTC with nanoseconds' digits, as Ollama writes ``created_at``."""
    t = time.time_ns()
    return datetime.fromtimestamp(t // 10**9, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{t % 10**9:09d}Z"


def ndjson(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


# -- bodies ------------------------------------------------------------------------------------------
def _no_constant(constant: str):
    raise ValueError(f"{constant} is not a JSON value")


async def read_json(request: Request, schema: type[BaseModel]):
    """The body as ``schema``; what JSON or the schema cannot take is a 400 naming the field."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise APIError(499, "The client closed the request.") from None
    try:
        data = json.loads(raw or b"{}", parse_constant=_no_constant)
        json.dumps(data, ensure_ascii=False).encode("utf-8")   # a lone surrogate cannot be answered with
    except RecursionError:
        raise bad_request("We could not parse the JSON body of your request: it is nested too deeply.") from None
    except (ValueError, UnicodeError) as exc:
        raise bad_request(f"We could not parse the JSON body of your request: {exc}.") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    check_items(data)
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise bad_request(f"Unrecognized field: {param} (this server does not honour it; see the README's "
                              "table of Ollama fields).", param=param) from None
        raise bad_request(f"Invalid value for '{param}': {first['msg']}." if param else first["msg"],
                          param=param) from None


def keep_alive_of(value) -> object:
    """A request's ``keep_alive`` in seconds (None: keep; ``...``: not given)."""
    if value is None:
        return ...
    try:
        return parse_keep_alive(value)
    except ValueError:
        raise bad_request(f"keep_alive must be a duration (\"5m\", \"1h\"), seconds, 0 or -1, got "
                          f"{json.dumps(value)[:40]}.", param="keep_alive") from None


def check_key(api_key: Optional[str], request: Request) -> None:
    import hmac

    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise unauthorized(bool(request.headers.get("authorization")))
