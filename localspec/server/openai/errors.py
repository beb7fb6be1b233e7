"""How ``/v1`` words what it refuses and answers the model manager's typed errors: OpenAI's
``{"error": {"message", "type", "param", "code"}}`` with OpenAI's statuses and codes."""

from __future__ import annotations

from fastapi import Request
from pydantic import BaseModel

from ..bodies import check_key, read_body
from ..errors import APIError, ModelBusy, ModelDoesNotFit, ModelError, ModelNotFound
from ..features import REFUSAL_HINTS


def refused(param: str) -> str:
    """OpenAI's own words for a field it does not know, and why this server does not take it."""
    return (f"Unrecognized request argument supplied: {param} ({REFUSAL_HINTS.get(param, '')}this server does "
            "not honour it; see docs/server.md's list of fields).")


async def read(state, request: Request, schema: type[BaseModel]):
    """The API key checked, then the body as ``schema``."""
    check_key(state.api_key, request)
    return await read_body(request, schema, refused)


def model_error(exc: ModelError) -> APIError:
    """A model the manager could not serve, as ``/v1`` answers it."""
    if isinstance(exc, ModelNotFound):
        return APIError(404, exc.message, param="model", code="model_not_found")
    if isinstance(exc, ModelBusy):
        return APIError(503, exc.message, type="server_error", code="model_busy",
                        headers={"Retry-After": str(exc.retry_after or 5)})
    if isinstance(exc, ModelDoesNotFit):
        return APIError(507, exc.message, param="model", type="server_error", code="model_load_failed")
    return APIError(400, exc.message, param="model", code="model_load_failed")
