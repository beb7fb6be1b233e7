"""The engine thread: one generation at a time from a bounded queue, events bridged to asyncio.

The engine is single-threaded (one llama.cpp context). Handlers :meth:`EngineWorker.submit` a
:class:`Job`; a full queue refuses it at once (429). The engine thread posts what happens to the
job's asyncio queue with ``loop.call_soon_threadsafe``: :class:`Started` (the prompt fits, tokens
follow), :class:`Text`, then :class:`Finished` or :class:`Failed`. Setting ``job.cancel`` (the
client went away) makes the engine stop at its next cycle, or skips the job if it is still queued.

On shutdown :meth:`EngineWorker.abort` refuses new jobs and queued ones (503), and stops the
running one at its next cycle: it ends with a 503 error (a stream: an error event before
``[DONE]``), and the log gets one line per request cut or refused.
"""

from __future__ import annotations

import asyncio
import queue
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Sequence

from ..formats.chat_format import Message
from ..runtime.engine import Engine, GenerationConfig, PromptTooLong
from ..core.errors import LocalspecError
from ..core.events import CycleEvent, DoneEvent, TokenEvent
from .errors import APIError, bad_request, context_overflow, internal, queue_full, shutting_down
from .metrics import ServerMetrics


@dataclass(frozen=True)
class Started:
    prompt_tokens: int


@dataclass(frozen=True)
class Text:
    text: str
    logprobs: tuple = ()     # the tokens' TokenLogprob entries, when the request asked for logprobs


@dataclass(frozen=True)
class Finished:
    done: DoneEvent
    drafts: int        # verification cycles that carried drafts (vLLM's num_drafts)


@dataclass(frozen=True)
class Failed:
    error: APIError


class Job:
    """One request's generation. Create it on the event loop that will read ``events``."""

    def __init__(self, prompt: str | Sequence[Message], config: GenerationConfig, *, param: str,
                 id: str = "request") -> None:
        self.prompt = prompt
        self.config = config
        self.param = param                      # the request field holding the prompt, for errors
        self.id = id                            # the answer's id, for the log
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancel = threading.Event()
        self.shutdown = False                   # cancelled by the server's shutdown, not by the client

    def post(self, item) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:   # the loop is closed (shutdown): nobody is listening
            pass


class EngineWorker:
    def __init__(self, engine: Engine, metrics_factory, *, queue_size: int) -> None:
        if queue_size < 1:
            raise LocalspecError("--queue-size must be at least 1")
        self.engine = engine
        self.queue_size = queue_size
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self._running: Job | None = None
        self._closing = False
        self.metrics: ServerMetrics = metrics_factory(running=self.running_count, waiting=self.waiting_count)
        self._thread = threading.Thread(target=self._run, name="localspec-engine", daemon=True)

    # -- state, for metrics and /health --
    def running_count(self) -> int:
        return 1 if self._running is not None else 0

    def waiting_count(self) -> int:
        return self._queue.qsize()

    @property
    def closing(self) -> bool:
        """Shutdown has begun (:meth:`abort`)."""
        return self._closing

    # -- life --
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        if self._closing:
            raise shutting_down()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.metrics.rejected.inc()
            raise queue_full(self.queue_size) from None

    def abort(self) -> None:
        """Shutdown begins: refuse new and queued jobs (503), stop the running one at its next cycle."""
        self._closing = True
        running = self._running
        if running is not None:
            running.shutdown = True
            running.cancel.set()
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None and not job.cancel.is_set():
                job.shutdown = True
                job.cancel.set()
                log(f"shutting down: refused {job.id}, which was waiting")
                job.post(Failed(shutting_down()))

    def stop(self, timeout: float = 10.0) -> bool:
        """:meth:`abort`, then end the thread; False if it has not ended in ``timeout``."""
        self.abort()
        if not self._thread.is_alive():
            return True
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            self._running = job
            try:
                self._serve(job)
            finally:
                self._running = None

    def _serve(self, job: Job) -> None:
        if job.cancel.is_set():          # the client left while its request waited
            self.metrics.record(None, 0, "cancelled")
            job.post(Failed(APIError(499, "The client closed the request.", code="client_closed_request")))
            return
        if self._closing:                # taken from the queue just as the shutdown drained it
            log(f"shutting down: refused {job.id}, which was waiting")
            job.post(Failed(shutting_down()))
            return
        try:
            tokens = self.engine.prepare(job.prompt, parse_special=job.config.parse_special)
        except PromptTooLong as exc:
            job.post(Failed(context_overflow(str(exc), job.param)))
            return
        except LocalspecError as exc:
            job.post(Failed(bad_request(str(exc), param=job.param)))
            return
        job.post(Started(len(tokens)))
        self._generate(job, tokens)

    def _generate(self, job: Job, tokens: list[int]) -> None:
        drafts = 0
        done: DoneEvent | None = None
        try:
            for event in self.engine.generate(tokens, job.config, cancel=job.cancel):
                if isinstance(event, TokenEvent):
                    logprobs = event.logprobs if job.config.logprobs is not None else ()
                    if event.text or logprobs:
                        job.post(Text(event.text, logprobs))
                elif isinstance(event, CycleEvent):
                    if event.drafted:
                        drafts += 1
                elif isinstance(event, DoneEvent):
                    done = event
        except LocalspecError as exc:
            job.post(Failed(bad_request(str(exc), param=job.param)))
            return
        except Exception:  # a bug: one answer to the client, the traceback to the server's log only
            traceback.print_exc(file=sys.stderr)
            job.post(Failed(internal()))
            return
        assert done is not None
        self.metrics.record(done.stats, drafts, done.finish_reason)
        if job.shutdown and done.finish_reason == "cancelled":
            n = done.stats.generated_tokens
            after = f"after {n} generated token{'' if n == 1 else 's'}"
            log(f"shutting down: stopped {job.id} {after}")
            job.post(Failed(shutting_down(f"The server is shutting down: the generation was stopped {after}.")))
            return
        job.post(Finished(done, drafts))


def log(line: str) -> None:
    print(f"localspec serve: {line}", file=sys.stderr, flush=True)
