"""Memory plan for a target + EAGLE drafter pair: weights, both KV caches, compute and output buffers,
placed on the devices of a budget (GPUs first, then system RAM).

Where the numbers come from:
- weights: the GGUF tensor table, tensor by tensor. ``blk.N.*`` belong to layer N; ``token_embd``
  stays on the CPU (llama.cpp's input layer); every other tensor (output, output_norm, a drafter's
  fc / d2t / norms) goes with the output layer, which llama.cpp offloads first. A tied lm_head is a
  second copy of token_embd on a GPU. On the CPU, llama.cpp copies the weights its kernels repack
  (Q4_0, Q4_K, IQ4_NL, MXFP4 with AVX2; Q2_K with AVX512; the ARM rules for NEON) into a
  CPU_REPACK buffer beside the mapped file: counted as such.
- KV: n_ctx x sum over layers of (n_embd_k_gqa + n_embd_v_gqa) x bytes of the KV type, from the head
  counts and key/value lengths in the metadata. The drafter's KV is F32 (it runs exact attention).
  Supported exactly: dense-attention archs (llama, qwen, mistral-like) and MoE (experts are just
  more tensors). Sliding-window (SWA) archs are counted at full context (an upper bound); recurrent
  and hybrid archs are not modelled (noted in the plan).
- compute buffers: llama.cpp's own figure, from reserving both contexts with ``no_alloc`` (weights
  and KV simulated) at the planned context, KV type and batch sizes and reading the "compute
  buffer size" lines it logs. The target context reserves only the largest verify batch's logit rows
  (``n_outputs_max`` = draft-max + 1 <= 33) instead of all 512 prompt rows; the drafter's graph
  computes logits for every row of a batch, so its buffer is sized by its 64-row batch.
- output buffers (host): logits rows of the largest batch: target draft_max+1 rows, drafter a
  whole encode chunk (it marks every row).

:func:`plan` is a pure function of the layouts, the budget and a compute-size function, so tests can
simulate any GPU. :func:`plan_for` wires it to the real files, the real devices and llama.cpp.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from ..formats import gguf_consts as K
from ..core import options
from ..core.errors import LocalspecError
from ..formats.gguf_info import GGUFInfo, TensorInfo, check_pair, check_target, read_gguf
from ..speculation.eagle import DRAFTER_BATCH, DRAFTER_CONTEXT

MiB = 1 << 20
GiB = 1 << 30
PROMPT_BATCH = 512          # the engine's n_batch = n_ubatch for the target context
VERIFY_OUTPUTS_MAX = 129    # the deepest draft (auto's lookup, policy.MAX_DEPTH 128) + 1: the target context's n_outputs_max
DRAFT_MAX_CHOICES = (8, 6, 4, 2, 1)
N_CTX_MIN = 512

# KV cache types the planner may choose: (ggml type id, bytes per element)
KV_TYPES: dict[str, tuple[int, float]] = {
    "f16": (1, 2.0),
    "q8_0": (8, 34 / 32),
    "q4_0": (2, 18 / 32),
    "f32": (0, 4.0),
}
KV_PREFERENCE = ("f16", "q8_0", "q4_0")


# -- sizes ------------------------------------------------------------------------------------------
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'12G', '12GiB', '8000M', '1.5g', '1048576' -> bytes (K/M/G/T are binary: 1G = 2^30)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise LocalspecError(f"bad size '{text}': use a number with K, M, G or T (e.g. 12G, 8000M)")
    value, unit = float(m.group(1)), (m.group(2) or "b").lower()
    scale = {"b": 1, "k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}[unit[0]]
    if not value * scale < 1 << 62:   # (inf and nan too) no machine has this much memory
        raise LocalspecError(f"bad size '{text}': too large")
    return int(value * scale)


def fmt_size(n: int | float) -> str:
    n = float(n)
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB"


# -- model layouts -----------------------------------------------------------------------------------
@dataclass
class Layout:
    """One model's memory-relevant shape, from its GGUF."""

    path: str
    arch: str
    n_layer: int
    n_embd: int
    n_vocab: int
    layer_bytes: list[int]          # blk.N.* per layer
    input_bytes: int                # token_embd (CPU)
    output_bytes: int               # every other non-layer tensor (+ a tied lm_head copy on a GPU)
    tied_output_bytes: int          # that tied copy (0 with an own output tensor)
    layer_repack: list[int]         # of layer_bytes, what the CPU repacks into a second buffer
    output_repack: int
    kv_per_token: list[int]         # per layer: n_embd_k_gqa + n_embd_v_gqa (elements)
    notes: list[str] = field(default_factory=list)

    @property
    def weights_bytes(self) -> int:
        return sum(self.layer_bytes) + self.input_bytes + self.output_bytes - self.tied_output_bytes

    @property
    def n_units(self) -> int:
        """What n_gpu_layers counts: repeating layers + the output layer."""
        return self.n_layer + 1


