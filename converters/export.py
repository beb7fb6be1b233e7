"""``localspec export``: an ``eagle3`` drafter GGUF -> a checkpoint directory that vLLM or SGLang
serve (``speculators`` or ``specforge`` layout), the inverse of ``convert`` for those layouts.

Both writers start from the canonical form (:mod:`.canonical`) and undo the conversion:
- q/k rows back from llama.cpp's rope order to HF ``rotate_half`` order;
- ``d2t`` back to offsets (``target = draft + d2t[draft]``), plus the ``t2d`` mask;
- EAGLE-3.1 ``fc_norm``: the per-block norm weights were folded into ``fc`` at conversion, so the
  checkpoint gets unit ``fc_norm.{0,1,2}.weight`` with the folded ``fc``. RMSNorm(x) * w feeding
  fc is fc(diag(w) RMSNorm(x)), and unit weights times the folded fc compute exactly that;
- layer ids in the format's convention: speculators/vLLM read ids as target layer INPUTS
  (llama.cpp's), SpecForge/SGLang as OUTPUTS (SGLang adds one), so SpecForge gets ids - 1.

Tensors keep their stored precision: F32 and F16 matrices as they are; BF16 / Q8_0 / other
quantized matrices as float32 holding exactly the dequantized values llama.cpp used, so converting
the exported directory back reproduces the drafter.

Config keys are the ones the engines read. vLLM (``speculators`` format, ``update_eagle3`` in
vllm's ``transformers_utils/configs/speculators/algos.py``): ``speculators_model_type``,
``transformer_layer_config`` (the decoder layer, ``model_type`` llama), ``draft_vocab_size``,
``target_hidden_size``, ``norm_before_residual`` (vLLM defaults it to True, so it is always
written), ``norm_before_fc``, ``fc_norm``, ``norm_output``, ``eagle_aux_hidden_state_layer_ids``,
and ``speculators_config.proposal_methods[0].speculative_tokens`` / ``verifier``. SGLang
(``LlamaForCausalLMEagle3``, SpecForge's config): Llama keys plus ``draft_vocab_size``,
``target_hidden_size``, ``eagle_config.eagle_aux_hidden_state_layer_ids``, ``fc_norm``,
``norm_output``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localspec.formats import gguf_consts as K
from localspec.core.atomic import atomic_dir
from localspec.core.errors import LocalspecError

from .canonical import DrafterWeights
from .gguf_reader import read_drafter_gguf, stored_types

FORMATS = ("speculators", "specforge")
_EXACT_TYPES = {"F32": np.float32, "F16": np.float16}


def unpermute_from_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp rope NORM row order -> HF rotate_half order (inverse of the converter's permute)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def reference_tensors(weights: DrafterWeights, *, fc_norm_weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The drafter under the reference (SpecForge) names, HF q/k order, d2t as offsets.

    ``fc_norm_weights`` ([3, target_hidden]) splits the folded fc back into non-unit norm weights
    (fc columns divided by them); the default is unit weights, which is exact."""
    cfg, t = weights.config, weights.tensors
    ht = cfg.target_hidden_size
    out: dict[str, np.ndarray] = {}
    fc = t[K.T_FC]
    if cfg.fc_norm:
        w = np.ones((3, ht), np.float32) if fc_norm_weights is None else np.asarray(fc_norm_weights, np.float32)
        if fc_norm_weights is not None:
            fc = fc / np.concatenate(list(w))[None, :]
        for i in range(3):
            out[f"fc_norm.{i}.weight"] = w[i].copy()
    out["fc.weight"] = fc
    if cfg.norm_before_fc:
        out["enc_norm.weight"] = t[K.T_ENC_NORM]
    m = "midlayer."
    out[m + "input_layernorm.weight"] = t[K.T_ATTN_NORM]
    out[m + "hidden_norm.weight"] = t[K.T_HIDDEN_NORM]
    out[m + "self_attn.q_proj.weight"] = unpermute_from_llama_cpp(t[K.T_Q], cfg.num_heads)
    out[m + "self_attn.k_proj.weight"] = unpermute_from_llama_cpp(t[K.T_K], cfg.num_kv_heads)
    out[m + "self_attn.v_proj.weight"] = t[K.T_V]
    out[m + "self_attn.o_proj.weight"] = t[K.T_O]
    out[m + "post_attention_layernorm.weight"] = t[K.T_FFN_NORM]
    out[m + "mlp.gate_proj.weight"] = t[K.T_FFN_GATE]
    out[m + "mlp.up_proj.weight"] = t[K.T_FFN_UP]
    out[m + "mlp.down_proj.weight"] = t[K.T_FFN_DOWN]
    out["norm.weight"] = t[K.T_OUTPUT_NORM]
    if K.T_OUTPUT not in t:
        raise LocalspecError("the drafter has no output.weight (lm_head); nothing to export")
    out["lm_head.weight"] = t[K.T_OUTPUT]
    if K.T_TOKEN_EMBD in t:
        out["embed_tokens.weight"] = t[K.T_TOKEN_EMBD]
    if weights.d2t is not None:
        ids = np.asarray(weights.d2t, np.int64)
        out["d2t"] = ids - np.arange(len(ids), dtype=np.int64)
        t2d = np.zeros(cfg.vocab_size, dtype=bool)
        t2d[ids] = True
        out["t2d"] = t2d
    return out


