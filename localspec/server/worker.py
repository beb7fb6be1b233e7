"""The engine thread: the engine's slots fed from a bounded queue, events bridged to asyncio.

The engine is single-threaded (one llama.cpp context); its :class:`~localspec.runtime.scheduler.Scheduler`
runs up to ``--parallel`` generations in one batch per step. Handlers :meth:`EngineWorker.submit` a
:class:`Job`; a full queue refuses it at once (429). Queued jobs take free slots in arrival order.
The engine thread posts what happens to the job's asyncio queue through its loop's :class:`_Mailbox`
(one ``loop.call_soon_threadsafe`` wake-up for all a step posts; a stream's later text waits up to
``--stream-interval-ms`` for the next, so that its chunks carry a few tokens each):
:class:`Started` (the prompt fits, tokens follow), :class:`Text`, then :class:`Finished` or
:class:`Failed`. Setting ``job.cancel`` (the client went away) makes its slot stop at the next
step (the other slots go on), or skips the job if it is still queued.

On shutdown :meth:`EngineWorker.abort` refuses new jobs and queued ones (503), and stops the
running ones at their next step: each ends with a 503 error (a stream: an error event before
``[DONE]``), and the log gets one line per request cut or refused.
"""

from __future__ import annotations

import asyncio
import math
import queue
import sys
import threading
import time
import traceback
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

from ..formats.chat_format import Message
from ..runtime.engine import Engine, GenerationConfig, PromptTooLong
from ..runtime.prompt_cache import PromptCache
from ..runtime.scheduler import SlotFailed
from ..core.errors import GrammarError, LocalspecError
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


class _Mailbox:
    """Items from the engine thread to one event loop's queues. An item posted while no wake-up is
    on its way wakes the loop (``call_soon_threadsafe``: a write to its self-pipe); those posted
    before it runs ride along, in order. During a scheduler step the posts are held
    (:func:`held_posts`) and the loop is woken once at its end: a step of 4 slots wakes it once,
    and the loop never takes the GIL between two slots' settles (docs/server.md). An item posted
    with ``defer`` (a stream's text after its first) may wait at a step's end until that long after
    the last wake-up: the loop then sends every stream one chunk per wake-up, not one per step
    (each chunk costs the loop ~0.25 ms of Python, taken from llama.cpp's cores on a small CPU)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: list[tuple[asyncio.Queue, object]] = []
        self.lock = threading.Lock()
        self.woken = False    # a wake-up is on its way: what is posted now rides along
        self.held = False     # a step is running: wake at its end (release)
        self.woke_at = 0.0    # time.monotonic() of the last wake-up
        self.due = math.inf   # when the items held must reach the loop (0: at the step's end)

    def post(self, events: asyncio.Queue, item, defer: float = 0.0) -> None:
        with self.lock:
            self.items.append((events, item))
            self.due = min(self.due, self.woke_at + defer if defer > 0 else 0.0)
            if self.woken or self.held:
                return
            self._woken()
        self._wake()

    def release(self, *, force: bool = False) -> None:
        """A step ended (or, ``force``, the engine goes idle): wake the loop for what is held,
        unless all of it may wait for a later step's end."""
        with self.lock:
            self.held = False
            if self.woken or not self.items or (not force and time.monotonic() < self.due):
                return
            self._woken()
        self._wake()

    def _woken(self) -> None:
        """A wake-up is on its way (under the lock): what is posted until it runs rides along."""
        self.woken, self.woke_at, self.due = True, time.monotonic(), math.inf

    def _wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:   # the loop is closed (shutdown): nobody is listening
            pass

    def _drain(self) -> None:
        with self.lock:
            items, self.items, self.woken = self.items, [], False
        for events, item in items:
            events.put_nowait(item)


_mailboxes: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox]" = weakref.WeakKeyDictionary()
_mailboxes_lock = threading.Lock()   # a loop's first job adds its mailbox while the engine thread lists them


def flush_posts() -> None:
    """Wake every loop that holds items (the engine thread goes idle: no step will end to do it)."""
    with _mailboxes_lock:
        boxes = list(_mailboxes.values())
    for box in boxes:
        box.release(force=True)


@contextmanager
def held_posts() -> Iterator[None]:
    """Hold every loop's posts while the block runs (the engine thread's step), then wake each
    loop that has items once."""
    with _mailboxes_lock:
        boxes = list(_mailboxes.values())
    for box in boxes:
        with box.lock:
            box.held = True
    try:
        yield
    finally:
        for box in boxes:
            box.release()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _Mailbox:
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = _Mailbox(loop)
    return box


