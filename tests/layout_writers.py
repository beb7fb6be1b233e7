"""Write an eagle3 drafter (canonical :class:`DrafterWeights`, e.g. read back from a GGUF) as a
checkpoint directory the way each real exporter writes it, for the round-trip tests.

speculators and SpecForge use localspec's own export writers (``localspec export`` is the user
feature of exactly this code); the others are test-only and follow what their tools save:

- ``safeailab``: yuhuili/EAGLE3-* (SafeAILab EAGLE repo): ``LlamaForCausalLMEagle3``, a bare Llama
  config without ``rope_theta`` (10000 applies) or layer ids (the default layers), ``midlayer.*``,
  ``pytorch_model.bin`` in fp16, ``d2t``/``t2d``.
- ``specforge-hf``: SpecForge's ``save_pretrained``: the export config without localspec's marker,
  with ``transformers_version`` and ``torch_dtype``; ``eagle_config`` ids are layer OUTPUTS.
- ``angelslim``: vLLM's ``Eagle3LlamaForCausalLM`` (AngelSlim), ``midlayer.*``, top-level
  ``eagle_aux_hidden_state_layer_ids`` (layer inputs, as vLLM reads them), bf16 ``.bin``.
- ``speculators-tf5``: the speculators export with a transformers-5 ``transformer_layer_config``
  (``rope_parameters`` instead of ``rope_theta``).
- ``modelopt``: ModelOpt's ``EagleExporter``: its ``llama_eagle_template_config`` keys,
  ``eagle_config`` with ids naming layer OUTPUTS, ``layers.0.*``, ``d2t`` only, bf16 safetensors.
- ``automodel-raw``: NeMo Automodel's training checkpoint: the TARGET's config (its
  ``num_hidden_layers``) plus ``LlamaEagle3DraftModel`` and its flags, ``model.*`` names with
  ``lm_head``/``d2t``/``t2d`` at the top, ``model.embed_tokens`` always (the target's copy), no ids.
- ``automodel-sglang`` / ``automodel-vllm``: Automodel's serve exports (``serve_sglang``: names
  kept, ``num_hidden_layers`` inferred = 1; ``serve_vllm``: ``model.`` stripped, depth left).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from localspec.converters.canonical import DrafterWeights
from localspec.converters.export import checkpoint_config, checkpoint_tensors, reference_tensors
from localspec.converters.layouts import default_layers

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# layouts whose tools have EAGLE-3.1 (fc_norm / norm_output)
EAGLE31_LAYOUTS = ("specforge", "specforge-hf", "vllm", "speculators", "speculators-tf5", "automodel-raw",
                   "automodel-sglang", "automodel-vllm")
# layouts that write no layer ids (the drafter must use the default layers)
NO_IDS = ("safeailab", "automodel-raw", "automodel-sglang", "automodel-vllm")
LAYOUTS = ("safeailab", "specforge", "specforge-hf", "angelslim", "vllm", "speculators", "speculators-tf5",
           "modelopt", "automodel-raw", "automodel-sglang", "automodel-vllm")


def _torch_state(arrays: dict[str, np.ndarray], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in arrays.items():
        t = torch.from_numpy(np.ascontiguousarray(v))
        out[k] = t.to(dtype) if t.is_floating_point() else t
    return out


def _save(out: Path, state: dict[str, torch.Tensor], weight_format: str) -> None:
    if weight_format == "bin":
        torch.save(state, out / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
                  metadata={"format": "pt"})


def _llama(w: DrafterWeights, **extra) -> dict:
    c = w.config
    out = {"model_type": "llama", "hidden_act": "silu", "hidden_size": c.hidden_size,
           "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
           "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_eps,
           "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position, "vocab_size": c.vocab_size,
           "num_hidden_layers": 1, "tie_word_embeddings": False}
    out.update(extra)
    return out


def write_layout(layout: str, weights: DrafterWeights, out: Path, *, dtype: str = "bfloat16",
                 weight_format: str = "safetensors", fc_norm_weights: np.ndarray | None = None,
                 target_n_layer: int, target_embeddings: np.ndarray | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    cfg = weights.config
    lids = [int(x) for x in cfg.target_layers]
    if layout in NO_IDS:
        assert tuple(lids) == default_layers(target_n_layer), f"{layout} writes no ids: default layers only"
    if layout not in EAGLE31_LAYOUTS:
        assert not (cfg.fc_norm or cfg.norm_output), f"{layout} has no EAGLE-3.1"
    tdtype = DTYPES[dtype]
    eagle31 = {"fc_norm": bool(cfg.fc_norm), "norm_output": bool(cfg.norm_output)}

    if layout in ("specforge", "specforge-hf", "speculators", "speculators-tf5"):
        fmt = "specforge" if layout.startswith("specforge") else "speculators"
        config = checkpoint_config(weights, fmt)
        arrays = checkpoint_tensors(weights, fmt, fc_norm_weights=fc_norm_weights)
        if layout == "specforge-hf":
            config.pop("localspec")
            config.update(transformers_version="4.57.1", torch_dtype=dtype)
        if layout == "speculators-tf5":
            layer = config["transformer_layer_config"]
            layer["rope_parameters"] = {"rope_type": "default", "rope_theta": layer.pop("rope_theta")}
            layer["transformers_version"] = "5.0.0"
        (out / "config.json").write_text(json.dumps(config, indent=2))
        _save(out, _torch_state(arrays, tdtype), weight_format)
        return out

    ref = reference_tensors(weights, fc_norm_weights=fc_norm_weights)
    if layout == "safeailab":
        config = {"architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 1, "eos_token_id": 2,
                  **_llama(w=weights, pretraining_tp=1, rope_scaling=None, torch_dtype="float16",
                           transformers_version="4.28.1", use_cache=True, draft_vocab_size=weights.draft_vocab)}
        config.pop("head_dim")
        if cfg.rope_theta == 10000.0:
            config.pop("rope_theta")
        state = ref
    elif layout in ("angelslim", "vllm"):
        config = {"architectures": ["Eagle3LlamaForCausalLM"], **_llama(weights), "draft_vocab_size": weights.draft_vocab,
                  "target_hidden_size": cfg.target_hidden_size, "norm_before_residual": bool(cfg.norm_before_residual),
                  "eagle_aux_hidden_state_layer_ids": lids, "torch_dtype": dtype, "transformers_version": "4.51.0"}
        if layout == "vllm":      # vLLM's own names (it renames midlayer.* to layers.0.*), EAGLE-3.1 flags
            config.update(eagle31)
            state = {k.replace("midlayer.", "layers.0."): v for k, v in ref.items()}
        else:
            state = ref
    elif layout == "modelopt":
        config = {"architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": None, "eos_token_id": None,
                  **_llama(weights), "initializer_range": 0.01, "pad_token_id": None, "torch_dtype": dtype,
                  "transformers_version": "4.55.4", "use_cache": True, "draft_vocab_size": weights.draft_vocab,
                  "rope_scaling": {"rope_type": "default", "rope_theta": cfg.rope_theta}, "attention_bias": False,
                  "attention_dropout": 0.0, "mlp_bias": False, "pretraining_tp": 1,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": [lid - 1 for lid in lids],
                                   "use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True,
                                   "use_last_layernorm": True, "use_mtp_layernorm": False, "next_layer_regular": True,
                                   "parallel_draft_step": 1, "parallel_draft_heads_num_layers": 1}}
        state = {k.replace("midlayer.", "layers.0.").replace("enc_norm.", "input_norm."): v
                 for k, v in ref.items() if k != "t2d"}
    elif layout.startswith("automodel"):
        # the target's own config, as Automodel's recipe copies it, plus the draft's keys
        config = {"architectures": ["LlamaEagle3DraftModel"], "attention_bias": False, "attention_dropout": 0.0,
                  "bos_token_id": 1, "eos_token_id": 2, **_llama(weights, num_hidden_layers=target_n_layer),
                  "initializer_range": 0.02, "mlp_bias": False, "pretraining_tp": 1, "rope_scaling": None,
                  "torch_dtype": dtype, "transformers_version": "4.57.1", "use_cache": True,
                  "draft_vocab_size": weights.draft_vocab, "target_hidden_size": cfg.target_hidden_size,
                  "attn_implementation": "eager", "parallel_drafting": False, **eagle31}
        embed = ref.get("embed_tokens.weight", target_embeddings)
        assert embed is not None, "Automodel always saves embed_tokens: pass the target's"
        ref = {**ref, "embed_tokens.weight": np.asarray(embed, np.float32)}
        top = ("lm_head.weight", "d2t", "t2d")
        state = {(k if k in top else "model." + k.replace("midlayer.", "layers.0.")): v for k, v in ref.items()}
        if layout == "automodel-sglang":
            config.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1)
        elif layout == "automodel-vllm":
            config.update(architectures=["LlamaForCausalLMEagle3"])
            state = {k.removeprefix("model."): v for k, v in state.items()}
    else:
        raise AssertionError(layout)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    _save(out, _torch_state(state, tdtype), weight_format)
    return out


def through_dtype(weights: DrafterWeights, dtype: str, fc_norm_weights: np.ndarray | None = None) -> DrafterWeights:
    """The drafter as a checkpoint of ``dtype`` stores it (floats rounded to it, back to float32).
    With ``fc_norm_weights`` the checkpoint's fc is the folded fc divided by them: that is what is
    rounded, and converting multiplies it back."""
    from localspec.formats import gguf_consts as K
    tdtype = DTYPES[dtype]

    def rnd(v: np.ndarray) -> np.ndarray:
        return torch.from_numpy(np.ascontiguousarray(v)).to(tdtype).to(torch.float32).numpy()

    tensors = {k: (rnd(v) if v.dtype.kind == "f" else v) for k, v in weights.tensors.items()}
    if fc_norm_weights is not None:
        w = np.concatenate(list(np.asarray(fc_norm_weights, np.float32)))[None, :]
        tensors[K.T_FC] = rnd(weights.tensors[K.T_FC] / w) * w
    return DrafterWeights(weights.config, tensors, weights.d2t)
