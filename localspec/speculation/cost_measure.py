"""Measuring what a cycle costs: timed runs of a target decode (or a drafter step) by batch size,
each against the one-token steps around it (:func:`measure_runs`), made robust (:func:`robust_costs`)
and fitted to a monotone, plausible curve (:func:`fit_curve`, :func:`plausible`, :func:`check_curve`).

``runtime.calibration`` runs it on the engine's contexts; the live model
(:mod:`.costmodel`) plans with the result and :mod:`.cost_cache` keeps it per machine and files.
"""

from __future__ import annotations

import math
import time
from typing import Callable

CALIBRATE_MAX = 17     # batch sizes measured at load: every one of 1..17 (auto weighs every depth to 16)
# measured too: deep drafts (long lookup matches, up to 128 tokens) interpolate between measured
# sizes instead of extrapolating. CPU costs are not smooth: llama.cpp's flash attention switches to
# a tiled kernel at 64 query rows (GGML_FA_TILE_Q), so on this project's CPU V(64) ~ V(32) while
# V(63) ~ 2 V(64): 56 and 63 pin the step, and a draft may be padded up to a cheaper size (PAD_GAIN)
EXTRA_SIZES = (24, 32, 48, 56, 63, 64, 72, 96, 128)
REPEATS = 3            # timed runs per size up to 9 ...
REPEATS_MID = 3        # ... per size up to 32 ...
REPEATS_LARGE = 3      # ... and above (each costs 15-40 plain steps); each run taken over the one-token
                       # steps timed around it (a slow spell of the machine slows both), a size's figure
                       # the lowest third of its runs (robust_costs): the fastest of 1-3 runs gave two
                       # calibrations of one file on one idle machine V(4) / V(1) of 3.3 and 8.3
EXTRA_ROUNDS = 4       # ... and up to 4 more runs for a size whose two best disagree by more than
SPREAD = 1.25          # this (a decode slowed by another process, a reference slowed alone)
BUDGET_SECONDS = 12.0  # calibration stops here (the sizes measured so far; not cached)
# by this much (llama.cpp's CPU flash attention: V(64) ~ 0.5 V(63)); elsewhere a dip is noise, pooled
DROP = 0.8
KERNEL_MIN = 32        # ... and only from this many rows: a drop below it is a stall of the sizes before
                       # it (a calibration on a busy machine gave V(13) = 115 ms, V(14) = 84 ms)
UNSETTLED = 0.15       # more sizes than this share still unsettled after every extra round: a busy
                       # machine (idle: none; beside another 2-thread process, 7 and 8 of 26 sizes)
# a cached curve is corrupt (dropped, calibrated again) when between two measured sizes a < b ...
FLOOR = 0.3            # ... V(b) < FLOOR * V(a) (more rows never cost a third of fewer), or ...
CEIL = 2.0             # ... V(b) / V(a) > CEIL * b / a (a row never costs twice what it costs in a
                       # smaller batch), or a figure lies outside [MIN_SECONDS, MAX_SECONDS]
MIN_SECONDS, MAX_SECONDS = 1e-7, 600.0


def measure(run: Callable[[int], None], sizes, repeats: int = REPEATS,
            stop: Callable[[], bool] | None = None, settle: Callable[[], None] | None = None) -> dict[int, float]:
    """Seconds of ``run(b)`` for each batch size, robust and fitted: :func:`measure_runs`, then
    :func:`curve`."""
    return curve(measure_runs(run, sizes, repeats, stop, settle))


def curve(runs: dict[int, list[tuple[float, float | None]]]) -> dict[int, float]:
    """The seconds by batch size that runs of :func:`measure_runs` give: :func:`robust_costs`,
    :func:`fit_curve` and :func:`plausible`."""
    return plausible(fit_curve(robust_costs(runs)))


def planned(b: int, repeats: int = REPEATS) -> int:
    """The timed runs :func:`measure_runs` plans for a batch of ``b`` (fewer above 9 and 32 rows)."""
    return repeats if b <= 9 else min(repeats, REPEATS_MID if b <= 32 else REPEATS_LARGE)


