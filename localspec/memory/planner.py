"""The memory planner, pure: a target + EAGLE drafter pair's weights, both KV caches, compute and
output buffers, placed on the devices of a budget (GPUs first, then system RAM). A target that
drafts with its own MTP heads (no drafter file) has them as a part of their own (``Plan.mtp``).

Pure means: a function of the layouts, the budget and a compute-size function. No llama.cpp, no
files, no printing: :mod:`localspec.memory.probe` measures compute buffers and device budgets,
:mod:`localspec.memory.pair` wires both to real files, and tests can simulate any GPU.

Where the numbers come from:
- weights: the GGUF tensor table, tensor by tensor. ``blk.N.*`` belong to layer N; ``token_embd``
  stays on the CPU (llama.cpp's input layer); every other tensor (output, output_norm, a drafter's
  fc / d2t / norms) goes with the output layer, which llama.cpp offloads first. A tied lm_head is a
  second copy of token_embd on a GPU. On the CPU, llama.cpp copies the weights its kernels repack
  (Q4_0, Q4_K, IQ4_NL, MXFP4 with AVX2; Q2_K with AVX512; the ARM rules for NEON) into a
  CPU_REPACK buffer beside the mapped file: counted as such. Where the engine reads the weights
  instead of mapping them (a model left on a Linux CPU, ``Layout.weights_read``), a repacked tensor
  is held only in CPU_REPACK: no second copy (docs/cli.md, "fit").
- KV: n_ctx x sum over layers of (n_embd_k_gqa + n_embd_v_gqa) x bytes of the KV type, from the head
  counts and key/value lengths in the metadata. The drafter's KV is F32 (it runs exact attention).
  Supported exactly: dense-attention archs (llama, qwen, mistral-like) and MoE (experts are just
  more tensors). Sliding-window (SWA) archs are counted at full context (an upper bound); recurrent
  and hybrid archs are not modelled (noted in the plan).
- compute buffers: the ``ComputeFn`` given (llama.cpp's own figure in real use, see
  :class:`localspec.memory.probe.LlamaCompute`). The target context reserves only the largest
  verify batch's logit rows (``n_outputs_max``: the longest draft + 1, 129) instead of all 512 prompt
  rows; the drafter's graph computes logits for every row of a batch, so its buffer is sized by
  its 64-row batch.
- output buffers (host): logits rows of the largest batch: target draft_max+1 rows, drafter a
  whole encode chunk (it marks every row).
- MTP heads (``{arch}.nextn_predict_layers`` blocks past the trunk, ``Layout.n_nextn``): llama.cpp
  loads their weights only with ``load_mtp`` (else ``TENSOR_SKIP``: not counted), and no KV of the
  target's context holds them (``llama_model::create_memory`` filters the layers ``>= n_layer()``
  out of it); drafting with them, their KV is the MTP context's (those layers only, llama.cpp's
  default F16 cache, as :class:`localspec.speculation.mtp.MtpDrafter` opens it), with a compute
  buffer and logits rows of its own (``ComputeFn``'s drafter figure when there is no drafter). They
  are the model's last blocks, so a partial offload puts them on the GPU first.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable

from ..core import options
from ..core.errors import LocalspecError
from ..core.units import MiB, format_size
from ..llama.contexts import DRAFTER_BATCH, KV_TYPES, PROMPT_BATCH, VERIFY_OUTPUTS_MAX, block_drafter_batch

if TYPE_CHECKING:  # pragma: no cover - the planner reads a GGUFInfo, it never opens a file
    from ..formats.gguf_info import GGUFInfo

DRAFT_MAX_CHOICES = (8, 6, 4, 2, 1)
N_CTX_MIN = 512
KV_PREFERENCE = ("f16", "q8_0", "q4_0")


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
    tied_repack: int = 0            # of output_repack, a tied lm_head's repacked copy of token_embd
    # weights read into memory when the model stays on the CPU (localspec.llama.weights_memory):
    # a repacked tensor is then held once, in CPU_REPACK, not beside a mapped copy of the file
    weights_read: bool = False
    n_nextn: int = 0                # the last blocks are MTP heads: never in the target context's KV
    mtp: bool = False               # the heads are loaded and draft (their weights, their own KV)
    block_rows: int = 0             # a block drafter's (DFlash, DSpark) batch: its block; 0: EAGLE's

    @property
    def n_trunk(self) -> int:
        """The blocks the target's own graph and KV cache run (all but the MTP heads)."""
        return self.n_layer - self.n_nextn

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


