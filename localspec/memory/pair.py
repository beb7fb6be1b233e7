"""Planning a real target + drafter pair: both GGUFs read, llama.cpp asked for its compute buffers,
the real devices budgeted (:func:`plan_files`); and the Engine keyword arguments the CLI and the
chat build an engine from (:func:`plan_engine`). Nothing here prints: a context smaller than the
one asked for comes back as data (``Plan.context_note``) for the caller to show."""

from __future__ import annotations

from pathlib import Path

from ..core import options
from ..core.errors import LocalspecError
from ..core.units import parse_size
from ..formats.gguf_info import check_pair, check_target, mtp_heads, read_gguf
from ..llama.weights_memory import read_weights
from .planner import Plan, layout, plan_memory
from .probe import LlamaCompute, device_budgets


class DoesNotFit(LocalspecError):
    """The pair does not fit the memory budget (the server answers it apart from other load errors)."""


def plan_files(target: str | Path, drafter: str | Path | None, *, vram: int | None = None, ram: int | None = None,
               n_ctx: int | None = None, n_ctx_max: int | None = None, kv_type: str | None = None,
               draft_max: int | None = None, gpu_layers: int | None = None, drafter_gpu_layers: int | None = None,
               n_threads: int | None = None, slots: int = 1) -> Plan:
    """Plan a real pair: read both GGUFs, ask llama.cpp for compute buffers, budget the real devices.
    ``slots``: sequences served at once (``serve --parallel``), each with ``n_ctx`` positions: the
    target's and the drafter's KV pools hold ``slots x n_ctx`` cells (the plan's ``n_ctx`` is the
    pool). A target with MTP heads and no drafter drafts with them (as the engine does): their
    weights, KV and buffers are planned as ``Plan.mtp``."""
    from ..llama import backends

    tinfo = read_gguf(target)
    slots = options.check("parallel", slots)
    if n_ctx is not None:   # before llama.cpp is asked anything about it
        n_ctx = options.check_n_ctx(n_ctx, tinfo.n_ctx_train, model=tinfo.path.name) * slots
    if draft_max is not None:
        draft_max = options.check("draft_max", draft_max)
    dinfo = read_gguf(drafter) if drafter else None
    if dinfo is not None:
        check_pair(tinfo, dinfo)  # llama.cpp aborts the process on a mismatched pair
    else:
        check_target(tinfo)
    cpu = backends.detect().cpu_features
    read = read_weights(0)   # how Model holds the weights of a model left on the CPU
    mtp = dinfo is None and mtp_heads(tinfo) > 0   # the engine's rule (Engine(mtp=None))
    tl = layout(tinfo, cpu, weights_read=read, mtp=mtp)
    dl = layout(dinfo, cpu, weights_read=read) if dinfo else None
    devices = device_budgets(vram, ram)
    compute = LlamaCompute(tinfo.path, dinfo.path if dinfo else None, n_threads=n_threads, mtp=mtp)
    simulated = any(d.name == "GPU" for d in devices)
    result = plan_memory(tl, dl, devices, compute, n_ctx=n_ctx, kv_type=kv_type, draft_max=draft_max,
                         n_ctx_max=(n_ctx_max or min(tinfo.n_ctx_train or options.DEFAULT_CTX, options.DEFAULT_CTX)) * slots,
                         gpu_layers=gpu_layers,
                         drafter_gpu_layers=drafter_gpu_layers)
    if simulated:
        result.notes.append("no GPU in this llama.cpp build: --vram simulates one (GPU compute buffers "
                            "estimated as the CPU's)")
    if not backends.detect().gpu_offload and not simulated:
        result.notes.append("this llama.cpp build has no GPU backend: everything runs on the CPU")
    return result


# ``serve`` without --parallel: this many slots when they fit the memory budget (else 2, else 1)
AUTO_PARALLEL = 4


def plan_engine(spec, *, n_ctx: int, n_threads: int | None = None, gpu_layers: int | None = None,
                vram: str | int | None = None, ram: str | int | None = None, kv_type: str | None = None,
                parallel: int | None = 1) -> dict:
    """Engine keyword arguments from a memory plan for ``spec`` (a models.ModelSpec): n_ctx,
    parallel, n_gpu_layers, drafter_gpu_layers, kv_type, n_outputs_max, memory_plan. Manual values
    win: ``gpu_layers`` (the target's; the drafter then goes fully on the GPU if any GPU is used),
    ``kv_type``. The requested context is kept if it fits, else the largest that fits is used and
    ``memory_plan.context_note`` says so. Without a GPU and without ``vram`` nothing is offloaded.
    ``parallel``: slots of ``n_ctx`` each (``serve --parallel``); more than one that do not fit is
    an error; None: up to :data:`AUTO_PARALLEL` that fit."""
    vram_b = parse_size(vram) if isinstance(vram, str) else vram
    ram_b = parse_size(ram) if isinstance(ram, str) else ram
    kwargs = dict(vram=vram_b, ram=ram_b, kv_type=kv_type, n_threads=n_threads)
    if gpu_layers is not None:
        kwargs.update(gpu_layers=gpu_layers, drafter_gpu_layers=-1 if gpu_layers else 0)
    drafter = spec.drafter if spec.drafter is not None and Path(spec.drafter).is_file() else None
    slots = options.check("parallel", parallel) if parallel is not None else None
    for n in ([slots] if slots is not None else [AUTO_PARALLEL, 2, 1]):
        p = plan_files(spec.target, drafter, n_ctx=n_ctx, slots=n, **kwargs)
        if p.fits or n == 1:
            break
        if slots is not None:
            raise DoesNotFit(f"{n} slots of context {n_ctx} do not fit the memory budget: {p.reason} "
                                 f"(use a smaller --parallel or --ctx; see `localspec fit --parallel {n}`)")
    slots = n
    if not p.fits:
        flexible = plan_files(spec.target, drafter, n_ctx=None, n_ctx_max=n_ctx, **kwargs)
        if not flexible.fits:   # not even the smallest context fits: nothing is allocated beyond the budget
            raise DoesNotFit(f"the model does not fit the memory budget: {p.reason} "
                                 "(see `localspec fit`)")
        flexible.requested_n_ctx = n_ctx
        p = flexible
    simulated_gpu = any(d.name == "GPU" for d in p.devices)
    ngl = p.target.gpu_layers if not simulated_gpu else 0
    dngl = p.drafter.gpu_layers if (p.drafter and not simulated_gpu) else 0
    if gpu_layers is not None:
        ngl, dngl = gpu_layers, (-1 if gpu_layers else 0)
    return dict(n_ctx=p.n_ctx // slots, parallel=slots, n_gpu_layers=ngl, drafter_gpu_layers=dngl,
                kv_type=p.kv_type, n_outputs_max=p.n_outputs_max, memory_plan=p)