def trusted(runs: dict[int, list[tuple[float, float | None]]], sizes, repeats: int = REPEATS) -> str | None:
    """Why these runs cannot be cached as this machine's figures (None: they can): a size without
    every run planned for it (a calibration cut by its time budget: a size measured once has its
    stall for a figure), or over ``UNSETTLED`` of the sizes whose runs still disagree after every
    extra round (:func:`_unsettled`: another process preempting llama.cpp's threads, which stalls
    a batch for seconds while one-token steps pass, so no reference corrects it)."""
    sizes = list(sizes)
    short = [b for b in sizes if len(runs.get(b, ())) < planned(b, repeats)]
    if short:
        return f"{len(short)} of {len(sizes)} batch sizes not measured in full"
    unsettled = [b for b in sizes if _unsettled(runs[b])]
    if len(unsettled) > UNSETTLED * len(sizes):
        return f"{len(unsettled)} of {len(sizes)} batch sizes timed inconsistently: a busy machine"
    return None


def measure_runs(run: Callable[[int], None], sizes, repeats: int = REPEATS,
                 stop: Callable[[], bool] | None = None,
                 settle: Callable[[], None] | None = None) -> dict[int, list[tuple[float, float | None]]]:
    """Timed runs of ``run(b)`` for each batch size: ``{b: [(seconds, reference), ...]}``,
    ``repeats`` of them (fewer above 9 and 32 rows) and up to ``EXTRA_ROUNDS`` more for sizes
    whose runs disagree, after one unmeasured warm-up; powers of two first. The repeats run in
    rounds over all sizes, so a slow spell of the machine inflates no size's every run.
    ``settle()`` (a one-token step) runs twice before each timed run: untimed (a step right after
    a large batch runs slow on a CPU: cold caches; generation meets every verify after a plain
    step), then timed. A run's reference is the faster of the timed one-token steps just
    before and after it (None without ``settle``): what a one-token step cost then, through a slow
    spell of the machine, but not through one stalled step. ``stop()`` true ends it early (the
    sizes measured so far)."""
    sizes = _coarse_first(sizes)
    run(sizes[0])
    out: dict[int, list[tuple[float, int]]] = {}
    refs: list[float] = []   # the timed one-token steps, in order; a run follows refs[j]

    def reference() -> None:
        if settle is not None:
            settle()
            t0 = time.perf_counter()
            settle()
            refs.append(time.perf_counter() - t0)

    rounds = [[b for b in sizes if r < planned(b, repeats)] for r in range(repeats)]
    for r in range(repeats + EXTRA_ROUNDS):
        if r >= repeats:   # sizes whose runs disagree: more runs, so that their figure holds
            rounds.append([b for b in sizes if b in out and _unsettled(_referenced(out[b], refs))])
        for b in rounds[r]:
            if stop is not None and out and stop():
                break
            reference()
            t0 = time.perf_counter()
            run(b)
            out.setdefault(b, []).append((time.perf_counter() - t0, len(refs) - 1))
        else:
            continue
        break
    if out:   # the reference after the last run
        reference()
    return {b: _referenced(p, refs) for b, p in out.items()}


def _referenced(runs: list[tuple[float, int]], refs: list[float]) -> list[tuple[float, float | None]]:
    """(seconds, the faster of the one-token steps just before and after) for runs that followed refs[j]."""
    return [(t, min(refs[j:j + 2]) if refs else None) for t, j in runs]


def _unsettled(runs: list[tuple[float, float | None]]) -> bool:
    """Whether a size needs more runs: its two fastest (each over its reference) disagree by more
    than ``SPREAD``."""
    xs = sorted(t / r if r else t for t, r in runs)
    return len(xs) < 2 or xs[1] > SPREAD * xs[0]


