"""``convert_checkpoint``: drafter checkpoint (any supported layout) -> ``eagle3`` GGUF.

Flow: open the checkpoint (:mod:`.checkpoint`) -> detect its layout (:mod:`.layouts`) -> the
layout reads it into the canonical :class:`~.canonical.DrafterWeights`, validating shapes, values,
vocabulary and layer ids against the target -> :func:`~.gguf_writer.write_gguf_file` writes the
staging file -> the staged file passes the same target/drafter checks the engine runs before
llama.cpp loads anything -> it is renamed to ``out``. Any failure leaves no new file behind (and
an existing ``out`` untouched).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from localspec.core.atomic import atomic_path
from localspec.core.errors import LocalspecError
from localspec.formats.gguf_info import check_pair, check_target, read_gguf

from .block import is_block_checkpoint, write_block_gguf
from .checkpoint import Download, open_checkpoint
from .gguf_writer import OUTTYPES, write_gguf_file
from .layouts import TargetShape, detect


@dataclass
class ConversionSummary:
    layout: str
    variant: str
    target_layers: tuple[int, int, int]
    draft_vocab: int
    outtype: str
    size_bytes: int
    warnings: list[str] = field(default_factory=list)
    out: Path | None = None
    source: str = ""


def resolve_target(target: str | Path) -> tuple[Path, TargetShape]:
    """The target GGUF (for the tokenizer and checks) and its shape. A directory is accepted when
    it holds exactly one .gguf (an HF config.json beside it is cross-checked)."""
    p = Path(target).expanduser()
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) != 1:
            raise LocalspecError(
                f"{p}: need the target's .gguf (the drafter GGUF copies its tokenizer); "
                f"found {len(ggufs)} .gguf files in this directory"
            )
        gguf_path = ggufs[0]
    else:
        gguf_path = p
    info = read_gguf(gguf_path)
    check_target(info)
    shape = TargetShape(gguf_path.name, info.n_layer, info.n_embd, info.n_vocab)
    hf = p / "config.json" if p.is_dir() else None
    if hf is not None and hf.is_file():
        try:
            cfg = json.loads(hf.read_text())
            cfg = {**cfg, **(cfg.get("text_config") or {})}
        except (OSError, ValueError) as exc:
            raise LocalspecError(f"{hf}: not valid JSON ({exc})") from None
        for key, have in (("num_hidden_layers", info.n_layer), ("hidden_size", info.n_embd)):
            if key in cfg and cfg[key] != have:
                raise LocalspecError(f"{hf}: {key}={cfg[key]} but {gguf_path.name} has {have}")
    return gguf_path, shape


def convert_checkpoint(src, target, out, *, outtype: str = "f16", force: bool = False,
                       progress: bool = False, download: Download | None = None) -> ConversionSummary:
    """``src`` (a checkpoint directory or weight file; a Hub repo id with ``download``, which
    fetches its files: see :func:`~.checkpoint.open_checkpoint`) converted for ``target`` into
    ``out``, atomically."""
    if outtype not in OUTTYPES:
        raise LocalspecError(f"unknown output type '{outtype}' (one of {', '.join(OUTTYPES)})")
    out = Path(out).expanduser()
    if out.exists() and not force:
        raise LocalspecError(f"{out} exists (use --force to overwrite)")
    if out.exists() and out.is_dir():
        raise LocalspecError(f"{out} is a directory")
    if not out.parent.is_dir():
        raise LocalspecError(f"{out.parent}: no such directory")
    target_gguf, shape = resolve_target(target)
    if out.exists() and out.resolve() == target_gguf.resolve():
        raise LocalspecError(f"{out} is the target model; refusing to overwrite it")

    ckpt = open_checkpoint(src, download)
    if is_block_checkpoint(ckpt.config):   # DFlash / DSpark: the dflash GGUF (converters.block)
        return _convert_block(ckpt, target_gguf, out, outtype)
    layout = detect(ckpt)
    weights = layout.read(shape)

    with atomic_path(out) as staging:   # the one partial file; checked before it becomes ``out``
        write_gguf_file(weights, target_gguf, staging, outtype=outtype, progress=progress)
        check_pair(read_gguf(target_gguf), read_gguf(staging))
    cfg = weights.config
    return ConversionSummary(
        layout=layout.name, variant=cfg.variant, target_layers=tuple(cfg.target_layers),
        draft_vocab=weights.draft_vocab, outtype=outtype, size_bytes=out.stat().st_size,
        warnings=list(layout.warnings), out=out, source=ckpt.source,
    )


def _convert_block(ckpt, target_gguf: Path, out: Path, outtype: str) -> ConversionSummary:
    """A DFlash or DSpark checkpoint to its dflash GGUF, checked against the target before it
    becomes ``out``."""
    if outtype not in ("f32", "f16"):
        raise LocalspecError(f"a DFlash / DSpark drafter converts to f32 or f16, not {outtype}")
    with atomic_path(out) as staging:
        write_block_gguf(ckpt, target_gguf, staging, outtype=outtype)
        check_pair(read_gguf(target_gguf), read_gguf(staging))
    info = read_gguf(out)
    return ConversionSummary(layout=info.block_kind, variant=info.block_kind, target_layers=tuple(info.target_layers),
                             draft_vocab=None, outtype=outtype, size_bytes=out.stat().st_size, warnings=[],
                             out=out, source=ckpt.source)
