"""What a cycle costs on this machine, live: target verify time by batch size, drafter time per step.

The live model. Its figures come from a calibration (target decodes of each batch size
1..``CALIBRATE_MAX`` and ``EXTRA_SIZES`` up to 128, each run against the one-token steps around
it, the curve fitted monotone: :mod:`.cost_measure`) kept in ``user_dir()/calibration.json`` per
machine and model files (:mod:`.cost_cache`), so later loads cost nothing; a cached curve that
cannot be a measurement is calibrated again. During generation every verify and every drafting step refreshes the
figures: a machine level (the median of what the last few cycles say, so a load
that starts or ends is followed within three cycles and one hiccup is ignored) times a clipped
correction per band of sizes, learned against one-token steps (and replaced at once where the
verifies contradict it: a wrong cached curve). A change of thread count re-keys
the model (:meth:`CostModel.rekey`).
When the live figures drift away from the cached ones, :meth:`CostModel.save` writes them back.

Verify cost is not linear in batch size on CPUs (not even monotone: flash attention tiles 64 rows
or more, docs/speculation.md, "CPU costs are not smooth"), and on GPUs it is almost flat: the
policy only ever asks :meth:`CostModel.verify` and :meth:`CostModel.rows_for`, so one policy fits both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

from ..core.errors import LocalspecError
from . import cost_cache
from .cost_measure import CALIBRATE_MAX, median as _median

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
FOLD_EVERY = 64        # one-token steps queued by observe_step are folded in by this many at most
# Before a calibration exists (a fresh machine, or one still being calibrated in the background: see
# runtime.calibrator), the policy plans with a guess: a CPU's curve (SmolLM2-135M Q4_0 on 2 cores:
# per-row cost falls slowly, the costliest shape; a GPU's is flat, so the guess
# drafts less than a calibration would, never more), one-token steps of PRIOR_STEP (the level
# takes the measured one from the first cycle on) and a drafter step as dear as a target step.
PRIOR_SHAPE = {1: 1.0, 2: 1.75, 3: 2.1, 4: 2.3, 6: 3.0, 8: 3.4, 12: 4.2, 16: 4.8, 24: 6.8, 32: 8.5,
               48: 12.2, 64: 15.5, 96: 23.0, 128: 30.0}
PRIOR_STEP = 0.01
PRIOR_CLIP = 3.0       # a provisional model's first measurements of a band move it by up to this (log units)
# the live check of a cached curve (a wrong one is corrected at once instead of crept towards):
CHECK_N = 3            # a band whose last 3 verifies, each against the one-token steps around it,
CHECK_TOL = 0.2        # agree within 2x this (log units) and are off its figure by more than this
                       # (1.22x) takes their median (CostModel._learn); on a busy machine, a band ...
CHECK_WIDE = 5         # ... whose last 5, each against the last one-token steps, are off by more than
                       # 2 CHECK_TOL (1.5x) in their median takes that (CostModel._check_band)


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
        # True: a guess (:func:`prior`) that plans until a calibration replaces it; each band's
        # first measurements and the first drafter steps replace its figures instead of nudging them
        self.provisional = False
        self._queued: list[float] = []   # one-token steps not folded in yet (observe_step)
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
        self._corrected: set[int] = set()           # bands whose figure the live check replaced
        self._plain: list[tuple[int, float]] = []   # the last one-token steps: (cycle, log(measured / calibrated))
        self._pending: list[tuple[int, int, float]] = []  # verifies not learned from yet: (cycle, size, log ratio)
        self._drafter_residual = 0.0
        self._drafter_seen = False                  # a drafter step was measured live
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
        if self._queued:
            self._fold()
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
        if self._queued:
            self._fold()
        return None if self._drafter_base is None else self._drafter_expected() * math.exp(self._drafter_residual)

    def _drafter_expected(self) -> float:
        base, scale = self._drafter_base, self._scale
        return max(base * scale, base + self._cal[1] * (scale - 1.0)) if scale > 1.0 else base * scale

    @property
    def level(self) -> float:
        """How much slower than calibrated the machine runs now (1.0: as calibrated)."""
        if self._queued:
            self._fold()
        return self._scale

    def cheapest_batch(self) -> float:
        """A lower bound of :meth:`verify` for every batch of 2 rows or more (up to ``TABLE_MIN``):
        the policy's quick test that no depth of a draft can pay, before it weighs each one."""
        if self._queued:
            self._fold()
        return self._floor * self._scale

    def rows_for(self, b: int) -> int:
        """The rows to decode to verify ``b`` rows: ``b``, or a larger size that costs clearly less
        on this machine (e.g. 64 for 40 on a CPU, see EXTRA_SIZES); the extra rows are filler."""
        if self._queued:
            self._fold()
        return self._pad[b] if b < len(self._pad) else b

    @property
    def corrected(self) -> set[int]:
        """The bands whose figure the live check replaced (at once, not crept towards)."""
        if self._queued:
            self._fold()
        return self._corrected

    def curve(self, n: int = CALIBRATE_MAX) -> list[float]:
        return [self.verify(b) for b in range(1, n + 1)]

    # -- live refresh -------------------------------------------------------------------------
    def observe_step(self, seconds: float) -> None:
        """A one-token step's seconds, as :meth:`observe_verify` takes them, but queued and folded
        in (in order, by :meth:`_fold`) before the model is next read or told anything else, or
        once ``FOLD_EVERY`` wait: every reader sees what it would have seen, and the steps of a
        plain stretch are learned in one warm loop instead of one cold call per step (3-5 µs
        each in a loop, 20-30 µs each right after a decode on a loaded 2-core machine: 2-3% of
        a 1 ms step; docs/speculation.md, DFlash / DSpark)."""
        queued = self._queued
        queued.append(seconds)
        if len(queued) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Learn the queued one-token steps, in the order they came."""
        queued, self._queued = self._queued, []
        for seconds in queued:
            self._observe(1, seconds)

    def observe_verify(self, b: int, seconds: float) -> None:
        """A target decode of ``b`` rows took ``seconds``: the level, the band corrections."""
        if self._queued:
            self._fold()
        self._observe(b, seconds)

    def _observe(self, b: int, seconds: float) -> None:
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
        self._corrected.add(band)
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
            self._corrected.add(key)
            res[key] = r = _median(recent)
            return r
        clip = (PRIOR_CLIP if self.provisional else FIRST_CLIP) if n < FIRST_MEASURED else RESIDUAL_CLIP
        res[key] = r = r + max(ALPHA, 1.0 / (1 + n)) * min(max(d - r, -clip), clip)
        return r

    def observe_drafter(self, steps: int, seconds: float) -> None:
        if self._queued:
            self._fold()
        if steps <= 0 or seconds <= 0:
            return
        per = seconds / steps
        if self._drafter_base is None or (self.provisional and not self._drafter_seen):
            # never calibrated (or a guess): this is its figure at today's level
            self._drafter_seen = True
            self._drafter_base = per / self._scale
            self._drafter_residual = math.log(per / self._drafter_expected())
            return
        step = math.log(per / self._drafter_expected()) - self._drafter_residual
        self._drafter_residual += ALPHA * min(max(step, -RESIDUAL_CLIP), RESIDUAL_CLIP)

    def rekey(self, key: str) -> None:
        """The machine's configuration changed (another thread count): keep this key's live state
        aside, take up ``key``'s (seen before in this process, else its cached calibration, else
        these figures, which the level then corrects from the next cycles on)."""
        if self._queued:
            self._fold()
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
        if self.cache is not None:
            try:
                figures = cost_cache.cached_figures(self.cache, key)
                if figures is not None:
                    verify, dstep, _ = figures
                    self._set_base(verify, dstep if dstep is not None else self._drafter_base)
                    self.cacheable = True
                    self.provisional = False
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
        if self._queued:
            self._fold()
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
        """Write this key's live figures into the cache (:func:`.cost_cache.write_entry`: fitted,
        made plausible, merged under a lock with every other key's)."""
        if self.cache is None or not self.key:
            return
        cost_cache.write_entry(self.cache, self.key, self.live())

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


