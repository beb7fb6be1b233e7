"""The calibration cache: ``user_dir()/calibration.json``, one entry per key naming the machine
(platform, CPU count, threads, offloaded layers: :func:`machine_key`) and the model files (path,
size, mtime: :func:`file_key`). Processes share the file under a lock (:func:`write_entry`); an
entry that cannot be a measurement (:func:`.cost_measure.check_curve`) counts as absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:   # not POSIX: writes stay atomic, concurrent saves may drop an entry
    fcntl = None

from ..core.atomic import atomic_write
from .cost_measure import MAX_SECONDS, MIN_SECONDS, check_curve, fit_curve, plausible

CACHE_VERSION = 9      # 2: the drafter's cost of a step of tree branches; 3: sizes up to 128; 4: 1..17, 56, 63, 72;
                       # 5: bands learned against one-token steps (4's live saves could bend the curve);
                       # 6: sizes above 32 the fastest of 2 runs; 7: weights read into huge pages
                       # (one-token steps 5-13% faster, so every V(k) / V(1) moved); 8: medians of
                       # paired runs, fitted monotone (fit_curve), figures checked at load (check_curve);
                       # 9: only trusted calibrations (cost_measure.trusted): 8 cached budget-cut ones,
                       # stalls for figures (on this VM 7 of 26 entries had V(k+1) < V(k) below 32 rows)


def file_key(path: Path | None) -> str:
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


def entry_figures(entry) -> tuple[dict[int, float], float | None, float | None]:
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



def cached_figures(cache: Path, key: str) -> tuple[dict[int, float], float | None, float | None] | None:
    """(verify seconds by batch size, drafter step, drafter width) cached for ``key``, None when
    there is no entry; ValueError when the file or the entry is not of the right shape."""
    if not cache.is_file():
        return None
    entry = read_cache(cache)["entries"].get(key)
    return None if entry is None else entry_figures(entry)


def write_entry(cache: Path, key: str, entry: dict) -> None:
    """Write ``key``'s figures (``{"verify": {b: seconds}, "drafter_step", "drafter_width"}``, fitted
    and made plausible here) into the cache, keeping every other key's: under a lock beside the
    file, read again, merged, written atomically, so processes calibrating or closing at once (a
    chat and a server) lose none of each other's entries."""
    entry = dict(entry)
    fitted = plausible(fit_curve({int(b): sec for b, sec in entry["verify"].items()}))
    entry["verify"] = {str(b): sec for b, sec in fitted.items()}
    for name in ("drafter_step", "drafter_width"):
        if entry.get(name) is not None and not MIN_SECONDS <= entry[name] <= MAX_SECONDS:
            entry[name] = None
    entry["measured_at"] = time.time()
    with _locked(cache):
        try:
            data = read_cache(cache) if cache.is_file() else {"version": CACHE_VERSION, "entries": {}}
        except (OSError, ValueError):   # a cache of the wrong shape is replaced
            data = {"version": CACHE_VERSION, "entries": {}}
        data["entries"] = _sound(data["entries"])
        data["entries"][key] = entry
        atomic_write(cache, json.dumps(data, indent=1, allow_nan=False))


def drop_entry(cache: Path, key: str) -> None:
    """Remove ``key``'s entry (one that cannot be a measurement), keeping every other key's, under
    the lock: a calibration not trusted enough to replace it must not leave it to the next start."""
    with _locked(cache):
        try:
            data = read_cache(cache)
        except (OSError, ValueError):   # a file of the wrong shape: the next write replaces it
            return
        if key in data["entries"]:
            data["entries"] = _sound({k: e for k, e in data["entries"].items() if k != key})
            atomic_write(cache, json.dumps(data, indent=1, allow_nan=False))


def _sound(entries: dict) -> dict:
    """The entries that are measurements (:func:`entry_figures`): one holding NaN or an absurd
    curve, left by another key's run or written by hand, would fail strict JSON and every write."""
    out = {}
    for key, entry in entries.items():
        try:
            entry_figures(entry)
        except ValueError:
            continue
        out[key] = entry
    return out
