"""Where a model's weights live on the CPU: read into memory backed by transparent huge pages.

llama.cpp maps the GGUF file by default (``mmap``): every weight is read through 4 KiB pages of the
page cache. A token's decode streams every weight once, so the fewer TLB misses and page walks of
2 MiB huge pages count at every step (measured: docs/speculation.md, "Weights in huge pages").

:class:`HugePageLoad` does it around ``llama_model_load_from_file`` with the load mode "none" (read,
no mapping): the anonymous memory regions that appear while the model loads are the weight
buffers, allocated before llama.cpp reads the first tensor. At the load's first progress callback
they get ``MADV_HUGEPAGE`` (the kernel then backs them with huge pages as the tensors are read in,
where ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise``), and after the
load ``MADV_COLLAPSE`` (Linux 6.1+) turns what is still in small pages into huge ones. Both are
advice: where the kernel declines, the weights stay in ordinary pages, still read, not mapped.

The cost: the weights count in the process's resident memory (a mapping shares the page cache),
and the load reads the file once. ``LOCALSPEC_MMAP=1`` keeps llama.cpp's mapping; so does any
model with layers on a GPU, and any system other than Linux.
"""

from __future__ import annotations

import ctypes
import sys
import threading

from ..core import options

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
MIN_REGION = 2 * HUGE_PAGE      # smaller new regions are not weight buffers worth a huge page

_libc = None
_lock = threading.Lock()        # one load at a time owns the advice of the progress callback
_current: "HugePageLoad | None" = None


def read_weights(n_gpu_layers: int) -> bool:
    """Whether a model's weights are read into (huge-page) memory rather than mapped."""
    if options.env_flag("LOCALSPEC_MMAP"):
        return False
    return sys.platform.startswith("linux") and n_gpu_layers == 0


def _madvise(lo: int, hi: int, advice: int) -> bool:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _libc.madvise.restype = ctypes.c_int
    return _libc.madvise(lo, hi - lo, advice) == 0


def anonymous_regions() -> set[tuple[int, int]]:
    """The process's private anonymous memory regions (start, end), from /proc/self/maps."""
    out = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split()
                if len(fields) == 5 and fields[1].startswith("rw") and fields[1].endswith("p"):
                    lo, hi = fields[0].split("-")
                    out.add((int(lo, 16), int(hi, 16)))
    except OSError:
        pass
    return out


def new_ranges(before: set[tuple[int, int]], after: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The address ranges inside ``after``'s regions and outside ``before``'s: memory mapped in
    between (the kernel merges a new mapping with an adjacent older one into one region)."""
    old = sorted(before)
    out = []
    for lo, hi in sorted(after):
        for a, b in old:
            if b <= lo or a >= hi:
                continue
            if a > lo:
                out.append((lo, a))
            lo = max(lo, b)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out


def _aligned(region: tuple[int, int]) -> tuple[int, int]:
    lo, hi = region
    return (lo + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE, hi // HUGE_PAGE * HUGE_PAGE


class HugePageLoad:
    """``with HugePageLoad(): load the model`` (load mode "none"): its weight buffers in huge pages.

    The progress callback of the load calls :func:`on_progress`; the first call advises the
    regions that appeared since ``__enter__``, the end of the block collapses them."""

    def __init__(self) -> None:
        self.before: set[tuple[int, int]] = set()
        self.regions: list[tuple[int, int]] = []
        self.advised = False

    def __enter__(self) -> "HugePageLoad":
        global _current
        _lock.acquire()
        self.before = anonymous_regions()
        _current = self
        return self

    def __exit__(self, *exc) -> None:
        global _current
        try:
            if exc[0] is None:
                self.advise()
                for region in self.regions:
                    _madvise(*region, MADV_COLLAPSE)
        finally:
            _current = None
            _lock.release()

    def advise(self) -> None:
        """Ask for huge pages on the large regions that appeared since the load began (once)."""
        if self.advised:
            return
        self.advised = True
        for region in new_ranges(self.before, anonymous_regions()):
            lo, hi = _aligned(region)
            if hi - lo >= MIN_REGION and _madvise(lo, hi, MADV_HUGEPAGE):
                self.regions.append((lo, hi))


def on_progress() -> None:
    """Called from llama.cpp's load progress callback: the weight buffers exist by its first call."""
    load = _current
    if load is not None:
        load.advise()