class Job:
    """One request's generation. Create it on the event loop that will read ``events``."""

    def __init__(self, prompt: str | Sequence[Message], config: GenerationConfig, *, param: str,
                 id: str = "request", grammar_param: str = "response_format") -> None:
        self.prompt = prompt
        self.config = config
        self.param = param                      # the request field holding the prompt, for errors
        self.grammar_param = grammar_param      # the request field the grammar came from, for its errors
        self.id = id                            # the answer's id, for the log
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self._mailbox = _mailbox(self.loop)
        self.cancel = threading.Event()
        self.shutdown = False                   # cancelled by the server's shutdown, not by the client
        self.finish_of = None                   # DoneEvent -> the finish reason /metrics counts (tool_calls)
        self.finished: Finished | None = None   # the end, once posted (the request log reads it)
        self.tokens: list[int] | None = None     # the prompt's tokens, once prepared off the engine thread
        self.stream_interval = 0.0              # seconds a text after the first may wait (EngineWorker.submit)
        self._texted = False                    # a text was posted (the first goes at once)

    def post(self, item) -> None:
        if isinstance(item, Finished):
            self.finished = item
        defer = 0.0
        if type(item) is Text:
            defer, self._texted = (self.stream_interval if self._texted else 0.0), True
        self._mailbox.post(self.events, item, defer)


class _Sink:
    """Where one job's events go: text to its client, the spec counters, the end."""

    def __init__(self, worker: "EngineWorker", job: Job) -> None:
        self.worker, self.job = worker, job
        self.drafts = 0

    def __call__(self, event) -> None:
        job = self.job
        if isinstance(event, TokenEvent):
            logprobs = event.logprobs if job.config.logprobs is not None else ()
            if event.text or logprobs:
                job.post(Text(event.text, logprobs))
        elif isinstance(event, CycleEvent):
            if event.drafted:
                self.drafts += 1
        elif isinstance(event, DoneEvent):
            self.worker._finished(job, event, self.drafts)
        elif isinstance(event, SlotFailed):   # this request alone failed; the other slots go on
            self.worker._failed(job, event.error)


