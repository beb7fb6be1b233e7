"""Options shared by the subcommands that run a model, and engine construction from them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..runtime.engine import Engine
from ..store.models import ModelSpec, resolve
from .flags import option

ModelArg = typer.Argument(None, help="Model: a name, a .gguf path, or omit for the embedded default.", show_default=False)
# readable=False: an unreadable file is reported by the GGUF reader in one Error line, not by click
TargetOpt = typer.Option(None, "--target", help="Target GGUF (overrides MODEL).", show_default=False, readable=False)
DraftOpt = typer.Option(None, "--draft", help="Drafter GGUF: EAGLE-3, or a Gemma 4 assistant (overrides the model's).",
                        show_default=False, readable=False)
CtxOpt = option("n_ctx")
ThreadsOpt = option("threads")
GpuLayersOpt = option("gpu_layers")


def _verbose_now(value: bool) -> bool:
    """Applied while the command line is parsed: llama.cpp / ggml lines printed before the engine
    exists (GGUF header checks, the memory plan) follow --verbose too."""
    from ..llama.process import set_verbose

    set_verbose(bool(value))
    return value


VerboseOpt = typer.Option(False, "--verbose", help="Show llama.cpp's log.", callback=_verbose_now)
VramOpt = typer.Option(None, "--vram", show_default=False,
                       help="GPU memory budget for the plan, e.g. 8G (default: the GPU's free memory).")


def open_engine(model: Optional[str], target: Optional[Path], draft: Optional[Path], *, ctx: int,
                threads: Optional[int], gpu_layers: Optional[int], verbose: bool,
                vram: Optional[str] = None, model_spec: Optional[ModelSpec] = None,
                parallel: Optional[int] = 1, ram: Optional[str] = None,
                source=None, rows_match: bool = False) -> tuple[ModelSpec, Engine]:
    """Build the engine for MODEL (or an already resolved ``model_spec``) from the memory plan
    (:func:`localspec.runtime.loading.load_engine`: ``source`` mtp, the target's MTP heads must be
    there; assistant, the drafter file must be a Gemma 4 assistant); a smaller context than asked
    for is noted on stderr."""
    import sys

    from ..core.options import check_cli, threads_warning

    check_cli(dict(n_ctx=ctx, threads=threads, gpu_layers=gpu_layers))   # before any file or llama.cpp
    warning = threads_warning(threads)
    if warning:
        print(warning, file=sys.stderr)
    model_spec = model_spec or resolve(model, target=target, draft=draft)
    from ..runtime.loading import load_engine

    def show(plan) -> None:   # the memory plan chose a smaller context than asked for
        if plan.context_note:
            print(f"note: {plan.context_note}", file=sys.stderr)

    engine = load_engine(model_spec, n_ctx=ctx, n_threads=threads, gpu_layers=gpu_layers, vram=vram,
                         parallel=parallel, ram=ram, source=source, verbose=verbose, rows_match=rows_match,
                         on_plan=show)
    return model_spec, engine