def _band(b: int) -> int:
    """The band of batch sizes ``b`` shares its live correction with: 1, 2-3, 4-7, ... 64-127 (on a
    CPU, 64 rows is where flash attention turns tiled: the bands break where the curve does)."""
    return 1 << (b.bit_length() - 1) if b > 0 else 0


def load_or_calibrate(key: str, cache: Path,
                      calibrate: Callable[[], tuple[dict[int, float], float | None, float | None, bool]],
                      *, refresh: bool = False, note: Callable[[str], None] | None = None) -> CostModel:
    """The cached figures for ``key``, else a fresh calibration (written to the cache). A cache of
    the wrong shape counts as absent (``note`` hears why: the engine prints it under --verbose)."""
    if not refresh:
        model = cached(key, cache, note)
        if model is not None:
            return model
    return measured(key, cache, calibrate())


def measured(key: str, cache: Path | None,
             result: tuple[dict[int, float], float | None, float | None, bool]) -> CostModel:
    """The live model of a calibration's ``(verify, drafter step, drafter width, complete)``,
    written to the cache when complete; an interrupted one serves this engine only, provisional
    (its drafter step, if not measured, a guess as dear as a one-token verify)."""
    verify, drafter_step, drafter_width, complete = result
    if 1 not in verify:   # stopped before its first size
        return prior(key, cache)
    model = CostModel(verify, drafter_step if drafter_step is not None or complete else verify[1],
                      key=key, cache=cache, drafter_width=drafter_width)
    model.cacheable = complete
    model.provisional = not complete
    if complete:
        try:
            model.save()
        except (OSError, LocalspecError):
            pass
    return model


def cached(key: str, cache: Path, note: Callable[[str], None] | None = None) -> CostModel | None:
    """The cached figures for ``key`` as a live model, None when there are none. A cache of the
    wrong shape counts as absent (``note`` hears why: the engine prints it under --verbose)."""
    try:
        figures = cost_cache.cached_figures(cache, key)
    except OSError:
        return None
    except ValueError as exc:
        if note is not None:
            note(f"{cache}: ignored ({exc}); calibrating again")
        try:
            cost_cache.drop_entry(cache, key)
        except OSError:   # a cache only (e.g. a read-only user directory)
            pass
        return None
    if figures is None:
        return None
    verify, drafter_step, drafter_width = figures
    return CostModel(verify, drafter_step, key=key, cache=cache, drafter_width=drafter_width)


def prior(key: str = "", cache: Path | None = None) -> CostModel:
    """A provisional model (``PRIOR_SHAPE``) for the cycles before a calibration: never cached,
    corrected live from the first cycle (the level) and each band's first verifies."""
    model = CostModel({b: r * PRIOR_STEP for b, r in PRIOR_SHAPE.items()}, PRIOR_STEP, key=key, cache=cache)
    model.cacheable = False
    model.provisional = True
    return model