def repacked(t, cpu: dict[str, bool]) -> bool:
    """Whether ggml's CPU backend copies this weight (a ``gguf_info.TensorInfo``) into its CPU_REPACK
    buffer (ggml-cpu/repack.cpp rules for the types and CPU features it repacks; only matrix
    weights, never token_embd)."""
    return not t.name.startswith("token_embd") and _repacks(t.type_name, t.shape, cpu)


def _repacks(kind: str, shape, cpu: dict[str, bool]) -> bool:
    if len(shape) < 2:
        return False
    rows = shape[1]
    avx2, neon = cpu.get("avx2", False), cpu.get("neon", False)
    i8mm, dot = cpu.get("matmul_int8", False), cpu.get("dotprod", False)
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


def nextn_layers(info: GGUFInfo) -> int:
    """How many of the model's blocks are MTP (NextN) heads, as llama.cpp's hparams count them
    (``{arch}.nextn_predict_layers``; 0 when absent or out of range)."""
    n = _meta(info, "nextn_predict_layers", 0)
    ok = isinstance(n, numbers.Integral) and not isinstance(n, bool) and 0 < int(n) < info.n_layer
    return int(n) if ok else 0


def layout(info: GGUFInfo, cpu_features: dict[str, bool] | None = None, *, weights_read: bool = False,
           mtp: bool = False) -> Layout:
    """The memory-relevant shape of the model ``info`` describes (CPU features: what the CPU repacks;
    ``weights_read``: how the engine holds the weights of a model left on the CPU; ``mtp``: its MTP
    heads are loaded to draft, else their weights are skipped as llama.cpp skips them)."""
    cpu = cpu_features or {}
    n_layer = info.n_layer
    n_nextn = nextn_layers(info)
    layer_bytes, layer_repack = [0] * n_layer, [0] * n_layer
    input_bytes = output_bytes = output_repack = 0
    notes: list[str] = []
    for t in info.tensors.values():
        m = re.match(r"blk\.(\d+)\.", t.name)
        rep = t.n_bytes if repacked(t, cpu) else 0
        if m and int(m.group(1)) < n_layer:
            i = int(m.group(1))
            if i >= n_layer - n_nextn and not mtp:
                continue   # an MTP head's tensor, not loaded without load_mtp
            layer_bytes[i] += t.n_bytes
            layer_repack[i] += rep
        elif t.name.startswith("token_embd"):
            input_bytes += t.n_bytes
        else:
            output_bytes += t.n_bytes
            output_repack += rep
    tied = tied_repack = 0
    embd = info.tensors.get("token_embd.weight")
    if "output.weight" not in info.tensors and embd is not None and not info.is_drafter:
        tied = embd.n_bytes  # llama.cpp duplicates token_embd as the lm_head on the output device
        output_bytes += tied
        tied_repack = embd.n_bytes if _repacks(embd.type_name, embd.shape, cpu) else 0
        output_repack += tied_repack
    n_head = _per_layer(_meta(info, "attention.head_count"), n_layer, 1)
    n_head_kv = _per_layer(_meta(info, "attention.head_count_kv"), n_layer, 0)
    n_head_kv = [kv or h for kv, h in zip(n_head_kv, n_head)]
    head_dim = info.n_embd // max(1, n_head[0]) if info.n_embd else 0
    k_len = int(_meta(info, "attention.key_length", head_dim) or head_dim)
    v_len = int(_meta(info, "attention.value_length", head_dim) or head_dim)
    kv = [h * (k_len + v_len) for h in n_head_kv]
    shared = int(_meta(info, "attention.shared_kv_layers", 0) or 0)   # gemma3n/gemma4: reuse earlier layers' KV
    kv = [0 if info.is_assistant or i >= n_layer - shared else e for i, e in enumerate(kv)]
    if info.is_assistant:
        notes.append(f"{info.arch}: no KV cache of its own (it reads the target's)")
    elif _meta(info, "attention.sliding_window") is not None:
        notes.append(f"{info.arch}: sliding-window layers counted at full context (upper bound)")
    if any(k.startswith(f"{info.arch}.ssm.") or k.startswith(f"{info.arch}.rwkv") for k in info.metadata):
        notes.append(f"{info.arch}: recurrent state not modelled; KV estimate covers attention layers only")
    lay = Layout(str(info.path), info.arch, n_layer, info.n_embd, info.n_vocab, layer_bytes, input_bytes,
                  output_bytes, tied, layer_repack, output_repack, kv, notes, tied_repack, weights_read,
                  n_nextn, mtp and n_nextn > 0)
    if info.is_block_drafter:   # DFlash / DSpark: a context batch of one block (llama.contexts)
        lay.block_rows = block_drafter_batch(int(_meta(info, "block_size", DRAFTER_BATCH - 1)))
        lay.notes.append(f"{info.path.name}: a {info.block_kind} block drafter: its context's batch, compute buffer "
                         f"and logit rows are sized to its block of {lay.block_rows} rows, not the target's batch")
    return lay


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

    def layers_on_gpu(self) -> str:
        """The offload in one wording for ``fit`` and the chat's F3: ``0/31 layers on the GPU``, counted
        as llama.cpp's n_gpu_layers counts them (the repeating blocks plus the output layer)."""
        return f"{self.gpu_layers}/{self.n_units} layers on the GPU"


