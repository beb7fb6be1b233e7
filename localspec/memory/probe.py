"""What llama.cpp says about memory: the compute buffers it reserves for the two contexts (measured
with ``no_alloc``: no weights read, no KV allocated), the buffer sizes it logs, and the devices it
sees with their free memory (the planner's budget)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from ..core import options
from ..core.units import MiB
from ..llama.contexts import KV_TYPES, PROMPT_BATCH, VERIFY_OUTPUTS_MAX, target_context
from .planner import DeviceBudget

_BUF_RE = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size\s*=\s*([\d.]+) MiB")


def parse_buffers(lines: Iterable[str]) -> list[tuple[str, str, int]]:
    """llama.cpp's "<buffer> <kind> buffer size = X MiB" log lines -> [(buffer, kind, bytes)]."""
    text = "".join(lines)
    return [(m.group(1), m.group(2).lower(), int(round(float(m.group(3)) * MiB))) for m in _BUF_RE.finditer(text)]


def is_host_buffer(name: str) -> bool:
    return name.startswith("CPU") or name.endswith("_Host")


class LlamaCompute:
    """Compute-buffer sizes from llama.cpp: both contexts reserved with ``no_alloc`` (no weights read,
    no KV allocated), cached by configuration. Returns the sum over devices of "compute buffer size".
    A :data:`localspec.memory.planner.ComputeFn`. ``mtp``: the target drafts with its MTP heads (no
    drafter): its second figure is the MTP context's, opened as MtpDrafter opens it."""

    def __init__(self, target: str | Path, drafter: str | Path | None, *, n_threads: int | None = None,
                 mtp: bool = False) -> None:
        self.target, self.drafter, self.n_threads = str(target), (str(drafter) if drafter else None), n_threads
        self.mtp = mtp and drafter is None
        self._cache: dict[tuple, tuple[int, int]] = {}
        self.buffers: dict[tuple, list[tuple[str, str, int]]] = {}

    def __call__(self, n_ctx: int, kv: str, ngl: int, dngl: int) -> tuple[int, int]:
        from ..llama import backends
        gpu = bool(backends.detect().gpus)
        key = (n_ctx, kv, ngl if gpu else 0, dngl if gpu else 0)
        if key not in self._cache:
            self._cache[key] = self._reserve(*key)
        return self._cache[key]

    def _reserve(self, n_ctx: int, kv: str, ngl: int, dngl: int) -> tuple[int, int]:
        from ..llama.llama_model import Context, Model
        from ..llama.contexts import DRAFTER_BATCH, DRAFTER_CONTEXT, mtp_context_settings

        n_ctx = options.check_n_ctx(n_ctx)   # never a llama.cpp context from an unchecked value
        tm = Model(self.target, n_gpu_layers=ngl, no_alloc=True, load_mtp=self.mtp)
        tc = dm = dc = None
        try:
            tc = Context(tm, n_ctx=n_ctx, n_batch=PROMPT_BATCH, n_threads=self.n_threads,
                         kv_type=KV_TYPES[kv][0], n_outputs_max=VERIFY_OUTPUTS_MAX,
                         **target_context(self.drafter is not None or self.mtp))
            t_bufs = parse_buffers(tc.load_log)
            d_bufs: list = []
            if self.mtp:
                dc = Context(tm, n_ctx=n_ctx, n_batch=DRAFTER_BATCH, n_threads=self.n_threads, ctx_other=tc,
                             **mtp_context_settings())   # as speculation.mtp.mtp_context opens it
                d_bufs = parse_buffers(dc.load_log)
            elif self.drafter:
                dm = Model(self.drafter, n_gpu_layers=dngl, no_alloc=True)
                dc = Context(dm, n_ctx=n_ctx, n_batch=_drafter_batch(self.drafter), n_threads=self.n_threads,
                             ctx_other=tc, **DRAFTER_CONTEXT)
                d_bufs = parse_buffers(dc.load_log)
        finally:
            for obj in (dc, dm, tc, tm):
                if obj is not None:
                    obj.close()
        self.buffers[(n_ctx, kv, ngl, dngl)] = [("target", *b) for b in t_bufs] + [("drafter", *b) for b in d_bufs]
        return (sum(b[2] for b in t_bufs if b[1] == "compute"), sum(b[2] for b in d_bufs if b[1] == "compute"))


def _drafter_batch(path) -> int:
    """The drafter context's batch: EAGLE's, or a block drafter's block (speculation.dflash)."""
    from ..formats import gguf_consts as K
    from ..formats.gguf_info import read_gguf
    from ..llama.contexts import DRAFTER_BATCH, block_drafter_batch

    info = read_gguf(path)
    if not info.is_block_drafter:
        return DRAFTER_BATCH
    return block_drafter_batch(int(info.metadata.get(K.key(K.KEY_BLOCK_SIZE, K.DFLASH_ARCH), DRAFTER_BATCH - 1)))


def device_budgets(vram: int | None = None, ram: int | None = None) -> list[DeviceBudget]:
    """The CPU (RAM: --ram or MemAvailable) and the first GPU llama.cpp sees (--vram or its free memory).
    ``--vram`` on a CPU-only build simulates a GPU of that size (the plan says what would be offloaded)."""
    from ..llama import backends

    info = backends.detect(refresh=True)
    cpu = info.devices[0]
    out = [DeviceBudget("CPU", ram if ram is not None else cpu.free_bytes, False)]
    gpus = info.gpus
    if gpus:
        for g in gpus:
            out.append(DeviceBudget(g.name, vram if vram is not None and g is gpus[0] else g.free_bytes, True))
    elif vram:
        out.append(DeviceBudget("GPU", vram, True))
    return out
