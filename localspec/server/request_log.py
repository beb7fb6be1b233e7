"""The request log: one line per request on the server's standard error, as Ollama and
llama-server print them (``serve --quiet`` silences it)::

    localspec serve: 2026-11-27 13:45:01 | 200 |  1.42 s | 127.0.0.1 | POST /v1/chat/completions | prompt 31, output 64 tokens, 52.3 tok/s | drafted 48, accepted 40

A request that generated text adds its tokens (from its :class:`~.worker.Job`, which the route
leaves in ``request.state.job``), its decoding rate and what speculation drafted and accepted.
``/health`` and ``/metrics`` (polled by monitors) are not logged, nor a client that left before
its request arrived.
"""

from __future__ import annotations

import time

from .worker import log

QUIET_PATHS = ("/health", "/metrics")


def generation_part(job) -> str:
    """What a finished generation adds to its line ('' for none)."""
    finished = getattr(job, "finished", None)
    if finished is None:
        return ""
    s = finished.done.stats
    return (f" | prompt {s.prompt_tokens}, output {s.generated_tokens} tokens, {s.tokens_per_second:.1f} tok/s"
            f" | drafted {s.drafted}, accepted {s.accepted}")


def line(scope: dict, status: int, seconds: float) -> str:
    client = (scope.get("client") or ("-",))[0]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    job = (scope.get("state") or {}).get("job")
    return (f"{stamp} | {status} | {seconds:6.2f} s | {client} | {scope.get('method', '')} {scope.get('path', '')}"
            f"{generation_part(job)}")


class RequestLog:
    """ASGI middleware: one log line when a response has been sent in full (a stream: at its end)."""

    def __init__(self, app, enabled: bool) -> None:
        self.app = app
        self.enabled = enabled

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not self.enabled or scope.get("path") in QUIET_PATHS:
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = [0]

        async def tracking_send(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        await self.app(scope, receive, tracking_send)
        if status[0] and status[0] != 499:   # 499: the client left before its body arrived
            log(line(scope, status[0], time.perf_counter() - start))