def median(xs) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def robust_costs(runs: dict[int, list[tuple[float, float | None]]]) -> dict[int, float]:
    """Each size's seconds from :func:`measure_runs`: its runs, each over its reference times the
    median one-token step (a slow spell of the machine moves neither the shape nor the level),
    the lowest but a third of them (of 3 the fastest, of 5 the second; a stalled decode only ever
    adds time, a reference a little off moves a run either way). Without references, the same of
    its seconds."""
    refs = [r for p in runs.values() for _, r in p if r]
    one = median(refs) if refs else 1.0
    out = {}
    for b, p in runs.items():
        xs = sorted(t / r * one if r else t for t, r in p)
        out[b] = xs[(len(xs) - 1) // 3]
    return out


def fit_curve(costs: dict[int, float]) -> dict[int, float]:
    """A monotone curve through ``costs`` (seconds by batch size): non-decreasing total cost in
    rows (isotonic regression, pool adjacent violators), except where a size of ``KERNEL_MIN`` rows
    or more costs under ``DROP`` times both measured sizes below it, and so does the size above
    it: a kernel switch (a CPU's flash attention at 64 rows: 72 rows cost less than 63 and 56 too),
    which stays, and the policy pads to it (:meth:`CostModel.rows_for`), so what verifying ``b``
    rows costs, padded, never falls by more than the padding margin. Any other dip is noise, pooled."""
    sizes = sorted(costs)
    out: dict[int, float] = {}
    segment: list[int] = []
    for i, (a, b) in enumerate(zip([None] + sizes, sizes)):
        after = sizes[i + 1] if i + 1 < len(sizes) else None
        before = sizes[i - 2] if i >= 2 else None
        if (segment and after is not None and before is not None and b >= KERNEL_MIN
                and max(costs[b], costs[after]) <= DROP * min(costs[a], costs[before])):
            out.update(_isotonic(segment, costs))
            segment = []
        segment.append(b)
    out.update(_isotonic(segment, costs))
    return out


def _isotonic(sizes: list[int], costs: dict[int, float]) -> dict[int, float]:
    """Pool adjacent violators: the non-decreasing sequence nearest ``costs`` over ``sizes`` (least
    squares in log units, so a dip of 10% weighs alike at 1 row and at 128)."""
    blocks: list[list[float]] = []   # [mean log cost, count]
    for b in sizes:
        blocks.append([math.log(costs[b]), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    values = [math.exp(m) for m, n in blocks for _ in range(int(n))]
    return dict(zip(sizes, values))


def plausible(verify: dict[int, float]) -> dict[int, float]:
    """``verify`` brought within what :func:`check_curve` accepts, from one row up: each figure
    within [MIN_SECONDS, MAX_SECONDS] and within ``FLOOR`` and ``CEIL`` of the size below (a
    calibration on an oversubscribed machine, where decodes stall at random; the live check
    then corrects the sizes drafted)."""
    out: dict[int, float] = {}
    a = None
    for b in sorted(verify):
        v = min(max(verify[b], MIN_SECONDS), MAX_SECONDS) if math.isfinite(verify[b]) else MAX_SECONDS
        if a is not None:
            v = min(max(v, FLOOR * out[a]), CEIL * out[a] * b / a)
        out[b], a = v, b
    return out


def check_curve(verify: dict[int, float]) -> str | None:
    """Why a cached curve cannot be a measurement (None: it can): a figure outside
    [MIN_SECONDS, MAX_SECONDS], a larger batch costing under ``FLOOR`` of a smaller one, or a row
    costing over ``CEIL`` times what it costs in the measured batch below."""
    sizes = sorted(verify)
    for a, b in zip([None] + sizes, sizes):
        v = verify[b]
        if not MIN_SECONDS <= v <= MAX_SECONDS:
            return f"V({b}) = {v!r} s is not a plausible verify time"
        if a is not None and not FLOOR * verify[a] * (1 - 1e-9) <= v <= CEIL * verify[a] * b / a * (1 + 1e-9):
            return f"V({b}) = {v:.3g} s against V({a}) = {verify[a]:.3g} s is not a plausible curve"
    return None


def _coarse_first(sizes) -> list[int]:
    """Powers of two first (1, 2, 4 ... 128: the whole range), then the sizes between: a
    calibration cut short on a busy machine still spans every draft depth."""
    sizes = sorted(set(sizes))
    coarse = [b for b in sizes if b & (b - 1) == 0]
    return coarse + [b for b in sizes if b & (b - 1)]
