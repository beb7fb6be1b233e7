"""``localspec export``: a drafter GGUF -> a checkpoint directory vLLM or SGLang serves."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from .app import app


class ExportFormat(str, Enum):
    speculators = "speculators"
    specforge = "specforge"


SERVE_HINTS = {
    "speculators": "vllm serve TARGET --speculative-config '{{\"method\": \"eagle3\", \"model\": \"{out}\", "
                   "\"num_speculative_tokens\": 4}}'",
    "specforge": "python -m sglang.launch_server --model-path TARGET --speculative-algorithm EAGLE3 "
                 "--speculative-draft-model-path {out} --speculative-num-steps 3 --speculative-eagle-topk 1 "
                 "--speculative-num-draft-tokens 4",
}


@app.command("export")
def export_cmd(
    drafter: Path = typer.Argument(..., help="An EAGLE-3 / EAGLE-3.1 drafter GGUF.", show_default=False),
    fmt: ExportFormat = typer.Option(..., "--format", help="speculators (vLLM) or specforge (SGLang).",
                                     show_default=False),
    out: Path = typer.Option(..., "--out", "-o", help="Checkpoint directory to write.", show_default=False),
    verifier: Optional[str] = typer.Option(None, "--verifier", show_default=False,
                                           help="The target's Hub id or local directory (required by --format speculators: "
                                                "its loader reads the target from it)."),
    force: bool = typer.Option(False, "--force", help="Replace OUT if it exists and is not empty."),
) -> None:
    """Write a drafter GGUF as a checkpoint that vLLM (speculators) or SGLang (specforge) serves."""
    from ..converters.export import export_drafter

    summary = export_drafter(drafter, out, fmt.value, force=force, verifier=verifier)
    print(f"Wrote {summary.out} ({summary.format}: {', '.join(summary.files)}; tensors {', '.join(summary.dtypes)})")
    print(f"target layers {summary.target_layers} (llama.cpp: layer inputs) written as "
          f"{summary.config_layer_ids} in that format's convention")
    print("Serve it with: " + SERVE_HINTS[summary.format].format(out=summary.out))
