"""NVIDIA NeMo Automodel EAGLE-3 / EAGLE-3.1 drafters (``nemo_automodel/components/speculative/
eagle/draft_llama.py``), raw or as Automodel's serve helpers export them.

Raw training checkpoint (``train_eagle3.py``): config.json is the TARGET's text config
(``draft_base_config.to_dict()``, so ``num_hidden_layers`` and ``model_type`` are the target's)
plus ``architectures: ["LlamaEagle3DraftModel"]``, ``draft_vocab_size``, ``target_hidden_size``,
``fc_norm``, ``norm_output``, ``parallel_drafting``, ``attn_implementation``; tensors
``model.embed_tokens``, ``model.fc``, ``model.fc_norm.N``, ``model.layers.0.*``, ``model.norm``,
``lm_head``, ``d2t`` (offsets), ``t2d``. The drafter's real depth is what the tensors hold, which is
what Automodel's own ``serve_sglang._infer_num_hidden_layers`` writes into the exported config (it
counts the distinct ``layers.N`` indices); its vLLM export only renames the architecture and strips
the ``model.`` prefix, so ``num_hidden_layers`` stays the target's there too.

Layer ids: Automodel's ``HFEagle3TargetModel`` captures the OUTPUT of ``layers[i]`` with forward
hooks (default ``[1, n//2 - 1, n - 4]``) and writes no ids into the draft config, so the default
``(2, n//2, n - 3)`` applies; ids found in a config are read as outputs (+1).
"""

from __future__ import annotations

import re
from typing import Any

from ..checkpoint import Checkpoint
from .base import Layout

ARCH = "LlamaEagle3DraftModel"
# keys Automodel's recipe adds to the target's config (all present in its drafts)
_SIGNATURE = ("fc_norm", "norm_output", "parallel_drafting", "attn_implementation", "draft_vocab_size",
              "target_hidden_size")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class AutomodelLayout(Layout):
    name = "automodel"
    description = "NVIDIA NeMo Automodel LlamaEagle3DraftModel (raw or served; depth from tensors)"
    layer_convention = "output"

    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        c = ckpt.config
        if ARCH in (c.get("architectures") or []):
            return True
        has_fc = "fc.weight" in ckpt.shapes or "model.fc.weight" in ckpt.shapes
        return has_fc and all(k in c for k in _SIGNATURE)

    def tensor_depth(self) -> int:
        """Decoder layers the checkpoint holds, counted from its tensor names."""
        return len({int(m.group(1)) for n in self.ckpt.names() if (m := _LAYER.search(n))})

    def hparams(self) -> dict[str, Any]:
        hp = dict(self.ckpt.config)
        depth = self.tensor_depth()
        if depth == 1 and hp.get("num_hidden_layers") not in (None, 1):
            # the target's depth, copied by the recipe: the drafter is what its tensors hold
            self.warnings.append(
                f"config.json says num_hidden_layers={hp['num_hidden_layers']} (the target's, which Automodel's "
                "recipe copies); the checkpoint holds one decoder layer, as Automodel's own export infers"
            )
            hp["num_hidden_layers"] = 1
        return hp
