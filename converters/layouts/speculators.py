"""vLLM ``speculators`` ``Eagle3Speculator`` checkpoints: the decoder layer's hyperparameters sit in
a nested ``transformer_layer_config``; flags ``norm_before_residual``, ``norm_before_fc``
(``input_norm.weight``), ``fc_norm``, ``norm_output`` and ``eagle_aux_hidden_state_layer_ids`` at
the top level; tensors ``layers.0.*``, ``fc``, ``norm``, ``lm_head``, ``embed_tokens``, ``d2t``,
``t2d``. speculators trains on vLLM-extracted features: ids are target layer inputs.

A ``qwen3`` transformer_layer_config (speculators' default) has q/k norms in attention, which
llama.cpp's eagle3 graph does not have: refused.
"""

from __future__ import annotations

from typing import Any

from ..checkpoint import Checkpoint
from .base import Layout


class SpeculatorsLayout(Layout):
    name = "speculators"
    description = "vLLM speculators Eagle3Speculator (transformer_layer_config, layers.0.*)"
    layer_convention = "input"

    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        c = ckpt.config
        return "speculators_model_type" in c or "Eagle3Speculator" in (c.get("architectures") or []) \
            or "transformer_layer_config" in c

    def hparams(self) -> dict[str, Any]:
        c = self.ckpt.config
        inner = c.get("transformer_layer_config") or {}
        if not isinstance(inner, dict):
            inner = {}
        merged = {**inner, **{k: v for k, v in c.items() if k != "transformer_layer_config"}}
        # the layer's own sizes win over anything at the top level
        for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
                    "max_position_embeddings", "vocab_size", "hidden_act", "attention_bias", "mlp_bias"):
            if key in inner:
                merged[key] = inner[key]
        return merged

    def extra_checks(self) -> None:
        kind = self.ckpt.config.get("speculators_model_type", "eagle3")
        if kind != "eagle3":
            self._refuse(f"speculators_model_type '{kind}' (only eagle3 converts)")
        model_type = (self.ckpt.config.get("transformer_layer_config") or {}).get("model_type", "llama")
        if model_type not in ("llama", "mistral"):
            self._refuse(f"a '{model_type}' decoder layer (q/k norms or other non-Llama parts)")