_GGUF_NAME = {  # reference name -> GGUF name (for the stored precision)
    "fc.weight": K.T_FC, "enc_norm.weight": K.T_ENC_NORM, "norm.weight": K.T_OUTPUT_NORM, "lm_head.weight": K.T_OUTPUT,
    "embed_tokens.weight": K.T_TOKEN_EMBD, "midlayer.input_layernorm.weight": K.T_ATTN_NORM,
    "midlayer.hidden_norm.weight": K.T_HIDDEN_NORM, "midlayer.self_attn.q_proj.weight": K.T_Q,
    "midlayer.self_attn.k_proj.weight": K.T_K, "midlayer.self_attn.v_proj.weight": K.T_V,
    "midlayer.self_attn.o_proj.weight": K.T_O, "midlayer.post_attention_layernorm.weight": K.T_FFN_NORM,
    "midlayer.mlp.gate_proj.weight": K.T_FFN_GATE, "midlayer.mlp.up_proj.weight": K.T_FFN_UP,
    "midlayer.mlp.down_proj.weight": K.T_FFN_DOWN,
}


def _f32(x: float) -> float:
    """The shortest decimal of a float32 value (1e-05, not 9.999999747378752e-06): the same float32."""
    return float(str(np.float32(x)))


def _layer_config(weights: DrafterWeights) -> dict[str, Any]:
    cfg = weights.config
    return {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "num_hidden_layers": 1,
        "rms_norm_eps": _f32(cfg.rms_eps), "rope_theta": _f32(cfg.rope_theta), "max_position_embeddings": cfg.max_position,
        "vocab_size": cfg.vocab_size, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def checkpoint_config(weights: DrafterWeights, fmt: str, *, verifier: str = "", num_speculative_tokens: int = 4) -> dict:
    cfg = weights.config
    lids = [int(x) for x in cfg.target_layers]
    if fmt == "speculators":
        return {
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.9.0",
            "transformer_layer_config": _layer_config(weights),
            "draft_vocab_size": weights.draft_vocab, "target_hidden_size": cfg.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": lids,           # vLLM: inputs of these layers
            "norm_before_residual": bool(cfg.norm_before_residual), "norm_before_fc": bool(cfg.norm_before_fc),
            "fc_norm": bool(cfg.fc_norm), "norm_output": bool(cfg.norm_output), "embed_requires_grad": False,
            "speculators_config": {
                "algorithm": "eagle3", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "verifier": {"name_or_path": verifier or None, "architectures": []},
            },
        }
    if fmt == "specforge":
        if min(lids) < 1:
            raise LocalspecError(
                f"target layers {lids} include the embeddings (layer 0's input), which SpecForge/SGLang "
                "ids (layer outputs) cannot name; export --format speculators instead")
        for flag in ("norm_before_fc", "norm_before_residual"):
            if getattr(cfg, flag):
                raise LocalspecError(f"the drafter uses {flag}, which SpecForge/SGLang drafters do not have; "
                                     "export --format speculators instead")
        layer = {k: v for k, v in _layer_config(weights).items() if k != "architectures"}
        out = {"architectures": ["LlamaForCausalLMEagle3"], **layer}
        out.update({
            "draft_vocab_size": weights.draft_vocab, "target_hidden_size": cfg.target_hidden_size,
            "pretraining_tp": 1, "torch_dtype": "float16",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [lid - 1 for lid in lids],   # SGLang adds one
                             "use_aux_hidden_state": True},
            "fc_norm": bool(cfg.fc_norm), "norm_output": bool(cfg.norm_output),
            # says which convention the ids use (SGLang ignores unknown keys; localspec reads it back)
            "localspec": {"layer_ids": "output"},
        })
        return out
    raise LocalspecError(f"unknown export format '{fmt}' (one of {', '.join(FORMATS)})")


