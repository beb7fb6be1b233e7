"""The llama.cpp thread count, fitted to the cores other processes leave free.

llama.cpp's worker threads spin while they wait for each other, so more threads than free cores
is far slower than fewer (docs/speculation.md, "Threads under load"). When the user gave no
thread count (no ``--threads``, no ``$LOCALSPEC_THREADS``), :class:`ThreadController` checks, at
most every ``CHECK_SECONDS`` between cycles, how much CPU the other processes used (/proc/stat's
busy time minus this process's own CPU time) and lowers the count while they take a core, raising
it again when they leave (a band between ``RAISE_BELOW`` and ``LOWER_ABOVE`` keeps it from
flapping; lowering needs two readings in a row, or one over a second or more; raising needs
``RAISE_SECONDS`` of low readings: a thread too many costs far more than one too few). An explicit
count is the user's and never changes.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable, Protocol

CHECK_SECONDS = 0.3   # at most one reading per this many seconds
LOWER_ABOVE = 0.3     # a core counts as taken when other processes use more than this of it ...
RAISE_BELOW = 0.15    # ... and as free again below this
TRUST_SECONDS = 1.0   # one reading over at least this long lowers the count alone ...
RAISE_SECONDS = 2.0   # ... while raising it needs this long of low readings (flapping up costs more)
MIN_SPAN = 0.05       # a reading over less time says too little


class Usage(Protocol):
    def sample(self) -> tuple[float, float] | None:
        """(cores other processes kept busy, seconds) since the last sample; None: unknown."""


class ProcStatUsage:
    """Other processes' CPU use: the machine's busy time (/proc/stat) minus this process's own."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        try:
            with open(self.path, "rb") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if len(fields) < 8 or fields[0] != b"cpu":
            return None
        # user nice system idle iowait irq softirq steal: busy is all but idle and iowait
        v = [int(x) for x in fields[1:9]]
        busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / self._tick
        return time.monotonic(), busy, time.process_time()

    def sample(self) -> tuple[float, float] | None:
        now, last = self._read(), self._last
        self._last = now
        if now is None or last is None or now[0] <= last[0]:
            return None
        span = now[0] - last[0]
        other = (now[1] - last[1]) - (now[2] - last[2])
        return max(other, 0.0) / span, span


def fitting(cores: int, other: float, threshold: float, n_max: int) -> int:
    """Threads that fit beside ``other`` busy cores, a core counting as taken above ``threshold``."""
    return max(1, min(n_max, cores - max(0, math.ceil(other - threshold))))


class ThreadController:
    """Follows the free cores: ``tick()`` between cycles; ``apply(n)`` sets the new count."""

    adapts = True

    def __init__(self, n_max: int, apply: Callable[[int], None], usage: Usage, *,
                 cores: int | None = None, interval: float = CHECK_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.n_max = self.n = n_max
        self.cores = cores or os.cpu_count() or n_max
        self.apply = apply
        self.usage = usage
        self.interval = interval
        self.clock = clock
        self._next = clock() + interval
        self._pending: int | None = None      # a lower count one reading asked for
        self._low_since: float | None = None  # since when readings would allow a higher count
        self.changes = 0

    def tick(self, *, start: bool = False) -> None:
        """Between cycles; ``start``: a generation starts (read now unless the last reading is
        under ``MIN_SPAN`` old, so calibration and prefill run on the right count)."""
        now = self.clock()
        if now < (self._next - self.interval + MIN_SPAN if start else self._next):
            return
        self._next = now + self.interval
        reading = self.usage.sample()
        if reading is None:
            return
        other, span = reading
        down = fitting(self.cores, other, LOWER_ABOVE, self.n_max)
        up = fitting(self.cores, other, RAISE_BELOW, self.n_max)
        if down < self.n:     # fast: a thread too many costs several times its worth
            self._low_since = None
            if span >= TRUST_SECONDS or down == self._pending:
                self._change(down)
            else:
                self._pending = down
        elif up > self.n:     # slow: readings low for RAISE_SECONDS in a row
            self._pending = None
            if self._low_since is None:
                self._low_since = now - span
            if now - self._low_since >= RAISE_SECONDS:
                self._change(up)
        else:
            self._pending = self._low_since = None

    def _change(self, n: int) -> None:
        self._pending = self._low_since = None
        self.n = n
        self.changes += 1
        self.apply(n)


class FixedThreads:
    """The user's thread count: nothing to adapt."""

    changes = 0
    adapts = False   # a scheduler need not call tick() each step

    def tick(self, *, start: bool = False) -> None:
        pass


def adaptive(n_max: int, n_threads: int | None, apply: Callable[[int], None]) -> ThreadController | FixedThreads:
    """Adaptive threads, up to ``n_max`` (the count the engine's contexts were made with; ``apply(n)``
    sets a new one), unless the user chose a count (``n_threads``, or ``$LOCALSPEC_THREADS``) or
    there is nothing to adapt (one thread, no /proc/stat)."""
    if n_threads or os.environ.get("LOCALSPEC_THREADS") or n_max < 2:
        return FixedThreads()
    usage = ProcStatUsage()
    if usage._last is None:
        return FixedThreads()
    return ThreadController(n_max, apply, usage)
