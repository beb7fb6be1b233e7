"""What a cycle costs on this machine: target verify time by batch size, drafter time per step.

Calibrated at load (target decodes of each batch size 1..``CALIBRATE_MAX`` and ``EXTRA_SIZES``
up to 128, a few runs of each taken against one-token steps timed around them, the curve fitted
monotone: :func:`measure`) and cached in ``user_dir()/calibration.json`` under a key naming
the machine (platform, CPU count, threads, offloaded layers) and the model files (path, size,
mtime), so later loads cost nothing; a cached curve that cannot be a measurement
(:func:`check_curve`) is calibrated again. Processes share the file under a lock
(:meth:`CostModel.save`). During generation every verify and every drafting step refreshes the
figures: a machine level (the median of what the last few cycles say, so a load
that starts or ends is followed within three cycles and one hiccup is ignored) times a clipped
correction per band of sizes, learned against one-token steps (and replaced at once where the
verifies contradict it: a wrong cached curve). A change of thread count re-keys
the model (:meth:`CostModel.rekey`).
When the live figures drift away from the cached ones, :meth:`CostModel.save` writes them back.

Verify cost is not linear in batch size on CPUs (SmolLM2 Q4_0 on 2 CPU cores, flash attention as
llama.cpp defaults: 4 tokens for ~2.3x one token, 8 for 3.8x, 63 for 29x and 64 for 14x, see
EXTRA_SIZES and docs/design-notes.md), and on GPUs it is almost flat: the policy only
ever asks :meth:`CostModel.verify` and :meth:`CostModel.rows_for`, so one policy fits both.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import time
from pathlib import Path
from typing import Callable, Iterator

try:
    import fcntl
except ImportError:   # not POSIX: writes stay atomic, concurrent saves may drop an entry
    fcntl = None

from ..core.atomic import atomic_write
from ..core.errors import LocalspecError

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
TABLE_MIN = 160        # verify costs tabulated up to here at least (a 128-deep draft verifies 129 rows)
ALPHA = 0.15           # weight of one live measurement in its band's own correction
LEVEL_WINDOW = 5       # the machine's speed: the median of the last 5 cycles (3 agreeing move it)
PLAIN_RECENT = 12      # a verify is judged against one-token steps at most this many cycles later ...
PLAIN_KEEP = 6         # ... (the last one-token steps kept) ...
LEVEL_AGREE = 0.1      # ... those before and after it agreeing this well (log units)
RESIDUAL_CLIP = 0.25   # one measurement moves a band's correction by at most ALPHA * this (log units) ...
FIRST_MEASURED = 3     # ... its first 3 (a running mean) ...
FIRST_CLIP = 0.5       # ... by at most this
FRESH_CYCLES = 32      # a size measured within this many cycles follows a faster machine at once
DRIFT_SAVE = 0.15      # save when live figures moved this much from the cached ones
PAD_GAIN = 0.9         # a verify batch is padded to a larger measured size that costs at most this much
CACHE_VERSION = 8      # 2: the drafter's cost of a step of tree branches; 3: sizes up to 128; 4: 1..17, 56, 63, 72;
                       # 5: bands learned against one-token steps (4's live saves could bend the curve);
                       # 6: sizes above 32 the fastest of 2 runs; 7: weights read into huge pages
                       # (one-token steps 5-13% faster, so every V(k) / V(1) moved); 8: medians of
                       # paired runs, fitted monotone (fit_curve), figures checked at load (check_curve)
# the fitted curve: a larger batch is cheaper than the size below only where it and the next size are
# by this much (llama.cpp's CPU flash attention: V(64) ~ 0.5 V(63)); elsewhere a dip is noise, pooled
DROP = 0.8
# a cached curve is corrupt (dropped, calibrated again) when between two measured sizes a < b ...
FLOOR = 0.3            # ... V(b) < FLOOR * V(a) (more rows never cost a third of fewer), or ...
CEIL = 2.0             # ... V(b) / V(a) > CEIL * b / a (a row never costs twice what it costs in a
                       # smaller batch), or a figure lies outside [MIN_SECONDS, MAX_SECONDS]
MIN_SECONDS, MAX_SECONDS = 1e-7, 600.0
# the live check of a cached curve (a wrong one is corrected at once instead of crept towards):
CHECK_N = 3            # a band whose last 3 verifies, each against the one-token steps around it,
CHECK_TOL = 0.2        # agree within 2x this (log units) and are off its figure by more than this
                       # (1.22x) takes their median (CostModel._learn); on a busy machine, a band ...
CHECK_WIDE = 5         # ... whose last 5, each against the last one-token steps, are off by more than
                       # 2 CHECK_TOL (1.5x) in their median takes that (CostModel._check_band)


def _file_key(path: Path | None) -> str:
    if path is None:
        return "-"
    p = Path(path)
    try:
        st = p.stat()
        return f"{p.resolve()}:{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        return str(p)


def machine_key(n_threads: int, n_gpu_layers: int) -> str:
    return f"{platform.system()}-{platform.machine()}-cpu{os.cpu_count()}-t{n_threads}-gpu{n_gpu_layers}"


def with_threads(key: str, n_threads: int) -> str:
    """``key`` (a :func:`machine_key`, possibly followed by more fields) for ``n_threads`` threads."""
    return re.sub(r"-t\d+-gpu", f"-t{n_threads}-gpu", key, count=1)


class CostModel:
    """Seconds per target verify of ``b`` tokens and per drafter step, calibrated then refreshed live.

    Live figures are ``calibrated(b) * exp(level + residual[b])``. ``level`` is how much slower
    than calibrated the machine runs now (log units): the median of what the last
    ``LEVEL_WINDOW`` cycles say, whatever their batch size, so a load that starts or ends moves
    every size within three cycles while one slow decode (a scheduler hiccup) moves nothing.
    ``residual[band]`` is a band of batch sizes' own lasting deviation from one-token steps (an
    EMA, each step clipped; sizes share it by powers of two, see :func:`_band`), e.g. verifies that
    suffer less than single steps from a busy core, or a calibration taken in a slow spell. It is
    learned against the one-token steps just before and after each verify (``_plain``): judged
    against a level that other bands' residuals help set, one band's error would leak into the
    others and drift with them.
    The drafter step follows the level too, with a residual of its own."""

    def __init__(self, verify: dict[int, float], drafter_step: float | None = None, *, key: str = "",
                 cache: Path | None = None, drafter_width: float | None = None) -> None:
        if 1 not in verify:
            raise ValueError("a cost model needs the one-token verify cost")
        self.key = key
        self.cache = cache
        self.cacheable = True   # False: figures of an interrupted calibration, never written back
        self._set_base(verify, drafter_step)
        # a drafter step of speculation.tree.WIDTH branches (one decode) over a one-branch step
        self.drafter_width = drafter_width
        self._stash: dict[str, tuple] = {}   # live state of other keys (thread counts), see rekey

    def _set_base(self, verify: dict[int, float], drafter_step: float | None) -> None:
        self._base = dict(sorted(verify.items()))  # calibrated seconds by batch size
        self._sizes = sorted(self._base)
        self._cal = [0.0] + [self._calibrated(b) for b in range(1, max(self._sizes[-1], TABLE_MIN) + 1)]
        self._drafter_base = drafter_step
        self._level = 0.0                           # log(live / calibrated), the machine's state
        self._window: list[tuple[int, float]] = []  # the last cycles: (size's band, log(measured / calibrated))
        self._residual: dict[int, float] = {}       # per band of sizes (_band), relative to one-token steps
        self._learned: dict[int, int] = {}          # per band: measurements it has learned from
        self._recent: dict[int, list[float]] = {}   # per band: its last CHECK_N deviations (see _learn)
        self._wide: dict[int, list[float]] = {}     # per band: its last CHECK_WIDE (see _check_band)
        self.corrected: set[int] = set()            # bands whose figure the live check replaced
        self._plain: list[tuple[int, float]] = []   # the last one-token steps: (cycle, log(measured / calibrated))
        self._pending: list[tuple[int, int, float]] = []  # verifies not learned from yet: (cycle, size, log ratio)
        self._drafter_residual = 0.0
        self._slow = 1.0                            # the level's slow EMA, for sizes not seen lately
        self._cycles = 0
        self._seen_at: dict[int, int] = {}          # band -> the cycle a size of it was last measured in
        self._rebuild()

    # -- reading ----------------------------------------------------------------------------
    def _calibrated(self, b: int) -> float:
        base, sizes = self._base, self._sizes
        if b in base:
            return base[b]
        lo = max((s for s in sizes if s < b), default=sizes[0])
        hi = min((s for s in sizes if s > b), default=None)
        if hi is None:  # beyond the largest measured size: linear in the last segment's slope
            if len(sizes) < 2:
                return base[lo] * b / lo
            a, c = sizes[-2], sizes[-1]
            slope = max((base[c] - base[a]) / (c - a), 0.0)
            return base[c] + slope * (b - c)
        t = (b - lo) / (hi - lo)
        return base[lo] + t * (base[hi] - base[lo])

    def _rebuild(self) -> None:
        res = self._residual
        self._scale = math.exp(self._level)
        # calibrated cost times the size's own correction; verify() multiplies in the level
        self._shape = [c * math.exp(res.get(_band(b), 0.0)) for b, c in enumerate(self._cal)]
        self._pad_rows()

    def _pad_rows(self) -> None:
        """``_pad[b]``: the rows to decode for a batch of ``b``: b, or a larger measured size that
        verifies in at most PAD_GAIN of b's time (extra rows cost nothing there)."""
        shape = self._shape
        pad = list(range(len(shape)))
        best = None
        for b in range(len(shape) - 1, 0, -1):
            if b in self._base and (best is None or shape[b] < shape[best]):
                best = b
            if best is not None and shape[best] <= PAD_GAIN * shape[b]:
                pad[b] = best
        self._pad = pad
        self._floor = min(shape[2:], default=shape[-1])   # see cheapest_batch

    def verify(self, b: int) -> float:
        """Expected seconds for one target decode of ``b`` tokens with logits for all. Sizes not
        measured in the last ``FRESH_CYCLES`` cycles follow a slower machine at once but a faster
        one only gradually (``_slow``: the old drift): when in doubt, drafting looks costly."""
        scale = self._scale
        if self._cycles - self._seen_at.get(_band(b), -FRESH_CYCLES - 1) > FRESH_CYCLES and self._slow > scale:
            scale = self._slow
        shape = self._shape
        if b < len(shape):
            return shape[b] * scale
        return self._calibrated(b) * scale * math.exp(self._residual.get(_band(b), 0.0))

    @property
    def drafter_step(self) -> float | None:
        """Expected seconds of one drafter step (None: never measured). On a slower machine the
        greater of two readings of the level: as a factor, or as the time a one-token target step
        gained, added (spinning workers that wait for a preempted one cost every decode about the
        same, so a drafter step then pays what a target step pays)."""
        return None if self._drafter_base is None else self._drafter_expected() * math.exp(self._drafter_residual)

    def _drafter_expected(self) -> float:
        base, scale = self._drafter_base, self._scale
        return max(base * scale, base + self._cal[1] * (scale - 1.0)) if scale > 1.0 else base * scale

    @property
    def level(self) -> float:
        """How much slower than calibrated the machine runs now (1.0: as calibrated)."""
        return self._scale

    def cheapest_batch(self) -> float:
        """A lower bound of :meth:`verify` for every batch of 2 rows or more (up to ``TABLE_MIN``):
        the policy's quick test that no depth of a draft can pay, before it weighs each one."""
        return self._floor * self._scale

    def rows_for(self, b: int) -> int:
        """The rows to decode to verify ``b`` rows: ``b``, or a larger size that costs clearly less
        on this machine (e.g. 64 for 40 on a CPU, see EXTRA_SIZES); the extra rows are filler."""
        return self._pad[b] if b < len(self._pad) else b

    def curve(self, n: int = CALIBRATE_MAX) -> list[float]:
        return [self.verify(b) for b in range(1, n + 1)]

    # -- live refresh -------------------------------------------------------------------------
    def observe_verify(self, b: int, seconds: float) -> None:
        if seconds <= 0 or b < 1:
            return
        x = math.log(seconds / (self._cal[b] if b < len(self._cal) else self._calibrated(b)))
        window, res, band = self._window, self._residual, _band(b)
        window.append((band, x))
        if len(window) > LEVEL_WINDOW:
            del window[0]
        implied = sorted([x - res.get(s, 0.0) for s, x in window])
        level = implied[len(implied) // 2]
        if level != self._level:
            self._level = level
            self._scale = math.exp(level)
        self._slow = (1 - ALPHA / 4) * self._slow + (ALPHA / 4) * self._scale
        self._cycles += 1
        self._seen_at[band] = self._cycles
        if b == 1:
            self._plain.append((self._cycles, x))
            del self._plain[:-PLAIN_KEEP]
            if self._pending:
                self._learn_pending()
        elif b < len(self._shape):
            self._pending.append((self._cycles, b, x))
            if len(self._plain) >= 3:
                self._check_band(band, x - _median([x1 for _, x1 in self._plain]))

    def _check_band(self, band: int, d: float) -> None:
        """The live check on a busy machine, where one-token steps rarely agree well enough for
        :meth:`_learn_pending`: a band whose last ``CHECK_WIDE`` verifies, each against the median
        of the last one-token steps, have a median off its figure by more than 2 ``CHECK_TOL``
        (1.5x) takes that median at once."""
        recent = self._wide.setdefault(band, [])
        recent.append(d)
        del recent[:-CHECK_WIDE]
        if len(recent) < CHECK_WIDE or abs(_median(recent) - self._residual.get(band, 0.0)) <= 2 * CHECK_TOL:
            return
        self._residual[band] = r = _median(recent)
        self.corrected.add(band)
        recent.clear()
        shape, cal = self._shape, self._cal
        for b in range(band, min(2 * band, len(shape))):
            shape[b] = cal[b] * math.exp(r)
        self._pad_rows()

    def _learn_pending(self) -> None:
        """Each band's own correction learns from its verifies once two one-token steps followed
        them, against the one-token steps around them (those just before and after: a verify
        between two that disagree, a load that changed meanwhile, teaches nothing); clipped, so one
        odd decode moves it little. A band's first few measurements are averaged: a calibration taken
        in a slow spell of the machine has the wrong shape, and a band is drafted a few times per
        generation. Verifies with no one-token steps after them within PLAIN_RECENT cycles (a
        long repeat: nothing but drafts) are dropped."""
        plain, res, keep = self._plain, self._residual, []
        for t, s, x in self._pending:
            before = [x1 for c, x1 in plain if c < t][-2:]
            after = [x1 for c, x1 in plain if c > t][:2]
            if len(after) < 2 or not before:
                if self._cycles - t <= PLAIN_RECENT:
                    keep.append((t, s, x))
                continue
            lo, hi = sum(before) / len(before), sum(after) / 2
            if abs(lo - hi) > LEVEL_AGREE:
                continue
            key = _band(s)
            r = self._learn(key, x - (lo + hi) / 2)
            shape, cal = self._shape, self._cal
            for b in range(key, min(2 * key, len(shape))):
                shape[b] = cal[b] * math.exp(r)
            self._pad_rows()
        self._pending = keep

    def _learn(self, key: int, d: float) -> float:
        """Band ``key``'s correction after a verify ``d`` (log units) dearer than the one-token
        steps around it: its first measurements averaged, then an EMA, each step clipped; but when
        its last ``CHECK_N`` verifies agree with each other (within 2 ``CHECK_TOL``) and not with the
        figure (beyond ``CHECK_TOL``: a cached curve calibrated wrong or corrupted), their median
        at once."""
        res, n = self._residual, self._learned.get(key, 0)
        self._learned[key] = n + 1
        recent = self._recent.setdefault(key, [])
        recent.append(d)
        del recent[:-CHECK_N]
        r = res.get(key, 0.0)
        if (len(recent) == CHECK_N and max(recent) - min(recent) <= 2 * CHECK_TOL
                and abs(_median(recent) - r) > CHECK_TOL):
            self.corrected.add(key)
            res[key] = r = _median(recent)
            return r
        clip = FIRST_CLIP if n < FIRST_MEASURED else RESIDUAL_CLIP
        res[key] = r = r + max(ALPHA, 1.0 / (1 + n)) * min(max(d - r, -clip), clip)
        return r

    def observe_drafter(self, steps: int, seconds: float) -> None:
        if steps <= 0 or seconds <= 0:
            return
        per = seconds / steps
        if self._drafter_base is None:   # never calibrated: this is its figure at today's level
            self._drafter_base = per / self._scale
            self._drafter_residual = math.log(per / self._drafter_expected())
            return
        step = math.log(per / self._drafter_expected()) - self._drafter_residual
        self._drafter_residual += ALPHA * min(max(step, -RESIDUAL_CLIP), RESIDUAL_CLIP)

    def rekey(self, key: str) -> None:
        """The machine's configuration changed (another thread count): keep this key's live state
        aside, take up ``key``'s (seen before in this process, else its cached calibration, else
        these figures, which the level then corrects from the next cycles on)."""
        if key == self.key:
            return
        self._stash[self.key] = (self._base, self._drafter_base, self._level, self._residual,
                                 self._learned, self._drafter_residual, self.cacheable)
        old, self.key = self._stash.get(key), key
        if old is not None:
            base, dbase, level, residual, learned, dres, self.cacheable = old
            self._set_base(base, dbase)
            self._level, self._residual, self._learned, self._drafter_residual = level, residual, learned, dres
            self._rebuild()
            return
        if self.cache is not None and self.cache.is_file():
            try:
                entry = read_cache(self.cache)["entries"].get(key)
                if entry is not None:
                    verify, dstep, _ = _entry_figures(entry)
                    self._set_base(verify, dstep if dstep is not None else self._drafter_base)
                    self.cacheable = True
                    return
            except (OSError, ValueError):
                pass
        self._window = []   # the next cycles set the level afresh, for every size
        self._slow = 0.0
        self.cacheable = False   # another thread count's curve: not this key's calibration

    # -- persistence ----------------------------------------------------------------------------
    def live(self) -> dict:
        """The current figures, in the cache's form: each size's calibrated cost times its band's
        correction and the machine level, so sizes not drafted keep the calibrated shape."""
        shape, scale = self._shape, self._scale
        verify = {str(b): shape[b] * scale if b < len(shape) else self.verify(b) for b in self._sizes}
        return {"verify": verify, "drafter_step": self.drafter_step, "drafter_width": self.drafter_width}

    def drifted(self) -> bool:
        live = self.live()
        moved = [abs(sec / self._base[int(b)] - 1.0) for b, sec in live["verify"].items()]
        if self._drafter_base and self.drafter_step:
            moved.append(abs(self.drafter_step / self._drafter_base - 1.0))
        return max(moved) > DRIFT_SAVE

    def save(self) -> None:
        """Write this key's live figures (fitted, made plausible) into the cache, keeping every other
        key's: under a lock beside the file, read again, merged, written atomically, so processes
        calibrating or closing at once (a chat and a server) lose none of each other's entries."""
        if self.cache is None or not self.key:
            return
        entry = self.live()
        fitted = plausible(fit_curve({int(b): sec for b, sec in entry["verify"].items()}))
        entry["verify"] = {str(b): sec for b, sec in fitted.items()}
        for name in ("drafter_step", "drafter_width"):
            if entry[name] is not None and not MIN_SECONDS <= entry[name] <= MAX_SECONDS:
                entry[name] = None
        entry["measured_at"] = time.time()
        with _locked(self.cache):
            try:
                data = read_cache(self.cache) if self.cache.is_file() else {"version": CACHE_VERSION, "entries": {}}
            except (OSError, ValueError):   # a cache of the wrong shape is replaced
                data = {"version": CACHE_VERSION, "entries": {}}
            data["entries"][self.key] = entry
            atomic_write(self.cache, json.dumps(data, indent=1, allow_nan=False))

    def save_if_drifted(self) -> None:
        if self.cacheable and self.drifted():
            try:
                self.save()
            except (OSError, LocalspecError):   # a cache only (e.g. a read-only user directory)
                pass

    def to_dict(self) -> dict:
        return {"verify_ms": [round(v * 1e3, 3) for v in self.curve()],
                "drafter_step_ms": round(self.drafter_step * 1e3, 3) if self.drafter_step else None,
                "drafter_width_ratio": round(self.drafter_width, 3) if self.drafter_width else None}


def measure(run: Callable[[int], None], sizes, repeats: int = REPEATS,
            stop: Callable[[], bool] | None = None, settle: Callable[[], None] | None = None) -> dict[int, float]:
    """Seconds of ``run(b)`` for each batch size, robust and fitted: :func:`measure_runs`, then
    :func:`robust_costs`, :func:`fit_curve` and :func:`plausible`."""
    return plausible(fit_curve(robust_costs(measure_runs(run, sizes, repeats, stop, settle))))


def measure_runs(run: Callable[[int], None], sizes, repeats: int = REPEATS,
                 stop: Callable[[], bool] | None = None,
                 settle: Callable[[], None] | None = None) -> dict[int, list[tuple[float, float | None]]]:
    """Timed runs of ``run(b)`` for each batch size: ``{b: [(seconds, reference), ...]}``,
    ``repeats`` of them (fewer above 9 and 32 rows) and up to ``EXTRA_ROUNDS`` more for sizes
    whose runs disagree, after one unmeasured warm-up; powers of two first. The repeats run in
    rounds over all sizes, so a slow spell of the machine inflates no size's every run.
    ``settle()`` (a one-token step) runs twice before each timed run: untimed (a step right after
    a large batch runs up to 2x slow on a CPU: cold caches; generation meets every verify after a
    plain step), then timed. A run's reference is the faster of the timed one-token steps just
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

    rounds = [[b for b in sizes if r < (repeats if b <= 9 else min(repeats, REPEATS_MID if b <= 32 else REPEATS_LARGE))]
              for r in range(repeats)]
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


def _median(xs) -> float:
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
    one = _median(refs) if refs else 1.0
    out = {}
    for b, p in runs.items():
        xs = sorted(t / r * one if r else t for t, r in p)
        out[b] = xs[(len(xs) - 1) // 3]
    return out


def fit_curve(costs: dict[int, float]) -> dict[int, float]:
    """A monotone curve through ``costs`` (seconds by batch size): non-decreasing total cost in
    rows (isotonic regression, pool adjacent violators), except where a larger size costs under
    ``DROP`` times the measured size below it, and so does the size above it: a kernel switch (a
    CPU's flash attention at 64 rows: 72 rows cost less than 63 too), which stays, and the policy
    pads to it (:meth:`CostModel.rows_for`), so what verifying ``b`` rows costs, padded, never
    falls by more than the padding margin. One size alone below is noise, pooled."""
    sizes = sorted(costs)
    out: dict[int, float] = {}
    segment: list[int] = []
    for i, (a, b) in enumerate(zip([None] + sizes, sizes)):
        after = sizes[i + 1] if i + 1 < len(sizes) else None
        if segment and after is not None and max(costs[b], costs[after]) <= DROP * costs[a]:
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


def _band(b: int) -> int:
    """The band of batch sizes ``b`` shares its live correction with: 1, 2-3, 4-7, ... 64-127 (on a
    CPU, 64 rows is where flash attention turns tiled: the bands break where the curve does)."""
    return 1 << (b.bit_length() - 1) if b > 0 else 0


def _coarse_first(sizes) -> list[int]:
    """Powers of two first (1, 2, 4 ... 128: the whole range), then the sizes between: a
    calibration cut short on a busy machine still spans every draft depth."""
    sizes = sorted(set(sizes))
    coarse = [b for b in sizes if b & (b - 1) == 0]
    return coarse + [b for b in sizes if b & (b - 1)]


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")


@contextlib.contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """An exclusive lock on ``cache`` for a read-change-write: ``flock`` on ``.NAME.lock`` beside
    it (kept: removing it would let a third process lock a new file while one holds the old)."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache.with_name(f".{cache.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing releases the lock


def read_cache(cache: Path) -> dict:
    """The cache file's data, ``{"version": CACHE_VERSION, "entries": {key: entry}}``; ValueError
    saying what is wrong when the file is not of that shape (it is then treated as absent)."""
    try:
        data = json.loads(cache.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"not JSON text ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ValueError("not an object with an \"entries\" object")
    if data.get("version") != CACHE_VERSION:
        raise ValueError(f"version {data.get('version')!r}, expected {CACHE_VERSION}")
    return data


def _entry_figures(entry) -> tuple[dict[int, float], float | None, float | None]:
    """(verify seconds by batch size, drafter step, drafter width) of one cache entry; ValueError
    unless every figure is a positive finite number and the one-token cost is there."""
    if not isinstance(entry, dict) or not isinstance(entry.get("verify"), dict):
        raise ValueError("an entry without a \"verify\" object")
    verify = {}
    for b, sec in entry["verify"].items():
        if not (isinstance(b, str) and b.isdigit() and 0 < int(b) <= 4096 and _positive(sec)):
            raise ValueError(f"a bad verify figure {b!r}: {sec!r}")
        verify[int(b)] = float(sec)
    if 1 not in verify:
        raise ValueError("no one-token verify cost")
    why = check_curve(verify)
    if why is not None:
        raise ValueError(why)
    extra = [entry.get("drafter_step"), entry.get("drafter_width")]
    if any(x is not None and not (_positive(x) and MIN_SECONDS <= x <= MAX_SECONDS) for x in extra):
        raise ValueError(f"a bad drafter figure {extra!r}")
    return fit_curve(verify), *(float(x) if x is not None else None for x in extra)


def load_or_calibrate(key: str, cache: Path,
                      calibrate: Callable[[], tuple[dict[int, float], float | None, float | None, bool]],
                      *, refresh: bool = False, note: Callable[[str], None] | None = None) -> CostModel:
    """The cached figures for ``key``, else a fresh calibration (written to the cache). A cache of
    the wrong shape counts as absent (``note`` hears why: the engine prints it under --verbose)."""
    if not refresh and cache.is_file():
        try:
            entry = read_cache(cache)["entries"].get(key)
            if entry is not None:
                verify, drafter_step, drafter_width = _entry_figures(entry)
                return CostModel(verify, drafter_step, key=key, cache=cache, drafter_width=drafter_width)
        except OSError:
            pass
        except ValueError as exc:
            if note is not None:
                note(f"{cache}: ignored ({exc}); calibrating again")
    verify, drafter_step, drafter_width, complete = calibrate()
    model = CostModel(verify, drafter_step, key=key, cache=cache, drafter_width=drafter_width)
    model.cacheable = complete   # an interrupted calibration serves this engine only
    if complete:
        try:
            model.save()
        except (OSError, LocalspecError):
            pass
    return model