def _meta(info: GGUFInfo, name: str, default=None):
    return info.metadata.get(f"{info.arch}.{name}", default)


def _per_layer(value, n: int, default: int) -> list[int]:
    if value is None:
        return [default] * n
    if hasattr(value, "__len__") and not isinstance(value, str):
        vals = [int(v) for v in value]
        return (vals + [vals[-1] if vals else default] * n)[:n]
    return [int(value)] * n


def repacked(t: TensorInfo, cpu: dict[str, bool]) -> bool:
    """Whether ggml's CPU backend copies this weight into its CPU_REPACK buffer (ggml-cpu/repack.cpp
    rules for the types and CPU features it repacks; only matrix weights, never token_embd)."""
    if len(t.shape) < 2 or t.name.startswith("token_embd"):
        return False
    rows = t.shape[1]
    avx2, neon = cpu.get("avx2", False), cpu.get("neon", False)
    i8mm, dot = cpu.get("matmul_int8", False), cpu.get("dotprod", False)
    kind = t.type_name
    if kind == "Q4_0":
        return (avx2 and rows % 8 == 0) or (neon and (i8mm or dot) and rows % 4 == 0)
    if kind == "Q4_K":
        return (avx2 or (neon and (i8mm or dot))) and rows % 8 == 0
    if kind in ("IQ4_NL", "MXFP4"):
        return (avx2 and rows % 8 == 0) or (neon and dot and rows % 4 == 0)
    if kind == "Q2_K":
        return cpu.get("avx512", False) and rows % 8 == 0
    if kind in ("Q5_K", "Q6_K"):
        return neon and (i8mm or dot) and rows % 8 == 0
    if kind == "Q8_0":
        return neon and (i8mm or dot) and rows % 4 == 0
    return False


def layout(info: GGUFInfo, cpu_features: dict[str, bool] | None = None) -> Layout:
    cpu = cpu_features or {}
    n_layer = info.n_layer
    layer_bytes, layer_repack = [0] * n_layer, [0] * n_layer
    input_bytes = output_bytes = output_repack = 0
    notes: list[str] = []
    for t in info.tensors.values():
        m = re.match(r"blk\.(\d+)\.", t.name)
        rep = t.n_bytes if repacked(t, cpu) else 0
        if m and int(m.group(1)) < n_layer:
            i = int(m.group(1))
            layer_bytes[i] += t.n_bytes
            layer_repack[i] += rep
        elif t.name.startswith("token_embd"):
            input_bytes += t.n_bytes
        else:
            output_bytes += t.n_bytes
            output_repack += rep
    tied = 0
    embd = info.tensors.get("token_embd.weight")
    if "output.weight" not in info.tensors and embd is not None and not info.is_drafter:
        tied = embd.n_bytes  # llama.cpp duplicates token_embd as the lm_head on the output device
        output_bytes += tied
        output_repack += embd.n_bytes if repacked(TensorInfo("output.weight", embd.shape, embd.type_name, embd.n_bytes), cpu) else 0
    n_head = _per_layer(_meta(info, "attention.head_count"), n_layer, 1)
    n_head_kv = _per_layer(_meta(info, "attention.head_count_kv"), n_layer, 0)
    n_head_kv = [kv or h for kv, h in zip(n_head_kv, n_head)]
    head_dim = info.n_embd // max(1, n_head[0]) if info.n_embd else 0
    k_len = int(_meta(info, "attention.key_length", head_dim) or head_dim)
    v_len = int(_meta(info, "attention.value_length", head_dim) or head_dim)
    kv = [h * (k_len + v_len) for h in n_head_kv]
    if _meta(info, "attention.sliding_window") is not None:
        notes.append(f"{info.arch}: sliding-window layers counted at full context (upper bound)")
    if any(k.startswith(f"{info.arch}.ssm.") or k.startswith(f"{info.arch}.rwkv") for k in info.metadata):
        notes.append(f"{info.arch}: recurrent state not modelled; KV estimate covers attention layers only")
    return Layout(str(info.path), info.arch, n_layer, info.n_embd, info.n_vocab, layer_bytes, input_bytes,
                  output_bytes, tied, layer_repack, output_repack, kv, notes)


