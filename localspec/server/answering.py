"""One generating request on the route's side, shared by ``/v1/chat/completions``,
``/v1/completions``, ``/v1/responses``, ``/api/chat`` and ``/api/generate``: the job admitted to its
model's worker, its first event awaited while a client that goes away cancels it, then the route's
own streaming response (server-sent events on ``/v1``, NDJSON on ``/api``) or its whole answer gathered.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator, Awaitable, Callable, Union

from fastapi import Request
from starlette.responses import Response, StreamingResponse

from .models_manager import Loaded
from .worker import Failed, Finished, Job, Started, Text


async def watch_disconnect(request: Request, job: Job) -> None:
    """Cancel ``job`` when the client goes away (used while no streaming response listens)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


NDJSON = "application/x-ndjson"


def sse(data, event: str | None = None) -> bytes:
    """One server-sent event (``event``: its type line, as the Responses API names its events)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def ndjson(obj) -> bytes:
    """One line of an NDJSON stream (Ollama's)."""
    return json.dumps(obj, ensure_ascii=False).encode() + b"\n"


def event_stream(body: AsyncIterator[bytes]) -> StreamingResponse:
    """Server-sent events, unbuffered by proxies (OpenAI's streams: chat, completions, responses)."""
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def ndjson_stream(body: AsyncIterator[bytes]) -> StreamingResponse:
    """An NDJSON stream (Ollama's: one JSON object a line)."""
    return StreamingResponse(body, media_type=NDJSON)


async def run(served: Loaded, request: Request, job: Job, *, streaming: bool,
              streamed: Callable[[], Response], whole: Callable[[], Awaitable[Response]]) -> Response:
    """Admit ``job`` (a grammar that cannot run: 400 naming its field; a full queue: 429) and wait
    for its start; a job that fails before it starts (a prompt too long) raises its
    :class:`~.errors.APIError`, answered in the route's error shape by the app's handler. Then
    ``streamed()`` (a streaming response, which notices a disconnect itself) or ``await whole()``
    (the answer gathered from the job's events; the job is cancelled when it returns)."""
    request.state.job = job    # for the request log
    await served.admit(job)
    watcher = asyncio.ensure_future(watch_disconnect(request, job))
    try:
        first = await job.events.get()
        if isinstance(first, Failed):
            raise first.error
        assert isinstance(first, Started)
        if streaming:
            watcher.cancel()   # from here the streaming response notices a disconnect itself
            return streamed()
        return await whole()
    finally:
        watcher.cancel()
        if not streaming:
            job.cancel.set()


async def pending(job: Job) -> tuple[list, str]:
    """A streaming job's next event and every one that piled up meanwhile (they go out as one
    chunk), with their text joined."""
    items = [await job.events.get()]
    while not job.events.empty():
        items.append(job.events.get_nowait())
    return items, "".join(item.text for item in items if isinstance(item, Text))


async def gathered(job: Job) -> tuple[str, list, Union[Finished, Failed]]:
    """A started job's whole text, its logprob entries and how it ended."""
    parts: list[str] = []
    entries: list = []
    while True:
        item = await job.events.get()
        if isinstance(item, Text):
            parts.append(item.text)
            entries.extend(item.logprobs)
        elif isinstance(item, (Finished, Failed)):
            return "".join(parts), entries, item