class EngineWorker:
    """The engine thread: admits queued jobs into the scheduler's free slots (FIFO) and steps it."""

    def __init__(self, engine: Engine, metrics_factory, *, queue_size: int, cache_bytes: int = 0,
                 stream_interval: float = 0.0) -> None:
        if queue_size < 1:
            raise LocalspecError("--queue-size must be at least 1")
        self.engine = engine
        self.queue_size = queue_size
        self.stream_interval = stream_interval   # seconds (see Job.post, _Mailbox)
        self.scheduler = engine.scheduler(prompt_cache=PromptCache(cache_bytes) if cache_bytes > 0 else None)
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self._running: list[Job] = []
        self._closing = False
        self._ending = False           # stop() queued its sentinel: end once the slots are empty
        self._readers = 0                    # grammar checks and tokenizations reading the model now
        self._read_done = threading.Condition()
        self.metrics: ServerMetrics = metrics_factory(running=self.running_count, waiting=self.waiting_count)
        self._thread = threading.Thread(target=self._run, name="localspec-engine", daemon=True)

    # -- state, for metrics and /health --
    def running_count(self) -> int:
        return len(self._running)

    def waiting_count(self) -> int:
        return self._queue.qsize()

    @property
    def closing(self) -> bool:
        """Shutdown has begun (:meth:`abort`)."""
        return self._closing

    # -- life --
    def start(self) -> None:
        self._thread.start()

    async def check(self, job: Job) -> None:
        """Compile ``job``'s grammar on a thread of its own, not the engine's (the slots go on
        meanwhile), and refuse the job now (400, naming the field the grammar came from) when it
        is beyond the grammar limits, not valid, or allows no text at all; before anything streams."""
        config = job.config
        if config.grammar is None or self._closing:
            return

        try:
            await asyncio.to_thread(self._reading, self.engine.check_grammar, config.grammar, config.grammar_triggers)
        except LocalspecError as exc:
            raise bad_request(str(exc), param=job.grammar_param) from None

    async def prepare(self, job: Job) -> None:
        """Render and tokenize ``job``'s prompt (and its prediction) on a thread of its own, not the
        engine's (the slots go on meanwhile: a long text full of special tokens costs no other
        client anything), and refuse it now (400) when it is empty or longer than the context."""
        if self._closing:
            return
        try:
            job.tokens = await asyncio.to_thread(self._reading, self.engine.prepare, job.prompt,
                                                 parse_special=job.config.parse_special)
        except PromptTooLong as exc:
            raise context_overflow(str(exc), job.param) from None
        except LocalspecError as exc:
            raise bad_request(str(exc), param=job.param) from None
        config = job.config
        if config.prediction is not None and config.prediction_tokens is None:
            try:
                predicted = await asyncio.to_thread(self._reading, self.engine.prediction_tokens, config.prediction)
            except LocalspecError as exc:
                raise bad_request(str(exc), param="prediction") from None
            if predicted is not None:
                job.config = replace(config, prediction_tokens=predicted)

    def _reading(self, call, *args, **kwargs):
        """``call`` while the model stays open: stop() waits for every reader (many may read at once)."""
        with self._read_done:
            if self._closing:
                return None
            self._readers += 1
        try:
            return call(*args, **kwargs)
        finally:
            with self._read_done:
                self._readers -= 1
                self._read_done.notify_all()

    def submit(self, job: Job) -> None:
        if self._closing:
            raise shutting_down()
        job.stream_interval = self.stream_interval
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.metrics.rejected.inc()
            raise queue_full(self.queue_size) from None

    def abort(self) -> None:
        """Shutdown begins: refuse new and queued jobs (503), stop the running ones at their next cycle."""
        self._closing = True
        for running in list(self._running):
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
        if self._thread.is_alive():
            return False
        with self._read_done:   # no grammar check or tokenization reads the model now, and none starts (closing)
            return self._read_done.wait_for(lambda: self._readers == 0, timeout)

    def _run(self) -> None:
        scheduler = self.scheduler
        while True:
            # FIFO: queued jobs take the free slots in arrival order; wait only while no slot runs
            while scheduler.free and not self._ending:
                try:
                    job = self._queue.get(block=scheduler.active == 0)
                except queue.Empty:
                    break
                if job is None:
                    self._ending = True
                    break
                self._admit(job)
            if scheduler.active:
                self._step()
                if not scheduler.active:
                    flush_posts()   # every end is posted at once anyway; nothing may wait for a next step
            elif self._ending:
                return

    def _admit(self, job: Job) -> None:
        if job.cancel.is_set():          # the client left while its request waited
            self.metrics.record(None, 0, "cancelled")
            job.post(Failed(APIError(499, "The client closed the request.", code="client_closed_request")))
            return
        if self._closing:                # taken from the queue just as the shutdown drained it
            log(f"shutting down: refused {job.id}, which was waiting")
            job.post(Failed(shutting_down()))
            return
        try:
            tokens = job.tokens if job.tokens is not None else \
                self.engine.prepare(job.prompt, parse_special=job.config.parse_special)
        except PromptTooLong as exc:
            job.post(Failed(context_overflow(str(exc), job.param)))
            return
        except LocalspecError as exc:
            job.post(Failed(bad_request(str(exc), param=job.param)))
            return
        job.tokens = tokens   # Ollama's context answers with them
        job.post(Started(len(tokens)))
        self._running.append(job)
        try:
            self.scheduler.admit(tokens, job.config, job.cancel, _Sink(self, job))
        except Exception as exc:   # e.g. a grammar llama.cpp refuses: this request only
            self._failed(job, exc)

    def _failed(self, job: Job, exc: BaseException) -> None:
        """``job`` alone failed (its admission, or its slot's part of a step): one error to its
        client (a LocalspecError names the field it came from), the traceback of a bug to the log."""
        if job in self._running:
            self._running.remove(job)
        if isinstance(exc, LocalspecError):
            job.post(Failed(bad_request(str(exc), param=job.grammar_param if isinstance(exc, GrammarError)
                                        else job.param)))
        else:
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            job.post(Failed(internal()))

    def _step(self) -> None:
        """One scheduler step; a failure ends every running job with an error (the traceback of
        a bug to the server's log only)."""
        try:
            with held_posts():
                self.scheduler.step()
        except LocalspecError as exc:
            message = str(exc)   # bound here: the name exc ends with this block
            self._fail_all(lambda job: bad_request(message, param=job.param))
        except Exception:
            traceback.print_exc(file=sys.stderr)
            self._fail_all(lambda job: internal())

    def _fail_all(self, error) -> None:
        self.scheduler.cancel_all()
        for job in self._running:
            job.post(Failed(error(job)))
        self._running.clear()

    def _finished(self, job: Job, done: DoneEvent, drafts: int) -> None:
        if job in self._running:
            self._running.remove(job)
        self.metrics.record(done.stats, drafts, job.finish_of(done) if job.finish_of else done.finish_reason)
        if job.shutdown and done.finish_reason == "cancelled":
            n = done.stats.generated_tokens
            after = f"after {n} generated token{'' if n == 1 else 's'}"
            log(f"shutting down: stopped {job.id} {after}")
            job.post(Failed(shutting_down(f"The server is shutting down: the generation was stopped {after}.")))
            return
        job.post(Finished(done, drafts))


def log(line: str) -> None:
    print(f"localspec serve: {line}", file=sys.stderr, flush=True)