# -- budget and plan ---------------------------------------------------------------------------------
@dataclass
class DeviceBudget:
    name: str            # "CPU" or a GPU's ggml name ("CUDA0", "MTL0", or "GPU" in a simulation)
    budget_bytes: int
    is_gpu: bool = False


@dataclass
class Part:
    """One model's share of the plan."""

    role: str
    path: str
    gpu_layers: int              # n_gpu_layers for llama.cpp (0..n_layer+1)
    n_units: int
    weights_bytes: int           # the GGUF's weights (all devices)
    repack_bytes: int            # CPU_REPACK copies on the CPU
    kv_bytes: int
    kv_type: str
    compute_bytes: int           # llama.cpp compute buffers, all devices
    output_bytes: int            # host logits/embedding rows
    gpu_bytes: int = 0
    cpu_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.gpu_bytes + self.cpu_bytes


@dataclass
class DeviceUse:
    name: str
    is_gpu: bool
    budget_bytes: int
    margin_bytes: int
    used_bytes: int
    target_bytes: int
    drafter_bytes: int

    @property
    def fits(self) -> bool:
        return self.used_bytes + self.margin_bytes <= self.budget_bytes


@dataclass
class Plan:
    fits: bool
    budget_bytes: int
    total_bytes: int
    n_ctx: int
    kv_type: str
    draft_max: int
    target: Part
    drafter: Part | None
    devices: list[DeviceUse]
    n_outputs_max: int = VERIFY_OUTPUTS_MAX
    notes: list[str] = field(default_factory=list)
    reason: str = ""

    def to_dict(self) -> dict:
        def part(p: Part | None):
            if p is None:
                return None
            d = asdict(p)
            d["total_bytes"] = p.total_bytes
            return d

        return {
            "fits": self.fits, "budget_bytes": self.budget_bytes, "total_bytes": self.total_bytes,
            "n_ctx": self.n_ctx, "kv_type": self.kv_type, "draft_max": self.draft_max,
            "n_outputs_max": self.n_outputs_max,
            "target": part(self.target), "drafter": part(self.drafter),
            "devices": [dict(asdict(d), fits=d.fits) for d in self.devices],
            "notes": list(self.notes), "reason": self.reason,
        }


def default_margin(budget: int, is_gpu: bool) -> int:
    """Safety margin kept free on a device: 5% (+256 MiB on a GPU for the driver's own context)."""
    return int(budget * 0.05) + (256 * MiB if is_gpu else 0)


ComputeFn = Callable[[int, str, int, int], tuple[int, int]]
"""(n_ctx, kv_type, target_gpu_layers, drafter_gpu_layers) -> (target compute bytes, drafter compute bytes)."""


def _gpu_units(lay: Layout, ngl: int) -> tuple[bool, list[int]]:
    """Output on GPU?, and the repeating layers on GPU (llama.cpp offloads output first, then the last layers)."""
    ngl = max(0, min(ngl, lay.n_units))
    out = ngl >= 1
    n_rep = ngl - 1 if out else 0
    return out, list(range(lay.n_layer - n_rep, lay.n_layer))


def _split(lay: Layout, ngl: int, n_ctx: int, kv_bytes_per_elem: float, compute: int,
           output: int) -> tuple[int, int, int, int, int]:
    """(gpu_bytes, cpu_bytes, weights, repack, kv) of one model at ngl offloaded units."""
    out_gpu, gpu_layers = _gpu_units(lay, ngl)
    gpu_set = set(gpu_layers)
    kv_layer = [int(n_ctx * e * kv_bytes_per_elem) for e in lay.kv_per_token]
    gpu = cpu = repack = 0
    for i in range(lay.n_layer):
        if i in gpu_set:
            gpu += lay.layer_bytes[i] + kv_layer[i]
        else:
            cpu += lay.layer_bytes[i] + lay.layer_repack[i] + kv_layer[i]
            repack += lay.layer_repack[i]
    cpu += lay.input_bytes
    if out_gpu:
        gpu += lay.output_bytes
    else:
        cpu += lay.output_bytes - lay.tied_output_bytes + lay.output_repack
        repack += lay.output_repack
    all_gpu = out_gpu and len(gpu_layers) == lay.n_layer
    if ngl > 0:
        gpu += compute
        # the host still runs the input layer (and whatever stayed on the CPU)
        cpu += compute if not all_gpu else PROMPT_BATCH * lay.n_embd * 4 * 2
    else:
        cpu += compute
    cpu += output
    return gpu, cpu, lay.weights_bytes, repack, sum(kv_layer)


