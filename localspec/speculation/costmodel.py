"""What a cycle costs on this machine: target verify time by batch size, drafter time per step.

Calibrated at load (one target decode of each batch size 1..``CALIBRATE_MAX``, a few repeats, the
median) and cached in ``user_dir()/calibration.json`` under a key naming the machine (platform,
CPU count, threads, offloaded layers) and the model files (path, size, mtime), so later loads
cost nothing. During generation every verify and every drafting step refreshes the figures (an
exponential moving average of measured/calibrated per batch size); a global drift factor carries
what the live measurements say to batch sizes not seen lately. When the live figures drift away
from the cached ones, :meth:`CostModel.save` writes them back.

Verify cost is not linear in batch size on CPUs (DESIGN.md section 4: Q4_0 verifies 4 tokens for
~2x one token, 8 for ~3x, and multiples of 4 are sweet spots), and on GPUs it is almost flat: the
policy only ever asks :meth:`CostModel.verify`, so one policy fits both.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Callable

from ..core.atomic import atomic_write
from ..core.errors import LocalspecError

CALIBRATE_MAX = 9      # batch sizes measured at load: 1..9 (verify of up to 8 drafts)
EXTRA_SIZES = (16,)    # measured too, so deep chains interpolate instead of extrapolating
REPEATS = 3
BUDGET_SECONDS = 3.0   # calibration stops here (the sizes measured so far; not cached)
ALPHA = 0.15           # EMA weight of one live measurement
DRIFT_SAVE = 0.15      # save when live figures moved this much from the cached ones
CACHE_VERSION = 2      # 2: the drafter's cost of a step of tree branches


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


class CostModel:
    """Seconds per target verify of ``b`` tokens and per drafter step, calibrated then refreshed live."""

    def __init__(self, verify: dict[int, float], drafter_step: float | None = None, *, key: str = "",
                 cache: Path | None = None, drafter_width: float | None = None) -> None:
        if 1 not in verify:
            raise ValueError("a cost model needs the one-token verify cost")
        self.key = key
        self.cache = cache
        self._base = dict(sorted(verify.items()))  # calibrated seconds by batch size
        self._sizes = sorted(self._base)
        self._ratio: dict[int, float] = {}          # live measured / calibrated, by batch size
        self._drift = 1.0                           # live / calibrated over all sizes
        self.drafter_step = drafter_step
        self._drafter_base = drafter_step
        # a drafter step of speculation.tree.WIDTH branches (one decode) over a one-branch step
        self.drafter_width = drafter_width
        self._table: list[float] = []
        self._seen = 0
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
        top = max(self._sizes[-1], 40)
        self._table = [0.0] + [self._calibrated(b) * self._ratio.get(b, self._drift) for b in range(1, top + 1)]

    def verify(self, b: int) -> float:
        """Expected seconds for one target decode of ``b`` tokens with logits for all."""
        table = self._table
        if b < len(table):
            return table[b]
        return self._calibrated(b) * self._ratio.get(b, self._drift)

    def curve(self, n: int = CALIBRATE_MAX) -> list[float]:
        return [self.verify(b) for b in range(1, n + 1)]

    # -- live refresh -------------------------------------------------------------------------
    def observe_verify(self, b: int, seconds: float) -> None:
        if seconds <= 0:
            return
        r = seconds / self._calibrated(b)
        old = self._ratio.get(b)
        self._ratio[b] = r if old is None else (1 - ALPHA) * old + ALPHA * r
        self._drift = (1 - ALPHA / 4) * self._drift + (ALPHA / 4) * r
        self._table_set(b)

    def _table_set(self, b: int) -> None:
        table = self._table
        if b < len(table):
            table[b] = self._calibrated(b) * self._ratio[b]
        # sizes without live data follow the drift, refreshed cheaply every so often
        self._seen += 1
        if self._seen % 32 == 0:
            self._rebuild()

    def observe_drafter(self, steps: int, seconds: float) -> None:
        if steps <= 0 or seconds <= 0:
            return
        per = seconds / steps
        self.drafter_step = per if self.drafter_step is None else (1 - ALPHA) * self.drafter_step + ALPHA * per

    # -- persistence ----------------------------------------------------------------------------
    def live(self) -> dict:
        """The current figures, in the cache's form."""
        sizes = sorted(set(self._sizes))
        return {"verify": {str(b): self.verify(b) for b in sizes}, "drafter_step": self.drafter_step,
                "drafter_width": self.drafter_width}

    def drifted(self) -> bool:
        moved = [abs(r - 1.0) for r in self._ratio.values()]
        if self._drafter_base and self.drafter_step:
            moved.append(abs(self.drafter_step / self._drafter_base - 1.0))
        return bool(moved) and max(moved) > DRIFT_SAVE

    def save(self) -> None:
        if self.cache is None or not self.key:
            return
        try:
            data = read_cache(self.cache) if self.cache.is_file() else {"version": CACHE_VERSION, "entries": {}}
        except (OSError, ValueError):   # a cache of the wrong shape is replaced
            data = {"version": CACHE_VERSION, "entries": {}}
        entry = self.live()
        entry["measured_at"] = time.time()
        data["entries"][self.key] = entry
        atomic_write(self.cache, json.dumps(data, indent=1))

    def save_if_drifted(self) -> None:
        if self.drifted():
            try:
                self.save()
            except (OSError, LocalspecError):   # a cache only (e.g. a read-only user directory)
                pass

    def to_dict(self) -> dict:
        return {"verify_ms": [round(v * 1e3, 3) for v in self.curve()],
                "drafter_step_ms": round(self.drafter_step * 1e3, 3) if self.drafter_step else None,
                "drafter_width_ratio": round(self.drafter_width, 3) if self.drafter_width else None}


def measure(run: Callable[[int], None], sizes, repeats: int = REPEATS,
            stop: Callable[[], bool] | None = None) -> dict[int, float]:
    """Seconds of ``run(b)`` for each batch size: the fastest of ``repeats`` (other processes on a
    shared machine only ever add time; the live refresh brings in what they cost), after one
    unmeasured warm-up. ``stop()`` true ends it early (the sizes measured so far)."""
    sizes = list(sizes)
    run(sizes[0])
    out = {}
    for b in sizes:
        if stop is not None and out and stop():
            break
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(b)
            times.append(time.perf_counter() - t0)
        out[b] = min(times)
    return out


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")


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
    extra = [entry.get("drafter_step"), entry.get("drafter_width")]
    if any(x is not None and not _positive(x) for x in extra):
        raise ValueError(f"a bad drafter figure {extra!r}")
    return verify, *(float(x) if x is not None else None for x in extra)


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
    if complete:  # an interrupted calibration serves this engine only
        try:
            model.save()
        except (OSError, LocalspecError):
            pass
    return model
