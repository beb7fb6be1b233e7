"""Options shared by the subcommands that run a model, and engine construction from them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..core.options import listed_words
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
    """Build the engine for MODEL (or an already resolved ``model_spec``) from the memory plan;
    ``source`` mtp: the target's MTP heads must be there (they draft whenever no drafter file is given);
    assistant: the drafter file must be a Gemma 4 assistant."""
    import sys

    from ..core.options import check_cli, threads_warning

    check_cli(dict(n_ctx=ctx, threads=threads, gpu_layers=gpu_layers))   # before any file or llama.cpp
    warning = threads_warning(threads)
    if warning:
        print(warning, file=sys.stderr)
    model_spec = model_spec or resolve(model, target=target, draft=draft)
    # the memory plan (localspec.memory) chooses offload, KV type and verify-sized buffers by default
    from ..memory.pair import plan_engine

    options = plan_engine(model_spec, n_ctx=ctx, n_threads=threads, gpu_layers=gpu_layers, vram=vram,
                          parallel=parallel, ram=ram)
    words = listed_words(getattr(source, "value", source)) if source is not None else ()
    if "assistant" in words:   # after the plan: the files are read and checked
        _check_assistant(model_spec)
    for word in {"dflash", "dspark"} & set(words):
        _check_block_drafter(model_spec, word)
    note = options["memory_plan"].context_note
    if note:
        print(f"note: {note}", file=sys.stderr)
    mtp = True if "mtp" in words else None
    engine = Engine(model_spec.target, model_spec.drafter, n_threads=threads, verbose=verbose, chat_template=model_spec.template,
                    mtp=mtp, rows_match=rows_match, **options)
    return model_spec, engine


def _check_assistant(model_spec: ModelSpec) -> None:
    """``--source assistant``: the model's drafter file is a Gemma 4 assistant (said before loading)."""
    from ..core.errors import LocalspecError
    from ..formats.gguf_info import read_gguf

    if model_spec.drafter is None or not read_gguf(model_spec.drafter).is_assistant:
        raise LocalspecError("source assistant: this model has no Gemma 4 assistant (give its GGUF as the "
                             "drafter: --draft, or DRAFT in a Modelfile)")


def _check_block_drafter(model_spec: ModelSpec, word: str) -> None:
    """``--source dflash`` / ``dspark``: the model's drafter file is a block drafter of that kind
    (said before loading)."""
    from ..core.errors import LocalspecError
    from ..formats.gguf_info import read_gguf

    if model_spec.drafter is None or read_gguf(model_spec.drafter).block_kind != word:
        raise LocalspecError(f"source {word}: this engine has no {word} block drafter (give its GGUF as the "
                             "drafter: --draft, or DRAFT in a Modelfile)")