def _output_bytes(lay: Layout, rows: int, embd_rows: int = 0) -> int:
    return rows * lay.n_vocab * 4 + embd_rows * lay.n_embd * 4 * 2


def plan(target: Layout, drafter: Layout | None, devices: list[DeviceBudget], compute: ComputeFn, *,
         n_ctx: int | None = None, kv_type: str | None = None, draft_max: int | None = None,
         n_ctx_max: int | None = None, gpu_layers: int | None = None, drafter_gpu_layers: int | None = None,
         margins: dict[str, int] | None = None) -> Plan:
    """The best plan that fits, or the smallest one tried, marked ``fits=False`` with its sizes.

    Preference: the requested context and F16 KV, then smaller KV types (q8_0, q4_0), then halving
    the context down to 512. Within each, the drafter is placed on the GPU first (it runs several
    times per cycle), then the target's output layer and its last layers, as many as fit; the rest is
    system RAM. Given values (n_ctx, kv_type, draft_max, gpu layers) are kept as they are.
    """
    if not devices or devices[0].is_gpu:
        raise LocalspecError("internal: the first device of a budget must be the CPU")
    for name in (kv_type,) if kv_type else ():
        if name not in KV_TYPES:
            raise LocalspecError(f"unknown KV type '{name}' ({', '.join(KV_TYPES)})")
    cpu_dev, gpus = devices[0], [d for d in devices[1:] if d.is_gpu]
    gpu_dev = gpus[0] if gpus else None  # one GPU is planned; more are left to llama.cpp's split
    margins = dict(margins or {})
    for d in devices:
        margins.setdefault(d.name, default_margin(d.budget_bytes, d.is_gpu))
    want_ctx = n_ctx or n_ctx_max or 4096
    if n_ctx is not None:
        n_ctx = options.check_n_ctx(n_ctx)
        ctx_choices = [n_ctx]
    else:
        ctx_choices, c = [], want_ctx
        while c >= N_CTX_MIN:
            ctx_choices.append(c)
            c //= 2
        ctx_choices = ctx_choices or [want_ctx]
    kv_choices = [kv_type] if kv_type else list(KV_PREFERENCE)
    notes = list(target.notes) + (list(drafter.notes) if drafter else [])
    if len(gpus) > 1:
        notes.append(f"{len(gpus)} GPUs seen; the plan places layers on {gpus[0].name} only")

    total_budget = sum(d.budget_bytes for d in devices)
    best_fail: Plan | None = None
    for c in ctx_choices:
        for kv in kv_choices:
            # weights and KV alone over every device's memory: llama.cpp is never asked about this
            # context (reserving a huge one allocates its cell bookkeeping for real)
            hopeless = lower_bound(target, drafter, c, kv) > total_budget
            p = _place(target, drafter, cpu_dev, gpu_dev, (lambda *a: (0, 0)) if hopeless else compute, c, kv,
                       draft_max, gpu_layers, drafter_gpu_layers, margins, notes)
            if p.fits:
                return p
            if best_fail is None or p.total_bytes < best_fail.total_bytes:
                best_fail = p
    assert best_fail is not None
    over = [f"{d.name} needs {fmt_size(d.used_bytes + d.margin_bytes)} (with a {fmt_size(d.margin_bytes)} margin) "
            f"but has {fmt_size(d.budget_bytes)}" for d in best_fail.devices if not d.fits]
    best_fail.reason = ("does not fit even at context " f"{best_fail.n_ctx} with {best_fail.kv_type} KV: "
                        + "; ".join(over))
    return best_fail


def lower_bound(target: Layout, drafter: Layout | None, n_ctx: int, kv: str) -> int:
    """Bytes a context of ``n_ctx`` needs at the least: the weights and both KV caches."""
    total = target.weights_bytes + int(n_ctx * sum(target.kv_per_token) * KV_TYPES[kv][1])
    if drafter is not None:
        total += drafter.weights_bytes + int(n_ctx * sum(drafter.kv_per_token) * KV_TYPES["f32"][1])
    return total


