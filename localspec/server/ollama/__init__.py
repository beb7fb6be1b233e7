"""Ollama's API under ``/api`` on the same server and port as ``/v1``: ``/api/chat`` and
``/api/generate`` (:mod:`.generation`, turned into the request they mean by :mod:`.params`), the
model routes (:mod:`.models`), the request bodies (:mod:`.schemas`), its error shape and statuses
(:mod:`.common`)."""

from __future__ import annotations

from fastapi import FastAPI

from . import generation, models
from .common import model_error

__all__ = ["add_routes", "model_error"]


def add_routes(app: FastAPI, state) -> None:
    """Every ``/api`` route on ``app`` (``state``: the app's :class:`~..state.ServerState`)."""
    generation.add_routes(app, state)
    models.add_routes(app, state)
