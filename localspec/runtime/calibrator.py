"""Calibration in the background: the cost model measured while the engine is idle, never in a reply.

A fresh machine (no entry in ``user_dir()/calibration.json`` for these files and settings) used to
pay the calibration inside its first request: up to ``cost_measure.BUDGET_SECONDS`` of target
decodes before the first token (a 24-token ``generate`` took 69.8 s on a fresh home against 20.2 s
warm on a busy machine). Now:

- at load (``Engine.calibrate_in_background``, which the CLI, the chat and ``serve`` call) a cached
  calibration is read at once; without one, a thread calibrates on the engine's contexts whenever
  no generation holds the engine (it takes the engine's lock, as a generation does);
- a generation that arrives meanwhile takes the engine back at the calibration's next decode (the
  harness stops between decodes, :func:`.calibration.calibrate`'s ``cancel``) and plans with what
  exists: the sizes measured so far (an interrupted calibration, this engine only), else a guess
  (:func:`localspec.speculation.costmodel.prior`) that its own cycles correct;
- the calibration starts again once the engine has been idle for ``IDLE_SECONDS``, until one
  completes; that one is cached, as before, and replaces the engine's model between generations;
- one cut by its time budget or taken while another process held the cores
  (:func:`localspec.speculation.cost_measure.trusted`) serves this engine uncached, and is taken
  again after ``BUSY_RETRY_SECONDS`` (``BUSY_TRIES`` in all): cached, its stalls would steer every
  later start (a curve with V(5) > V(6) made 4 slots draft where plain decoding was faster).

``$LOCALSPEC_CALIBRATION=off`` turns the background calibration off (a shared or battery-powered
machine, a test suite): a cached calibration is still read, and without one the engine plans with
the guess its cycles correct; ``localspec bench`` still calibrates (it asks for the model itself).

``state`` (one of ``STATES``) and :meth:`Calibrator.describe` are what the chat's status line and
``serve``'s log show; ``log`` lists what happened, in order (tests read it).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from ..core import options
from ..speculation import costmodel

IDLE_SECONDS = 0.5    # the engine idle this long before a calibration (re)starts: not between two requests
RETRY_SECONDS = 2.0   # after an interrupted one, at least this long before the next try
BUSY_RETRY_SECONDS = 60.0   # after one taken on a busy machine (not cached), this long before the next ...
BUSY_TRIES = 3              # ... up to this many calibrations in all: the machine may stay busy
ENV = "LOCALSPEC_CALIBRATION"   # "background" (the default) or "off"
STATES = ("off", "cached", "waiting", "running", "interrupted", "done", "budget", "failed")


def in_background() -> bool:
    """Whether calibrations may run in the background (``$LOCALSPEC_CALIBRATION``)."""
    return options.env_choice(ENV, ("background", "off"), "background") == "background"


class _Stop:
    """``is_set()``: a generation wants the engine, or the engine is closing."""

    def __init__(self, *events: threading.Event) -> None:
        self.events = events

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


class Calibrator:
    """The engine's calibration thread. ``measure(cancel)`` returns what
    :func:`.calibration.calibrate` does; ``install(model, complete)`` gives the engine its new
    model (called with the engine's lock held); ``claims`` guards who holds the engine's lock."""

    def __init__(self, lock: threading.Lock, measure: Callable, install: Callable,
                 make_model: Callable, on_change: Callable[[str], None] | None = None) -> None:
        self._lock = lock                  # the engine's: a generation or the calibration holds it
        self._claims = threading.Lock()    # holding and the lock change together under this
        self._measure, self._install, self._make_model = measure, install, make_model
        self._wanted = threading.Event()   # a generation waits for the engine
        self._closing = threading.Event()
        self._ended = threading.Event()    # a calibration ended with figures for the engine, or failed
        self._thread: threading.Thread | None = None
        self.holding = False               # the calibration holds the engine's lock now
        self.state = "off"
        self.runs = 0                      # calibrations started (each empties sequence 0 and the drafter's)
        self.released_at = time.monotonic()
        self.log: list[str] = []
        self.listeners: list[Callable[[str], None]] = [on_change] if on_change is not None else []

    # -- the engine's side --------------------------------------------------------------------
    def start(self) -> None:
        """Calibrate in the background until one calibration completes (idempotent); nothing
        with ``$LOCALSPEC_CALIBRATION=off``."""
        if self.state in ("cached", "done") or self._closing.is_set() or not in_background():
            return
        if self._thread is None or not self._thread.is_alive():
            self._set("waiting")
            self._thread = threading.Thread(target=self._main, name="localspec-calibration", daemon=True)
            self._thread.start()

    def acquire(self) -> bool:
        """Take the engine for a generation: at once when it is free; when the calibration holds
        it, once the calibration has stopped at its next decode. False: a generation holds it."""
        if self._lock.acquire(blocking=False):
            return True
        with self._claims:
            if not self.holding:
                return False
            self._wanted.set()
        try:
            self._lock.acquire()
        finally:
            self._wanted.clear()
        return True

    def release(self) -> None:
        """A generation gives the engine back."""
        self.released_at = time.monotonic()
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a calibration to end (complete, given up, or measured on a busy machine: its
        retry a minute later is not waited for); whether one has."""
        thread = self._thread
        deadline = None if timeout is None else time.monotonic() + timeout
        while thread is not None and thread.is_alive() and not self._ended.is_set():
            if deadline is not None and time.monotonic() > deadline:
                return False
            self._ended.wait(0.05)
        return True

    def close(self) -> None:
        """Stop the thread (at its next decode) before the contexts go."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def busy(self) -> bool:
        return self.state in ("waiting", "running", "interrupted")

    def describe(self) -> str:
        """One line for a status bar or a log."""
        return {"off": "", "cached": "calibrated (cached)", "waiting": "calibration pending (drafting on a guess)",
                "running": "calibrating in the background", "done": "calibrated",
                "interrupted": "calibration paused for a request (drafting on a guess)",
                "budget": "calibrated on a busy machine (not cached)",
                "failed": "calibration failed (drafting on a guess)"}[self.state]

    # -- the thread -----------------------------------------------------------------------------
    def _set(self, state: str) -> None:
        self.state = state
        self.log.append(state)
        if state in ("done", "budget", "failed"):
            self._ended.set()
        for listener in list(self.listeners):
            try:
                listener(state)
            except Exception:   # a status line that cannot be drawn stops no calibration
                pass

    def _main(self) -> None:
        while not self._closing.is_set():
            if time.monotonic() - self.released_at < IDLE_SECONDS or not self._take():
                self._closing.wait(0.05)
                continue
            try:
                complete, stopped = self._run()
            except Exception:   # e.g. a context that cannot decode the calibration's batch
                self._release()
                self._set("failed")
                return
            self._release()
            if complete:
                self._set("done")
                return
            if not stopped:   # a busy machine: what it measured serves until a later one is trusted
                self._set("budget")
                if self.log.count("budget") >= BUSY_TRIES:
                    return
                self.released_at = max(self.released_at, time.monotonic() + BUSY_RETRY_SECONDS - IDLE_SECONDS)
                continue
            self._set("interrupted")
            self.released_at = max(self.released_at, time.monotonic() + RETRY_SECONDS - IDLE_SECONDS)

    def _take(self) -> bool:
        with self._claims:
            if self._wanted.is_set() or not self._lock.acquire(blocking=False):
                return False
            self.holding = True
            return True

    def _release(self) -> None:
        with self._claims:
            self.holding = False
            self._lock.release()

    def _run(self) -> tuple[bool, bool]:
        """One calibration, the engine's lock held; its model installed if it measured more than a
        one-token step. (Whether it completed, whether a generation or the close stopped it.)"""
        stop = _Stop(self._wanted, self._closing)
        if stop.is_set():
            return False, True
        self._set("running")
        self.runs += 1
        verify, drafter_step, drafter_width, complete = self._measure(stop)
        if complete or len(verify) >= 3:
            model: costmodel.CostModel = self._make_model(verify, drafter_step, drafter_width, complete)
            # cut by its time budget: measured figures (not a guess), though not cached
            model.provisional = model.provisional and stop.is_set()
            self._install(model, complete)
        return complete, stop.is_set()