def _place(target: Layout, drafter: Layout | None, cpu_dev: DeviceBudget, gpu_dev: DeviceBudget | None,
           compute: ComputeFn, n_ctx: int, kv: str, draft_max: int | None, ngl_fixed: int | None,
           dngl_fixed: int | None, margins: dict[str, int], notes: list[str]) -> Plan:
    kv_t = KV_TYPES[kv][1]
    kv_d = KV_TYPES["f32"][1]  # the drafter's exact attention keeps an F32 cache
    dm = draft_max or DRAFT_MAX_CHOICES[0]
    t_out = _output_bytes(target, min(dm + 1, VERIFY_OUTPUTS_MAX), 0)
    d_out = _output_bytes(drafter, DRAFTER_BATCH, DRAFTER_BATCH) if drafter else 0
    gpu_free = (gpu_dev.budget_bytes - margins[gpu_dev.name]) if gpu_dev else 0

    def split(ngl: int, dngl: int):
        tc, dc = compute(n_ctx, kv, ngl, dngl)
        t = _split(target, ngl, n_ctx, kv_t, tc, t_out)
        d = _split(drafter, dngl, n_ctx, kv_d, dc, d_out) if drafter else (0, 0, 0, 0, 0)
        return t, d, tc, dc

    # drafter first: as many of its units as fit alone, then the target's in what is left
    if gpu_dev is None:
        dngl, ngl = 0, 0
    else:
        dngl = dngl_fixed if dngl_fixed is not None else 0
        if drafter is not None and dngl_fixed is None:
            for k in range(drafter.n_units, 0, -1):
                if split(0, k)[1][0] <= gpu_free:
                    dngl = k
                    break
        if ngl_fixed is not None:
            ngl = ngl_fixed
        else:
            ngl = 0
            lo, hi = 1, target.n_units   # gpu bytes grow with ngl: binary search the largest that fits
            while lo <= hi:
                mid = (lo + hi) // 2
                t, d, _, _ = split(mid, dngl)
                if t[0] + d[0] <= gpu_free:
                    ngl, lo = mid, mid + 1
                else:
                    hi = mid - 1
    if ngl_fixed is None and ngl < 0:
        ngl = 0
    ngl = target.n_units if ngl < 0 else ngl
    if drafter is not None:
        dngl = drafter.n_units if dngl < 0 else dngl
    t, d, tc, dc = split(ngl, dngl)
    # draft depth: deeper when verification runs on a GPU (a batch costs about one step there)
    if draft_max is None:
        dm = 8 if gpu_dev is not None and ngl >= target.n_units else 4
        t_out2 = _output_bytes(target, dm + 1)
        t = (t[0], t[1] - t_out + t_out2, *t[2:])
    devices = [DeviceUse(cpu_dev.name, False, cpu_dev.budget_bytes, margins[cpu_dev.name], t[1] + d[1], t[1], d[1])]
    if gpu_dev is not None:
        devices.append(DeviceUse(gpu_dev.name, True, gpu_dev.budget_bytes, margins[gpu_dev.name],
                                 t[0] + d[0], t[0], d[0]))
    tpart = Part("target", target.path, ngl, target.n_units, t[2], t[3], t[4], kv, tc,
                 _output_bytes(target, dm + 1), t[0], t[1])
    dpart = (Part("drafter", drafter.path, dngl, drafter.n_units, d[2], d[3], d[4], "f32", dc, d_out, d[0], d[1])
             if drafter else None)
    total = sum(x.used_bytes for x in devices)
    budget = sum(x.budget_bytes for x in devices)
    return Plan(all(x.fits for x in devices), budget, total, n_ctx, kv, dm, tpart, dpart, devices,
                notes=list(notes))


# -- llama.cpp's own figures -------------------------------------------------------------------------
_BUF_RE = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size\s*=\s*([\d.]+) MiB")


def parse_buffers(lines: Iterable[str]) -> list[tuple[str, str, int]]:
    """llama.cpp's "<buffer> <kind> buffer size = X MiB" log lines -> [(buffer, kind, bytes)]."""
    text = "".join(lines)
    return [(m.group(1), m.group(2).lower(), int(round(float(m.group(3)) * MiB))) for m in _BUF_RE.finditer(text)]


def is_host_buffer(name: str) -> bool:
    return name.startswith("CPU") or name.endswith("_Host")


