"""``localspec inspect FILE.gguf``: what a drafter or target GGUF is, in one table (or JSON)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from ..core import jsonout
from ..formats import gguf_consts as K
from ..core.units import format_size
from ..formats.gguf_info import GGUFInfo, mtp_heads, read_gguf
from .app import app


# Stock llama.cpp has no fc_norm scaling and feeds back the pre-norm state, so it accepts few of the
# shipped EAGLE-3.1 drafter's drafts (measured: docs/models.md).
EAGLE31_RUNTIME_NOTE = (
    "EAGLE-3.1 drafter: needs localspec's runtime. Stock llama.cpp loads it but runs it without "
    "fc_norm / post-norm feedback and accepts few of its drafts (measured: 2-8% there, 40-75% in localspec)."
)


def exact_runtimes(info: GGUFInfo) -> str:
    """Which runtimes run this drafter as it was trained."""
    served = "vLLM and SGLang after `localspec export`"
    if info.fc_norm or info.norm_output:
        return f"localspec; {served}; not stock llama.cpp (no EAGLE-3.1 fc_norm / norm_output)"
    return f"localspec; stock llama.cpp (eagle3); {served}"


def describe_gguf(info: GGUFInfo) -> dict[str, Any]:
    """The facts ``inspect`` and ``convert`` print, as plain JSON-able values."""
    n_params = 0
    for t in info.tensors.values():
        count = 1
        for d in t.shape:
            count *= d
        n_params += count
    common = {"file": str(info.path), "name": info.name, "architecture": info.arch,
              "dtype": info.weight_type, "size_bytes": info.size_bytes, "parameters": n_params}
    if info.is_assistant:   # Gemma 4's assistant: a drafter over its gemma4 target's KV cache
        return {
            "kind": "drafter",
            **common,
            "draft_source": "assistant",
            "drafts_for": f"a {K.GEMMA4_ARCH} target of hidden size "
                          f"{info.metadata.get(K.key(K.KEY_EMBEDDING_LENGTH_OUT, info.arch))} (its KV cache, no cache of its own)",
            "layers": info.n_layer,
            "hidden_size": info.n_embd,
            "vocab": info.n_vocab,
            "runs_exactly_on": "localspec; llama.cpp (draft-mtp)",
        }
    if info.is_block_drafter:   # DFlash / DSpark: a block of drafts per drafter decode
        meta = info.metadata
        return {
            "kind": "drafter",
            **common,
            "draft_source": info.block_kind,
            "drafts_for": f"a target whose layers {list(info.target_layers or ())} it reads "
                          f"(fc over {K.key(K.KEY_TARGET_LAYERS, info.arch)} x the target's width)",
            "block_size": meta.get(K.key(K.KEY_BLOCK_SIZE, info.arch)),
            "mask_token": info.mask_token,
            "markov_head": K.T_MARKOV_W1 in info.tensors,
            "confidence_head": K.T_CONF_PROJ in info.tensors,
            "layers": info.n_layer,
            "hidden_size": info.n_embd,
            "vocab": info.n_vocab,
            "own_embeddings": K.T_TOKEN_EMBD in info.tensors,
            "runs_exactly_on": f"localspec; llama.cpp (draft-{info.block_kind})",
        }
    if info.is_drafter:
        meta = info.metadata
        return {
            "kind": "drafter",
            **common,
            "layout": meta.get(K.KEY_LS_SOURCE_LAYOUT) or "unknown (not written by localspec)",
            "source": meta.get(K.KEY_LS_SOURCE) or "",
            "source_revision": meta.get(K.KEY_LS_SOURCE_REVISION) or "",
            "variant": info.variant,
            "target_layers": list(info.target_layers or ()),
            "target_hidden_size": info.target_hidden_size,
            "hidden_size": info.n_embd,
            "draft_vocab": info.draft_vocab or info.n_vocab,
            "target_vocab": info.n_vocab,
            "fc_norm": info.fc_norm,
            "norm_output": info.norm_output,
            "norm_before_fc": info.norm_before_fc,
            "norm_before_residual": info.norm_before_residual,
            "own_embeddings": K.T_TOKEN_EMBD in info.tensors,
            "rope_scaling": "llama3" if K.T_ROPE_FREQS in info.tensors else "none",
            "runs_exactly_on": exact_runtimes(info),
        }
    return {
        "kind": "target",
        **common,
        "layers": info.n_layer,
        "hidden_size": info.n_embd,
        "vocab": info.n_vocab,
        "context_length": info.n_ctx_train,
        "chat_template": info.chat_template is not None,
        "eagle_features": info.arch in K.FEATURE_ARCHS,
        # the draft heads the file ships (localspec.speculation.mtp): `--source mtp`, no drafter file
        "mtp_heads": mtp_heads(info),
    }


def print_description(desc: dict[str, Any], *, title: str | None = None, warnings: list[str] = ()) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, title=title or f"{Path(desc['file']).name} ({desc['kind']})", title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in desc.items():
        if key in ("file",) or (key == "source_revision" and not value):
            continue
        if key == "size_bytes":
            key, value = "size", format_size(int(value))
        elif key == "parameters":
            value = f"{value:,}"
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value)
        table.add_row(key.replace("_", " "), str(value))
    console = Console()
    console.print(table)
    for w in warnings:
        console.print(f"[yellow]warning:[/yellow] {w}", highlight=False)


@app.command("inspect")
def inspect_cmd(
    file: Path = typer.Argument(..., help="A GGUF file: EAGLE-3 drafter or target model.", show_default=False),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
) -> None:
    """Show what a drafter or target GGUF is (layout, variant, target layers, vocab, dtype, size)."""
    info = read_gguf(file)
    desc = describe_gguf(info)
    if as_json:
        print(jsonout.dumps(desc, indent=2))   # strict JSON: a number that is not finite prints as null
    else:
        print_description(desc, warnings=runtime_notes(info))


def runtime_notes(info: GGUFInfo) -> list[str]:
    """The plain statements ``convert`` and ``inspect`` print under an EAGLE-3.1 drafter, and
    under a target with a recurrent state (what it means for drafting)."""
    from ..formats.gguf_info import recurrent_note

    recurrent = recurrent_note(info)
    return ([EAGLE31_RUNTIME_NOTE] if info.is_drafter and (info.fc_norm or info.norm_output) else []) + \
        ([recurrent] if recurrent else [])