@dataclass
class DeviceUse:
    name: str
    is_gpu: bool
    budget_bytes: int
    margin_bytes: int
    used_bytes: int
    target_bytes: int
    drafter_bytes: int
    mtp_bytes: int = 0   # the target's MTP heads (Plan.mtp): their weights here, their KV and buffers

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
    requested_n_ctx: int | None = None   # the context asked for, when this plan had to use a smaller one
    mtp: Part | None = None              # the target's MTP heads when they draft (no drafter file)

    @property
    def context_note(self) -> str | None:
        """Why the context is smaller than the one asked for (None when it is not): for the caller to
        show, as a CLI note or in the chat."""
        if self.requested_n_ctx is None or self.requested_n_ctx == self.n_ctx:
            return None
        return (f"context {self.requested_n_ctx} does not fit the memory budget; using {self.n_ctx} "
                f"({self.kv_type} KV)")

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
            "target": part(self.target), "drafter": part(self.drafter), "mtp": part(self.mtp),
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


@dataclass(frozen=True)
class Share:
    """One model's bytes at a given offload: on the GPU and on the CPU, and what they are made of."""

    gpu_bytes: int
    cpu_bytes: int
    weights_bytes: int          # the GGUF's weights (all devices)
    repack_bytes: int           # CPU_REPACK copies on the CPU
    kv_bytes: int


NO_SHARE = Share(0, 0, 0, 0, 0)


def _blocks(lay: Layout, blocks: range, gpu_set: set[int], n_ctx: int, kv_bytes_per_elem: float,
            read: bool) -> tuple[int, int, int, int]:
    """(GPU, CPU, CPU_REPACK, KV) bytes of the blocks ``blocks``: weights and KV, each on its device."""
    gpu = cpu = repack = kv = 0
    for i in blocks:
        kv_i = int(n_ctx * lay.kv_per_token[i] * kv_bytes_per_elem)
        kv += kv_i
        if i in gpu_set:
            gpu += lay.layer_bytes[i] + kv_i
        else:
            extra = 0 if read else lay.layer_repack[i]
            cpu += lay.layer_bytes[i] + extra + kv_i
            repack += extra
    return gpu, cpu, repack, kv


def _share(lay: Layout, ngl: int, n_ctx: int, kv_bytes_per_elem: float, compute: int, output: int) -> Share:
    """One model's share at ngl offloaded units (a target's MTP heads aside: :func:`_mtp_share`)."""
    out_gpu, gpu_layers = _gpu_units(lay, ngl)
    read = lay.weights_read and ngl == 0   # repacked tensors held once (no mapped copy beside them)
    gpu, cpu, repack, kv = _blocks(lay, range(lay.n_trunk), set(gpu_layers), n_ctx, kv_bytes_per_elem, read)
    cpu += lay.input_bytes
    if out_gpu:
        gpu += lay.output_bytes
    else:
        extra = lay.tied_repack if read else lay.output_repack
        cpu += lay.output_bytes - lay.tied_output_bytes + extra
        repack += extra
    all_gpu = out_gpu and len(gpu_layers) == lay.n_layer
    if ngl > 0:
        gpu += compute
        # the host still runs the input layer (and whatever stayed on the CPU)
        cpu += compute if not all_gpu else PROMPT_BATCH * lay.n_embd * 4 * 2
    else:
        cpu += compute
    cpu += output
    return Share(gpu, cpu, lay.weights_bytes - sum(lay.layer_bytes[lay.n_trunk:]), repack, kv)