class LlamaCompute:
    """Compute-buffer sizes from llama.cpp: both contexts reserved with ``no_alloc`` (no weights read,
    no KV allocated), cached by configuration. Returns the sum over devices of "compute buffer size"."""

    def __init__(self, target: str | Path, drafter: str | Path | None, *, n_threads: int | None = None) -> None:
        self.target, self.drafter, self.n_threads = str(target), (str(drafter) if drafter else None), n_threads
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
        from ..runtime.engine import target_context
        from ..llama.llama_model import Context, Model

        n_ctx = options.check_n_ctx(n_ctx)   # never a llama.cpp context from an unchecked value
        tm = Model(self.target, n_gpu_layers=ngl, no_alloc=True)
        tc = dm = dc = None
        try:
            tc = Context(tm, n_ctx=n_ctx, n_batch=PROMPT_BATCH, n_threads=self.n_threads,
                         kv_type=KV_TYPES[kv][0], n_outputs_max=VERIFY_OUTPUTS_MAX,
                         **target_context(self.drafter is not None))
            t_bufs = parse_buffers(tc.load_log)
            d_bufs: list = []
            if self.drafter:
                dm = Model(self.drafter, n_gpu_layers=dngl, no_alloc=True)
                dc = Context(dm, n_ctx=n_ctx, n_batch=DRAFTER_BATCH, n_threads=self.n_threads, ctx_other=tc,
                             **DRAFTER_CONTEXT)
                d_bufs = parse_buffers(dc.load_log)
        finally:
            for obj in (dc, dm, tc, tm):
                if obj is not None:
                    obj.close()
        self.buffers[(n_ctx, kv, ngl, dngl)] = [("target", *b) for b in t_bufs] + [("drafter", *b) for b in d_bufs]
        return (sum(b[2] for b in t_bufs if b[1] == "compute"), sum(b[2] for b in d_bufs if b[1] == "compute"))


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


def plan_files(target: str | Path, drafter: str | Path | None, *, vram: int | None = None, ram: int | None = None,
               n_ctx: int | None = None, n_ctx_max: int | None = None, kv_type: str | None = None, draft_max: int | None = None,
               gpu_layers: int | None = None, drafter_gpu_layers: int | None = None,
               n_threads: int | None = None) -> Plan:
    """Plan a real pair: read both GGUFs, ask llama.cpp for compute buffers, budget the real devices."""
    from ..llama import backends

    tinfo = read_gguf(target)
    if n_ctx is not None:   # before llama.cpp is asked anything about it
        n_ctx = options.check_n_ctx(n_ctx, tinfo.n_ctx_train, model=tinfo.path.name)
    if draft_max is not None:
        draft_max = options.check("draft_max", draft_max)
    dinfo = read_gguf(drafter) if drafter else None
    if dinfo is not None:
        check_pair(tinfo, dinfo)  # llama.cpp aborts the process on a mismatched pair
    else:
        check_target(tinfo)
    cpu = backends.detect().cpu_features
    tl = layout(tinfo, cpu)
    dl = layout(dinfo, cpu) if dinfo else None
    devices = device_budgets(vram, ram)
    compute = LlamaCompute(tinfo.path, dinfo.path if dinfo else None, n_threads=n_threads)
    simulated = any(d.name == "GPU" for d in devices)
    result = plan(tl, dl, devices, compute, n_ctx=n_ctx, kv_type=kv_type, draft_max=draft_max,
                  n_ctx_max=n_ctx_max or min(tinfo.n_ctx_train or 4096, 4096), gpu_layers=gpu_layers,
                  drafter_gpu_layers=drafter_gpu_layers)
    if simulated:
        result.notes.append("no GPU in this llama.cpp build: --vram simulates one (GPU compute buffers "
                            "estimated as the CPU's)")
    if not backends.detect().gpu_offload and not simulated:
        result.notes.append("this llama.cpp build has no GPU backend: everything runs on the CPU")
    return result


