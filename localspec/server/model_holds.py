"""Which loaded models the request in progress holds: a route's model is held from the moment it
is acquired until the response has ended (its last event sent, or its client gone), so that no
eviction, keep-alive expiry or reload unloads a model under a request that uses it.

:class:`HoldModels` (ASGI middleware) gives each HTTP request a list in a context variable;
:func:`hold` (called by the model manager when it hands out a model) adds to it, and the
middleware releases every hold when the request's response is over."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Optional

_HELD: ContextVar[Optional[list]] = ContextVar("localspec_held_models", default=None)


def hold(loaded) -> None:
    """The request in progress holds ``loaded`` (a :class:`~.models_manager.Loaded`) until its
    response ends; outside a request (a preload, a test's direct call) nothing is held."""
    held = _HELD.get()
    if held is not None:
        loaded.hold()
        held.append(loaded)


def held_here(loaded) -> int:
    """How many holds the request in progress has on ``loaded``."""
    held = _HELD.get()
    return sum(1 for h in held if h is loaded) if held is not None else 0


def adopt(loaded) -> None:
    """The request in progress takes over a hold already taken for it (by the load it waited for);
    outside a request the hold is given back at once."""
    held = _HELD.get()
    if held is None:
        loaded.release()
    else:
        held.append(loaded)


class HoldModels:
    """ASGI middleware: the holds of one HTTP request, released when its response has ended."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list = []
        token = _HELD.set(held)
        try:
            await self.app(scope, receive, send)
        finally:
            _HELD.reset(token)
            for loaded in held:
                loaded.release()
