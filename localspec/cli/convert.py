"""``localspec convert``: a drafter checkpoint (local or Hugging Face) -> an eagle3 GGUF, or a
DFlash / DSpark checkpoint -> the dflash GGUF llama.cpp's converter writes."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from ..formats.gguf_info import read_gguf
from .app import app
from .inspect import describe_gguf, print_description, runtime_notes
from .models import HubVerboseOpt, TimeoutOpt


class OutType(str, Enum):
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    q8_0 = "q8_0"


@app.command()
def convert(
    src: str = typer.Argument(..., help="Checkpoint: a directory (config.json + weights), a weight file, "
                                        "or a Hugging Face repo id.", show_default=False),
    target: Path = typer.Option(..., "--target", help="The target model's GGUF (tokenizer, layers, hidden size).",
                                show_default=False),
    out: Path = typer.Option(..., "--out", "-o", help="The drafter GGUF to write.", show_default=False),
    outtype: OutType = typer.Option(OutType.f16, "--outtype", help="Weight type of the matrices."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
    timeout: Optional[float] = TimeoutOpt,
    verbose: bool = HubVerboseOpt,
) -> None:
    """Convert an EAGLE-3 / EAGLE-3.1 drafter checkpoint to a GGUF that llama.cpp loads as eagle3, or a
    DFlash / DSpark checkpoint to its dflash GGUF (the target supplies the tokenizer)."""
    import sys

    from ..store import hub
    from ..converters.convert import convert_checkpoint

    hub.configure(timeout=timeout, verbose=verbose)
    summary = convert_checkpoint(src, target, out, outtype=outtype.value, force=force,
                                 progress=sys.stderr.isatty(), download=hub.download_repo)
    info = read_gguf(summary.out)
    desc = describe_gguf(info)
    desc["dtype"] = f"{summary.outtype} ({desc['dtype']})"
    print_description(desc, title=f"Wrote {summary.out}", warnings=summary.warnings + runtime_notes(info))