# -- what llama.cpp actually allocated ---------------------------------------------------------------
def _rss_bytes() -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def actual_memory(engine) -> dict:
    """llama.cpp's own buffer sizes for the engine's models and contexts (from their load logs):
    per role, weights (model buffers, mapped + repacked), KV and compute, per device."""
    out: dict = {}
    parts = [("target", engine.model, engine.ctx)]
    if engine.drafter is not None:
        parts.append(("drafter", engine.drafter.model, engine.drafter.ctx))
    for role, model, ctx in parts:
        bufs = parse_buffers(getattr(model, "load_log", [])) + parse_buffers(getattr(ctx, "load_log", []))
        entry = {"weights_bytes": 0, "kv_bytes": 0, "compute_bytes": 0, "output_bytes": 0, "buffers": {}}
        for name, kind, n in bufs:
            key = {"model": "weights_bytes", "kv": "kv_bytes", "compute": "compute_bytes", "output": "output_bytes"}[kind]
            entry[key] += n
            entry["buffers"][f"{name} {kind}"] = entry["buffers"].get(f"{name} {kind}", 0) + n
        entry["total_bytes"] = entry["weights_bytes"] + entry["kv_bytes"] + entry["compute_bytes"] + entry["output_bytes"]
        out[role] = entry
    out["total_bytes"] = sum(v["total_bytes"] for v in out.values() if isinstance(v, dict))
    out["rss_bytes"] = _rss_bytes()
    return out


def memory_report(engine) -> dict:
    """Planned vs actual (llama.cpp's load-time buffers; the logits buffers grow later and are planned)."""
    actual = actual_memory(engine)
    plan_ = getattr(engine, "plan", None)
    report = {"actual": actual}
    if plan_ is not None:
        def planned(p: Part | None):
            if p is None:
                return None
            return {"weights_bytes": p.weights_bytes + p.repack_bytes, "kv_bytes": p.kv_bytes,
                    "compute_bytes": p.compute_bytes, "output_bytes": p.output_bytes,
                    "total_bytes": p.total_bytes, "gpu_layers": p.gpu_layers}

        report["planned"] = {"target": planned(plan_.target), "drafter": planned(plan_.drafter),
                             "total_bytes": plan_.total_bytes, "n_ctx": plan_.n_ctx, "kv_type": plan_.kv_type,
                             "fits": plan_.fits}
    return report


# -- the hook the CLI uses to build an Engine from a plan --------------------------------------------
def plan_for(spec, *, n_ctx: int, n_threads: int | None = None, gpu_layers: int | None = None,
             vram: str | int | None = None, ram: str | int | None = None, kv_type: str | None = None) -> dict:
    """Engine keyword arguments from a memory plan for ``spec`` (a models.ModelSpec): n_ctx,
    n_gpu_layers, drafter_gpu_layers, kv_type, n_outputs_max, plan. Manual values win:
    ``gpu_layers`` (the target's; the drafter then goes fully on the GPU if any GPU is used),
    ``kv_type``. The requested context is kept if it fits, else the largest that fits is used.
    Without a GPU and without ``vram`` nothing is offloaded, as before."""
    import sys

    vram_b = parse_size(vram) if isinstance(vram, str) else vram
    ram_b = parse_size(ram) if isinstance(ram, str) else ram
    kwargs = dict(vram=vram_b, ram=ram_b, kv_type=kv_type, n_threads=n_threads)
    if gpu_layers is not None:
        kwargs.update(gpu_layers=gpu_layers, drafter_gpu_layers=-1 if gpu_layers else 0)
    drafter = spec.drafter if spec.drafter is not None and Path(spec.drafter).is_file() else None
    p = plan_files(spec.target, drafter, n_ctx=n_ctx, **kwargs)
    if not p.fits:
        flexible = plan_files(spec.target, drafter, n_ctx=None, n_ctx_max=n_ctx, **kwargs)
        if flexible.fits:
            print(f"note: context {n_ctx} does not fit the memory budget; using {flexible.n_ctx} "
                  f"({flexible.kv_type} KV)", file=sys.stderr)
            p = flexible
        else:   # not even the smallest context fits: nothing is allocated beyond the budget
            raise LocalspecError(f"the model does not fit the memory budget: {p.reason} "
                                 "(see `localspec fit`)")
    simulated_gpu = any(d.name == "GPU" for d in p.devices)
    ngl = p.target.gpu_layers if not simulated_gpu else 0
    dngl = p.drafter.gpu_layers if (p.drafter and not simulated_gpu) else 0
    if gpu_layers is not None:
        ngl, dngl = gpu_layers, (-1 if gpu_layers else 0)
    return dict(n_ctx=p.n_ctx, n_gpu_layers=ngl, drafter_gpu_layers=dngl, kv_type=p.kv_type,
                n_outputs_max=p.n_outputs_max, plan=p)