def checkpoint_tensors(weights: DrafterWeights, fmt: str, *, types: dict[str, str] | None = None,
                       fc_norm_weights: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Tensor name (in ``fmt``) -> array, in the GGUF's stored precision where it is exact
    (``types``: GGUF name -> ggml type), float32 otherwise."""
    ref = reference_tensors(weights, fc_norm_weights=fc_norm_weights)
    out: dict[str, np.ndarray] = {}
    for name, data in ref.items():
        if data.dtype.kind == "f":
            gguf_type = (types or {}).get(_GGUF_NAME.get(name, ""), "F32")
            data = data.astype(_EXACT_TYPES.get(gguf_type, np.float32))
        if fmt == "speculators":
            name = name.replace("midlayer.", "layers.0.").replace("enc_norm.", "input_norm.")
        out[name] = np.ascontiguousarray(data)
    return out


@dataclass
class ExportSummary:
    out: Path
    format: str
    files: list[str] = field(default_factory=list)
    target_layers: list[int] = field(default_factory=list)
    config_layer_ids: list[int] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)


def write_checkpoint(out_dir: Path, config: dict, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    weights = out_dir / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(weights, 0o666 & ~umask)     # readable like the config (a server may run as another user)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def export_drafter(drafter: str | Path, out: str | Path, fmt: str, *, force: bool = False,
                   num_speculative_tokens: int = 4, verifier: str | None = None) -> ExportSummary:
    """Write ``drafter`` (an eagle3 GGUF) as a ``fmt`` checkpoint directory ``out``, atomically:
    the directory appears complete or not at all (an existing one is replaced only with force)."""
    if fmt not in FORMATS:
        raise LocalspecError(f"unknown export format '{fmt}' (one of {', '.join(FORMATS)})")
    if fmt == "speculators" and not verifier:
        # speculators 0.9.0's loader (Eagle3DraftModel.load_verifier_weights, called by every
        # from_pretrained) reads the verifier's config and weights from this name: with none it
        # asks the Hub for AutoConfig.from_pretrained(None), and offline it fails
        raise LocalspecError("--format speculators needs --verifier (the target's Hub id or local directory): "
                             "speculators' loader reads the target's config and weights from it")
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise LocalspecError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise LocalspecError(f"{out} exists and is not empty (use --force to replace it)")
    if not out.parent.is_dir():
        raise LocalspecError(f"{out.parent}: no such directory")
    weights = read_drafter_gguf(drafter)
    cfg = weights.config
    if cfg.rope_freq_factors is not None:
        raise LocalspecError(f"{drafter}: the drafter uses llama3 rope scaling, whose parameters the GGUF does not "
                             "record (only the per-frequency factors); export is not supported for it")
    if cfg.fc_norm and cfg.fc_norm_eps is not None and not np.isclose(cfg.fc_norm_eps, cfg.rms_eps, rtol=1e-6, atol=0):
        raise LocalspecError(f"{drafter}: fc_norm eps {cfg.fc_norm_eps} differs from rms_norm_eps {cfg.rms_eps}; "
                             "neither format can state a separate fc_norm eps")
    config = checkpoint_config(weights, fmt, verifier=verifier or "",
                               num_speculative_tokens=num_speculative_tokens)
    tensors = checkpoint_tensors(weights, fmt, types=stored_types(drafter))
    if "torch_dtype" in config:   # the matrices' precision, as save_pretrained records it
        config["torch_dtype"] = "float16" if tensors["fc.weight"].dtype == np.float16 else "float32"
    with atomic_dir(out) as staging:   # appears complete or not at all; stale ones are swept
        write_checkpoint(staging, config, tensors)
    ids = (config.get("eagle_aux_hidden_state_layer_ids")
           or config.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids") or [])
    return ExportSummary(out=out, format=fmt, files=sorted(p.name for p in out.iterdir()),
                         target_layers=list(cfg.target_layers), config_layer_ids=list(ids),
                         dtypes=sorted({str(t.dtype) for t in tensors.values()}))

