"""SafeAILab EAGLE-3 / SpecForge ``LlamaForCausalLMEagle3`` drafters (``midlayer.*``), and the
checkpoints localspec's own trainer writes in the same layout.

The two share names and architecture but not the meaning of ``eagle_aux_hidden_state_layer_ids``
(see :mod:`.base`): SpecForge's are layer OUTPUTS (SGLang adds one), localspec's are llama.cpp's
layer inputs. A checkpoint saved by ``transformers`` (``save_pretrained`` always writes
``transformers_version``) is SpecForge's; localspec's trainer writes its config by hand, without
that key (or with a ``localspec`` key). ``localspec export --format specforge`` writes SpecForge's
convention and says so (``"localspec": {"layer_ids": "output"}``): read as SpecForge's.
"""

from __future__ import annotations

from ..checkpoint import Checkpoint
from .base import Layout

ARCH = "LlamaForCausalLMEagle3"


def _is_midlayer(ckpt: Checkpoint) -> bool:
    return any(n.startswith(("midlayer.", "model.midlayer.")) for n in ckpt.names())


class LocalspecLayout(Layout):
    name = "localspec"
    description = "localspec train output (LlamaForCausalLMEagle3, llama.cpp layer ids)"
    layer_convention = "input"

    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        c = ckpt.config
        marker = c.get("localspec")
        if isinstance(marker, dict) and marker.get("layer_ids", "input") != "input":
            return False    # written by `localspec export --format specforge`: SpecForge's convention
        return ARCH in (c.get("architectures") or []) and _is_midlayer(ckpt) and (
            "localspec" in c or "transformers_version" not in c)


class SpecForgeLayout(Layout):
    name = "specforge"
    description = "SafeAILab EAGLE-3 / SpecForge LlamaForCausalLMEagle3 (midlayer.*)"
    layer_convention = "output"

    @classmethod
    def matches(cls, ckpt: Checkpoint) -> bool:
        return _is_midlayer(ckpt) and (ARCH in (ckpt.config.get("architectures") or [])
                                       or "draft_vocab_size" in ckpt.config)

    def extra_checks(self) -> None:
        exported = isinstance(self.ckpt.config.get("localspec"), dict)   # by localspec export: post-norm
        if "norm_output" in self.ckpt.config and not exported:
            value = bool(self.ckpt.config["norm_output"])
            self.warnings.append(
                f"norm_output={str(value).lower()} is read with its meaning since SpecForge PR #879 "
                f"(Sep 2026): {'post-norm feedback (EAGLE-3.1)' if value else 'pre-norm feedback (EAGLE-3)'}. "
                "SpecForge before that fix trained norm_output=true drafters with pre-norm feedback and "
                "norm_output=false ones without a final norm; reconvert after setting norm_output=false "
                "if this drafter predates it"
            )
        scaling = self.hp.get("rope_scaling") or {}
        if (scaling.get("rope_type") or scaling.get("type")) == "llama3":
            self.warnings.append(
                "llama3 rope scaling is applied as in config.json (as SGLang, vLLM and llama.cpp do); "
                "SpecForge trains such drafters with unscaled rope"
            )