def _heads_on_gpu(lay: Layout, ngl: int) -> set[int]:
    """The MTP heads' blocks on the GPU at ngl offloaded units (the last blocks: offloaded first)."""
    return set(_gpu_units(lay, ngl)[1]) & set(range(lay.n_trunk, lay.n_layer))


def _mtp_share(lay: Layout, ngl: int, n_ctx: int, compute: int, output: int) -> Share:
    """The target's MTP heads at ngl offloaded units of the target: their blocks' weights and the
    MTP context's KV (F16), compute buffer (on the GPU with a head there) and logits rows."""
    if not lay.mtp:
        return NO_SHARE
    gpu_set = _heads_on_gpu(lay, ngl)
    gpu, cpu, repack, kv = _blocks(lay, range(lay.n_trunk, lay.n_layer), gpu_set, n_ctx, KV_TYPES[MTP_KV][1], lay.weights_read and ngl == 0)
    if gpu_set:
        gpu += compute
    else:
        cpu += compute
    return Share(gpu, cpu + output, sum(lay.layer_bytes[lay.n_trunk:]), repack, kv)


def _output_bytes(lay: Layout, rows: int, embd_rows: int = 0) -> int:
    return rows * lay.n_vocab * 4 + embd_rows * lay.n_embd * 4 * 2


