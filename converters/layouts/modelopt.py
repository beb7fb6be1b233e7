"""NVIDIA ModelOpt EAGLE-3 exports (``EagleExporter`` in ``modelopt/torch/export/plugins/
hf_spec_export.py``): ``LlamaForCausalLMEagle3`` with ModelOpt's ``eagle_config`` switches
(``use_input_layernorm_in_first_layer``, ``use_last_layernorm``, ``use_mtp_layernorm``,
``use_aux_hidden_state``, ``eagle_aux_hidden_state_layer_ids``), tensors ``layers.0.*`` (older
exports: ``midlayer.*``), ``fc``, ``norm``, ``lm_head``, ``d2t``; some exports add
``norm_before_fc`` (one RMSNorm over the concatenated features, tensor ``input_norm.weight``;
llama.cpp's ``enc.output_norm``), at the top level or inside ``eagle_config``.

Layer ids name layer OUTPUTS (see :mod:`.base`): ModelOpt's ``HFEagleModel.modify`` registers a
forward hook on ``layers[layer_idx]`` for every ``layer_idx in eagle_aux_hidden_state_layer_ids``
and keeps the hook's ``output``; its default is ``default_eagle_aux_layer_ids(n) = {1, n//2 - 1,
n - 4}``. So ids + 1, unless config.json carries ``"localspec": {"layer_ids": "input"}`` (for a
drafter trained on hidden states dumped through vLLM, which reads the same ids as inputs; ModelOpt
itself records no such marker). An id naming the last layer's output is the final hidden state,
which llama.cpp cannot extract: refused as out of range.
"""

from __future__ import annotations

from ..checkpoint import Checkpoint
from .base import Layout

_MODELOPT_KEYS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm", "norm_before_fc")


class ModelOptLayout(Layout):
    name = "modelopt"
    description = "NVIDIA ModelOpt (eagle_config switches, norm_before_fc)"
    layer_convention = "output"

    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        c = ckpt.config
        eagle = c.get("eagle_config") or {}
        return any(k in eagle for k in _MODELOPT_KEYS) or "norm_before_fc" in c or "input_norm.weight" in ckpt.shapes
