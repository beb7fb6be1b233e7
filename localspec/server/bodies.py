"""What every route of both APIs does first: the API key checked, the body read as JSON, its text
checked and validated against the route's schema. Every failure is an :class:`~.errors.APIError`
(400 naming the field, 401), answered in the route's API's shape by the app's handler."""

from __future__ import annotations

import hmac
import json
from typing import Callable, Optional

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from .body_limits import check_items
from .errors import APIError, bad_request, unauthorized


class Disconnected(Exception):
    """The client closed its connection before its request body arrived: nobody to answer."""


def check_key(api_key: Optional[str], request: Request) -> None:
    """401 unless the request carries ``Authorization: Bearer <api_key>`` (no key set: anyone)."""
    if api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise unauthorized(bool(header))


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON value")


def invalid_text(data) -> Optional[str]:
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


def first_error(exc: ValidationError, refused: Callable[[str], str], rename=lambda p: p) -> APIError:
    """A schema's first complaint as a 400 naming the field (``rename``: the field's name as the
    client's API spells it); a field the schema does not declare gets ``refused(field)``'s words."""
    first = exc.errors()[0]
    param = rename(".".join(str(p) for p in first["loc"]) or None)
    if first["type"] == "extra_forbidden":
        return bad_request(refused(param), param=param)
    return bad_request(f"Invalid value for '{param}': {first['msg']}." if param else first["msg"], param=param)


def validated(schema: type[BaseModel], data: dict, refused: Callable[[str], str], rename=lambda p: p):
    """``data`` as ``schema`` (see :func:`first_error`)."""
    try:
        return schema.model_validate(data)
    except RecursionError:
        raise bad_request("The request body is nested too deeply.") from None
    except ValidationError as exc:
        raise first_error(exc, refused, rename) from None


async def read_body(request: Request, schema: type[BaseModel], refused: Callable[[str], str], *,
                    empty: Optional[dict] = None):
    """The request body as ``schema``: what the JSON parser, UTF-8 or the schema cannot take is a
    400 naming the field (``refused``: the words for a field the schema does not declare; ``empty``:
    what an empty body means, None: a 400)."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise Disconnected() from None
    try:
        data = dict(empty) if not raw and empty is not None else json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        raise APIError(400, "We could not parse the JSON body of your request: it is nested too deeply.",
                       code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise APIError(400, f"We could not parse the JSON body of your request: {exc}.",
                       code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    check_items(data)
    bad_text = invalid_text(data)
    if bad_text is not None:
        raise bad_request(f"Invalid value for '{bad_text}': the text holds a lone surrogate, which is not "
                          "valid Unicode.", param=bad_text, code="invalid_text")
    return validated(schema, data, refused)
