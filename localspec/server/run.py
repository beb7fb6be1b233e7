"""Running the app under uvicorn until SIGINT or SIGTERM, and shutting down in order.

uvicorn's own shutdown stops accepting connections, then waits (``GRACE_S``) for the open ones
to finish. Before that wait, :class:`Server` tells the worker to abort: queued and new requests
get 503, and the running generation stops at its next cycle and ends its answer with an error
(see :mod:`.worker`), so every open response completes within the wait and none is cut off mid-stream.
"""

from __future__ import annotations

import signal
import socket
from types import FrameType
from typing import Callable, Optional

import uvicorn

from .worker import log

GRACE_S = 5


class Server(uvicorn.Server):
    """uvicorn's server, with ``on_shutdown`` called once a signal asks it to stop, before it
    waits for the open connections; :attr:`signals` holds the signals it received."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown
        self.signals: list[int] = []

    def handle_exit(self, sig: int, frame: Optional[FrameType]) -> None:
        self.signals.append(sig)
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
        if self.signals:
            log(f"shutting down ({signal.Signals(self.signals[0]).name})")
        self.on_shutdown()
        await super().shutdown(sockets)
        if self.force_exit:   # a second Ctrl-C skipped the wait and the app's shutdown: the engine
            await self.lifespan.shutdown()   # thread still ends before the process does


def run(app, sock: socket.socket, *, verbose: bool, on_shutdown: Callable[[], None],
        on_exit: Callable[[], None]) -> Optional[int]:
    """Serve ``app`` on ``sock`` until a signal; the signal that stopped it (None: none did).
    ``on_shutdown``: at the start of the shutdown; ``on_exit``: once the server has stopped (also
    after a second Ctrl-C, which skips uvicorn's wait and the app's lifespan shutdown)."""
    # no uvicorn access log: the request log (request_log) has a line per request
    config = uvicorn.Config(app, log_level="info" if verbose else "warning", access_log=False,
                            timeout_graceful_shutdown=GRACE_S, lifespan="on")
    server = Server(config, on_shutdown)
    # After its shutdown uvicorn raises the signal it caught once more, under the handler it found
    # (inside the event loop, where a KeyboardInterrupt would cut the app's tasks off, and SIGTERM's
    # default would end the process before the engine is closed): it finds handle_exit instead.
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:   # a Ctrl-C before uvicorn took the signal over
        server.signals.append(signal.SIGINT)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        on_exit()
    return server.signals[0] if server.signals else None
