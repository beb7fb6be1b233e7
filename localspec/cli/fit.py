"""``localspec fit``: plan target + drafter memory (weights, both KV caches, compute buffers) against
the devices' memory or a given budget, and print a per-device table (or one JSON object)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..llama import backends
from ..core.errors import LocalspecError
from ..core.units import format_size, parse_size
from ..llama.contexts import KV_TYPES
from ..formats.gguf_info import mtp_heads, read_gguf
from ..memory.pair import plan_files
from ..store.models import resolve
from ..core.options import AUTO_DRAFT_MAX, DEFAULT_CTX, check_cli
from .app import app
from .common import DraftOpt, ModelArg, TargetOpt, ThreadsOpt
from .flags import option


@app.command()
def fit(
    model: Optional[str] = ModelArg,
    target: Optional[Path] = TargetOpt,
    draft: Optional[Path] = DraftOpt,
    vram: Optional[str] = typer.Option(None, "--vram", help="GPU budget, e.g. 8G (default: free memory of the GPU "
                                       "llama.cpp sees; on a CPU-only build it simulates a GPU).", show_default=False),
    ram: Optional[str] = typer.Option(None, "--ram", help="System RAM budget (default: available RAM).",
                                      show_default=False),
    ctx: Optional[int] = option("n_ctx", default=None,
                                help=f"Context size (default: the largest up to {DEFAULT_CTX} that fits)."),
    kv_type: Optional[str] = typer.Option(None, "--kv-type", help=f"KV cache type ({', '.join(KV_TYPES)}; "
                                          "default: f16, smaller if needed).", show_default=False),
    draft_max: Optional[int] = option("draft_max", help="Draft depth (default: chosen)."),
    gpu_layers: Optional[int] = option("gpu_layers", help="Target layers on the GPU (default: chosen)."),
    threads: Optional[int] = ThreadsOpt,
    parallel: int = option("parallel", help="Slots served at once (`serve --parallel`), each of --ctx."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Plan memory for the target and drafter together, on the GPU and in RAM."""
    vram_b = parse_size(vram) if vram is not None else None
    ram_b = parse_size(ram) if ram is not None else None
    check_cli(dict(n_ctx=ctx, draft_max=draft_max, gpu_layers=gpu_layers, threads=threads, parallel=parallel))
    if kv_type is not None and kv_type not in KV_TYPES:
        raise LocalspecError(f"unknown KV type '{kv_type}' ({', '.join(KV_TYPES)})")
    model_spec = resolve(model, target=target, draft=draft)
    for label, path in (("target", model_spec.target), ("drafter", model_spec.drafter)):
        if path is not None and not Path(path).is_file():
            raise LocalspecError(f"the {label} file {path} does not exist")
    plan = plan_files(model_spec.target, model_spec.drafter, vram=vram_b, ram=ram_b, n_ctx=ctx, kv_type=kv_type,
                      draft_max=draft_max, gpu_layers=gpu_layers,
                      drafter_gpu_layers=(-1 if gpu_layers else 0) if gpu_layers is not None else None,
                      n_threads=threads, slots=parallel)
    per_slot = plan.n_ctx // parallel
    info = backends.detect()
    # the target's own draft heads (no drafter file): planned as a part of their own (plan.mtp)
    heads = mtp_heads(read_gguf(model_spec.target)) if model_spec.drafter is None else 0
    if as_json:
        out = plan.to_dict()
        out.update(model=model_spec.name, backends=info.built_with, gpu_offload=info.gpu_offload, parallel=parallel,
                   n_ctx_per_slot=per_slot, mtp_heads=heads)
        print(json.dumps(out))
    else:
        slots = f"context {plan.n_ctx}" if parallel == 1 else f"{parallel} slots of context {per_slot}"
        _print_tables(plan, f"{model_spec.name} ({slots}", info, draft_max)
        if heads:
            print(f"note: the target's {heads} MTP head(s) draft (source mtp): row 'mtp heads' (their "
                  "blocks' weights, their own context's F16 KV and buffers)")
    if not plan.fits:
        raise typer.Exit(2)


def _print_tables(plan, what: str, info, draft_max: Optional[int]) -> None:
    """The plan per device and per model, its notes, and why it does not fit; ``what``: the model's
    name and its context(s), an open parenthesis; ``draft_max``: --draft-max (None: chat's and
    serve's default, the auto policy's cap)."""
    console = Console()
    depth = f"draft-max {draft_max}" if draft_max is not None else f"draft-max auto / {AUTO_DRAFT_MAX}"
    table = Table(title=f"localspec fit: {what}, KV {plan.kv_type}, {depth})")
    mtp = getattr(plan, "mtp", None)
    cols = ("device", "budget", "margin", "target", "mtp heads" if mtp is not None else "drafter", "used",
            "free after", "fits")
    for col in cols:
        table.add_column(col, justify="left" if col == "device" else "right")
    for d in plan.devices:
        table.add_row(d.name, format_size(d.budget_bytes), format_size(d.margin_bytes), format_size(d.target_bytes),
                      format_size(d.mtp_bytes if mtp is not None else d.drafter_bytes), format_size(d.used_bytes),
                      format_size(d.budget_bytes - d.used_bytes), "yes" if d.fits else "NO")
    console.print(table)
    parts = Table(title="per model")
    for col in ("model", "GPU offload", "weights", "CPU repack", "KV", "compute", "output"):
        parts.add_column(col, justify="left" if col == "model" else "right")
    for p in (plan.target, plan.drafter, mtp):
        if p is not None:
            parts.add_row(p.role, p.layers_on_gpu(), format_size(p.weights_bytes), format_size(p.repack_bytes),
                          f"{format_size(p.kv_bytes)} ({p.kv_type})", format_size(p.compute_bytes),
                          format_size(p.output_bytes))
    console.print(parts)
    console.print(f"backends: {', '.join(info.built_with)}; total {format_size(plan.total_bytes)} "
                  f"of {format_size(plan.budget_bytes)}")
    for note in plan.notes:
        console.print(f"note: {note}")
    if not plan.fits:
        console.print(f"[bold red]does not fit[/]: {plan.reason}")
