"""Other Llama-style EAGLE-3 drafters: ``model.*``-wrapped names (``model.fc``, ``model.fc_norm.N``,
``model.layers.0.*``, ``lm_head``) without NeMo Automodel's config keys (those are
:mod:`.automodel`'s), and any checkpoint llama.cpp's own converter would take
(``draft_vocab_size`` with one hidden layer). Layer ids are read as llama.cpp / vLLM read them
(inputs of the target layers); a warning says so when the config states ids.
"""

from __future__ import annotations

from ..checkpoint import Checkpoint
from .base import Layout, TargetShape


class GenericLayout(Layout):
    name = "eagle3-generic"
    description = "other Llama-style EAGLE-3 (model.* names, draft_vocab_size + 1 layer)"
    layer_convention = "input"

    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        names = ckpt.shapes
        has_fc = "fc.weight" in names or "model.fc.weight" in names
        one_layer = ckpt.config.get("num_hidden_layers", 1) == 1
        layer0 = any(n.startswith(("layers.0.", "model.layers.0.", "midlayer.", "model.midlayer.")) for n in names)
        return has_fc and layer0 and (one_layer or "draft_vocab_size" in ckpt.config)

    def layer_ids(self, target: TargetShape) -> tuple[int, int, int]:
        lids = super().layer_ids(target)
        eagle = self.hp.get("eagle_config") or {}
        if self.hp.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids"):
            self.warnings.append(
                f"layer ids {list(lids)} read as inputs of those target layers (vLLM / llama.cpp convention)"
            )
        return lids
