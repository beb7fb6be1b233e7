"""NVIDIA ModelOpt EAGLE-3 exports (e.g. nvidia/*-Eagle3, gpt-oss-*-Eagle3-v3): SpecForge-like
names (``midlayer.*``) plus ModelOpt's ``eagle_config`` switches (``use_input_layernorm_in_first_layer``,
``use_last_layernorm``, ``use_mtp_layernorm``, ``use_aux_hidden_state``) and ``norm_before_fc``
(one RMSNorm over the concatenated features, tensor ``input_norm.weight``; llama.cpp's
``enc.output_norm``), either at the top level or inside ``eagle_config``. Layer ids are hidden-state
boundary indices (input of layer i; 36 on a 36-layer target is the final state, which llama.cpp
cannot extract: refused as out of range).
"""

from __future__ import annotations

from ..checkpoint import Checkpoint
from .base import Layout

_MODELOPT_KEYS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm", "norm_before_fc")


class ModelOptLayout(Layout):
    name = "modelopt"
    description = "NVIDIA ModelOpt (eagle_config switches, norm_before_fc)"
    layer_convention = "input"

    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        c = ckpt.config
        eagle = c.get("eagle_config") or {}
        return any(k in eagle for k in _MODELOPT_KEYS) or "norm_before_fc" in c or "input_norm.weight" in ckpt.shapes
