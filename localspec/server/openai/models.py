"""OpenAI's ``/v1/models`` and ``/v1/models/{id}``: every model in the store (a request's
``model`` loads it on demand)."""

from __future__ import annotations

from fastapi import FastAPI, Request

from ..bodies import check_key
from ..models_manager import openai_models, unknown
from ..state import ServerState


def add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/v1/models")
    async def models(request: Request):
        check_key(state.api_key, request)
        return {"object": "list", "data": openai_models(state.models, state.created, paths=state.expose_paths)}

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        check_key(state.api_key, request)
        name = state.models.canonical(model_id)   # 404 for a model the store does not hold
        for listed in openai_models(state.models, state.created, paths=state.expose_paths):
            if listed["id"] == name:
                return listed
        raise unknown(model_id)
