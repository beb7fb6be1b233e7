"""OpenAI's API under ``/v1``: chat completions and text completions (:mod:`.chat`), the
Responses API (:mod:`.responses`), the model list (:mod:`.models`); its error shape and statuses
(:mod:`.errors`)."""

from __future__ import annotations

from fastapi import FastAPI

from . import chat, models, responses
from .errors import model_error

__all__ = ["add_routes", "model_error"]


def add_routes(app: FastAPI, state) -> None:
    """Every ``/v1`` route on ``app`` (``state``: the app's :class:`~..state.ServerState`)."""
    chat.add_routes(app, state)
    responses.add_routes(app, state)
    models.add_routes(app, state)