def plan_memory(target: Layout, drafter: Layout | None, devices: list[DeviceBudget], compute: ComputeFn, *,
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
    want_ctx = n_ctx or n_ctx_max or options.DEFAULT_CTX
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
    over = [f"{d.name} needs {format_size(d.used_bytes + d.margin_bytes)} (with a {format_size(d.margin_bytes)} margin) "
            f"but has {format_size(d.budget_bytes)}" for d in best_fail.devices if not d.fits]
    best_fail.reason = ("does not fit even at context " f"{best_fail.n_ctx} with {best_fail.kv_type} KV: "
                        + "; ".join(over))
    return best_fail


# the MTP context's cache type: llama.cpp's default (MtpDrafter gives it no other)
MTP_KV = "f16"


def kv_bytes(lay: Layout, n_ctx: int, kv_type: str) -> int:
    """One model's KV cache: K and V of every layer its context holds (not the MTP heads') for
    ``n_ctx`` positions, in ``kv_type``."""
    return int(n_ctx * sum(lay.kv_per_token[:lay.n_trunk]) * KV_TYPES[kv_type][1])


def mtp_kv_bytes(lay: Layout, n_ctx: int) -> int:
    """The MTP context's KV cache: the heads' layers, ``n_ctx`` positions, F16 (0: no heads drafting)."""
    return int(n_ctx * sum(lay.kv_per_token[lay.n_trunk:]) * KV_TYPES[MTP_KV][1]) if lay.mtp else 0


def lower_bound(target: Layout, drafter: Layout | None, n_ctx: int, kv: str) -> int:
    """Bytes a context of ``n_ctx`` needs at the least: the weights and every KV cache."""
    total = target.weights_bytes + kv_bytes(target, n_ctx, kv) + mtp_kv_bytes(target, n_ctx)
    if drafter is not None:
        total += drafter.weights_bytes + kv_bytes(drafter, n_ctx, "f32")
    return total


SplitFn = Callable[[int, int], tuple[Share, Share, Share, int, int]]
"""(target gpu units, drafter gpu units) -> (target, drafter and MTP heads' shares, the compute
bytes of the target's and of the drafter's or the MTP heads' context)."""


def _place(target: Layout, drafter: Layout | None, cpu_dev: DeviceBudget, gpu_dev: DeviceBudget | None,
           compute: ComputeFn, n_ctx: int, kv: str, draft_max: int | None, ngl_fixed: int | None,
           dngl_fixed: int | None, margins: dict[str, int], notes: list[str]) -> Plan:
    """The plan at one context and KV type: offload chosen (or as given), sizes per device and model."""
    kv_t = KV_TYPES[kv][1]
    kv_d = KV_TYPES["f32"][1]  # the drafter's exact attention keeps an F32 cache
    dm = draft_max or DRAFT_MAX_CHOICES[0]
    t_out = _output_bytes(target, VERIFY_OUTPUTS_MAX, 0)   # the rows the context reserves (auto's long lookup drafts)
    d_rows = (drafter.block_rows or DRAFTER_BATCH) if drafter else 0   # a block drafter's logit rows: its block
    d_out = _output_bytes(drafter, d_rows, d_rows) if drafter else 0
    m_out = _output_bytes(target, DRAFTER_BATCH, DRAFTER_BATCH) if target.mtp else 0   # as a drafter's

    def split(ngl: int, dngl: int) -> tuple[Share, Share, Share, int, int]:
        tc, dc = compute(n_ctx, kv, ngl, dngl)
        t = _share(target, ngl, n_ctx, kv_t, tc, t_out)
        d = _share(drafter, dngl, n_ctx, kv_d, dc, d_out) if drafter else NO_SHARE
        m = _mtp_share(target, ngl, n_ctx, dc, m_out) if drafter is None else NO_SHARE
        return t, d, m, tc, dc

    if gpu_dev is None:
        ngl, dngl = 0, 0
    else:
        ngl, dngl = _offload(target, drafter, gpu_dev.budget_bytes - margins[gpu_dev.name], split,
                             ngl_fixed, dngl_fixed)
    ngl = target.n_units if ngl < 0 else ngl          # -1 given: all
    if drafter is not None:
        dngl = drafter.n_units if dngl < 0 else dngl
    t, d, m, tc, dc = split(ngl, dngl)
    # draft depth: deeper when verification runs on a GPU (a batch costs about one step there)
    if draft_max is None:
        dm = 8 if gpu_dev is not None and ngl >= target.n_units else 4
    devices = [DeviceUse(cpu_dev.name, False, cpu_dev.budget_bytes, margins[cpu_dev.name],
                         t.cpu_bytes + d.cpu_bytes + m.cpu_bytes, t.cpu_bytes, d.cpu_bytes, m.cpu_bytes)]
    if gpu_dev is not None:
        devices.append(DeviceUse(gpu_dev.name, True, gpu_dev.budget_bytes, margins[gpu_dev.name],
                                 t.gpu_bytes + d.gpu_bytes + m.gpu_bytes, t.gpu_bytes, d.gpu_bytes, m.gpu_bytes))
    tpart = Part("target", target.path, ngl, target.n_units, t.weights_bytes, t.repack_bytes, t.kv_bytes, kv, tc,
                 t_out, t.gpu_bytes, t.cpu_bytes)
    dpart = (Part("drafter", drafter.path, dngl, drafter.n_units, d.weights_bytes, d.repack_bytes, d.kv_bytes,
                  "f32", dc, d_out, d.gpu_bytes, d.cpu_bytes) if drafter else None)
    mpart = (Part("mtp heads", target.path, len(_heads_on_gpu(target, ngl)), target.n_nextn, m.weights_bytes, m.repack_bytes, m.kv_bytes, MTP_KV, dc, m_out, m.gpu_bytes,
                  m.cpu_bytes) if target.mtp and drafter is None else None)
    total = sum(x.used_bytes for x in devices)
    budget = sum(x.budget_bytes for x in devices)
    return Plan(all(x.fits for x in devices), budget, total, n_ctx, kv, dm, tpart, dpart, devices,
                notes=list(notes), mtp=mpart)


def _offload(target: Layout, drafter: Layout | None, gpu_free: int, split: SplitFn,
             ngl_fixed: int | None, dngl_fixed: int | None) -> tuple[int, int]:
    """GPU units (target, drafter): the drafter's first, as many as fit alone, then the target's in
    what is left. Given values are kept (-1: all)."""
    dngl = dngl_fixed if dngl_fixed is not None else 0
    if drafter is not None and dngl_fixed is None:
        for k in range(drafter.n_units, 0, -1):
            if split(0, k)[1].gpu_bytes <= gpu_free:
                dngl = k
                break
    if ngl_fixed is not None:
        return ngl_fixed, dngl
    ngl = 0
    lo, hi = 1, target.n_units   # gpu bytes grow with ngl: binary search the largest that fits
    while lo <= hi:
        mid = (lo + hi) // 2
        t, d, m, _, _ = split(mid, dngl)
        if t.gpu_bytes + d.gpu_bytes + m.gpu_bytes <= gpu_free:
            ngl, lo = mid, mid + 1
        else:
            hi = mid - 1
    return ngl, dngl
