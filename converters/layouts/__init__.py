"""Checkpoint layouts, detected from ``config.json`` and tensor names (never from a flag the user
passes). Order matters: the first layout whose ``matches`` accepts the checkpoint reads it.
"""

from __future__ import annotations

from localspec.core.errors import LocalspecError

from ..checkpoint import Checkpoint
from .automodel import AutomodelLayout
from .base import Layout, TargetShape, default_layers
from .generic import GenericLayout
from .modelopt import ModelOptLayout
from .speculators import SpeculatorsLayout
from .specforge import LocalspecLayout, SpecForgeLayout
from .vllm import VllmLayout

LAYOUTS: tuple[type[Layout], ...] = (SpeculatorsLayout, VllmLayout, ModelOptLayout, AutomodelLayout, LocalspecLayout,
                                     SpecForgeLayout, GenericLayout)

_MLA_ARCH_HINTS = ("Deepseek", "DeepSeek", "Kimi", "MLA")


def detect(ckpt: Checkpoint) -> Layout:
    archs = [str(a) for a in ckpt.config.get("architectures") or []]
    if any(h in a for a in archs for h in _MLA_ARCH_HINTS) or ckpt.config.get("kv_lora_rank"):
        raise LocalspecError(
            f"{ckpt.root}: {', '.join(archs) or 'this'} drafter uses MLA attention, which llama.cpp's eagle3 cannot run"
        )
    for layout in LAYOUTS:
        if layout.matches(ckpt):
            return layout(ckpt)
    if "fc.weight" not in ckpt.shapes and "model.fc.weight" not in ckpt.shapes:
        what = ", ".join(archs) or "no architectures in config.json"
        raise LocalspecError(f"{ckpt.root}: not an EAGLE-3 drafter checkpoint ({what}; no fc.weight)")
    raise LocalspecError(
        f"{ckpt.root}: unrecognised EAGLE-3 layout ({', '.join(archs) or 'no architectures'}); known: "
        + ", ".join(f"{l.name} ({l.description})" for l in LAYOUTS)
    )


__all__ = ["LAYOUTS", "Layout", "TargetShape", "default_layers", "detect"]
