"""vLLM ``Eagle3LlamaForCausalLM`` drafters (AngelSlim and others trained for vLLM): names are
``midlayer.*`` or ``layers.0.*`` (vLLM renames the former), optional ``embed_tokens``, ``d2t``/
``t2d``; EAGLE-3.1 flags ``fc_norm`` / ``norm_output`` / ``norm_before_residual`` at the top level.
Layer ids are vLLM's: inputs of the target layers, as llama.cpp's.
"""

from __future__ import annotations

from ..checkpoint import Checkpoint
from .base import Layout


class VllmLayout(Layout):
    name = "vllm"
    description = "vLLM / AngelSlim Eagle3LlamaForCausalLM"
    layer_convention = "input"

    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        return "Eagle3LlamaForCausalLM" in (ckpt.config.get("architectures") or [])
