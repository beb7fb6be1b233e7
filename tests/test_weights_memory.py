"""Weights read into huge-page memory (localspec.llama.weights_memory): when it applies, that the
advice reaches the regions a load allocates, and that the model computes exactly what the mapped
file computes."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from localspec.core.errors import LocalspecError
from localspec.llama import weights_memory as W
from localspec.llama.llama_model import Context, Model

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge-page advice is Linux's")


def anonymous(size: int) -> mmap.mmap:
    """Private anonymous memory, as malloc maps a large allocation."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def thp_mode() -> str:
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return "never"
    return text.split("[", 1)[1].split("]", 1)[0]


def anon_huge_kib(lo: int, hi: int) -> int:
    """AnonHugePages of the mapping that contains [lo, hi) (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                a, b = (int(x, 16) for x in head.split("-"))
                inside = a <= lo and hi <= b
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    return 0


def test_weights_are_read_only_for_cpu_models_on_linux_unless_mmap_is_asked(monkeypatch):
    monkeypatch.delenv("LOCALSPEC_MMAP", raising=False)
    linux = sys.platform.startswith("linux")
    assert W.read_weights(0) is linux
    assert W.read_weights(-1) is False and W.read_weights(12) is False   # layers on a GPU: mapped
    monkeypatch.setenv("LOCALSPEC_MMAP", "1")
    assert W.read_weights(0) is False
    monkeypatch.setenv("LOCALSPEC_MMAP", "0")
    assert W.read_weights(0) is linux
    monkeypatch.setenv("LOCALSPEC_MMAP", "maybe")
    with pytest.raises(LocalspecError, match="LOCALSPEC_MMAP must be 1 or 0"):
        W.read_weights(0)


def test_new_ranges_are_the_addresses_mapped_in_between():
    before = {(100, 200), (300, 400)}
    # a new region merged with an older one on each side, one apart, one unchanged
    after = {(50, 200), (300, 450), (500, 600), (0, 20)}
    assert W.new_ranges(before, after) == [(0, 20), (50, 100), (400, 450), (500, 600)]
    assert W.new_ranges(before, {(100, 400)}) == [(200, 300)]
    assert W.new_ranges(before, before) == []


@linux_only
def test_a_load_advises_the_regions_it_allocates_and_not_older_ones():
    older = anonymous(8 * W.HUGE_PAGE)            # there before the load: left alone
    try:
        with W.HugePageLoad() as load:
            weights = anonymous(8 * W.HUGE_PAGE)  # what llama.cpp allocates for the weights
            small = anonymous(W.HUGE_PAGE // 2)   # too small to matter
            W.on_progress()                            # the load's first progress callback
            W.on_progress()                            # later ones change nothing
            weights.write(b"\x01" * len(weights))      # the tensors read in after it
        assert W._current is None
        lo = np.frombuffer(weights, np.uint8).ctypes.data
        advised = [r for r in load.regions if r[0] <= lo + W.HUGE_PAGE and r[1] >= lo + 7 * W.HUGE_PAGE]
        assert len(advised) == 1, (hex(lo), load.regions)
        old_lo = np.frombuffer(older, np.uint8).ctypes.data
        assert not any(r[0] < old_lo + len(older) and old_lo < r[1] for r in load.regions)
        small_lo = np.frombuffer(small, np.uint8).ctypes.data
        assert not any(r[0] <= small_lo < r[1] for r in load.regions)
        if thp_mode() != "never":   # the kernel honours the advice: huge pages back the buffer
            assert anon_huge_kib(*advised[0]) >= 2048
        small.close()
        weights.close()
    finally:
        older.close()


def test_read_weights_compute_exactly_what_the_mapped_file_computes(smollm2, monkeypatch):
    prompt = None
    logits = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("LOCALSPEC_MMAP", mode)
        model = Model(smollm2)
        try:
            assert model.weights_read is (mode == "0" and sys.platform.startswith("linux"))
            ctx = Context(model, n_ctx=256, n_threads=1)
            try:
                prompt = prompt or model.tokenize("The capital of France is")
                ctx.decode(prompt, 0, all_logits=False)
                logits[mode] = ctx.logits(-1).copy()
            finally:
                ctx.close()
        finally:
            model.close()
    assert np.array_equal(logits["0"], logits["1"])
