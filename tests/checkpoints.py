"""Tiny EAGLE-3 drafter checkpoints in every supported layout (random weights, the real key names and
configs), as the named training tools write them. Needs torch: import it after
``pytest.importorskip("torch")``. Used by test_convert, test_checkpoint_repair, test_interrupts."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from localspec.converters.canonical import DrafterConfig
from localspec.converters.reference import EagleReference
from localspec.formats import gguf_consts as K
from tiny_models import N_EMBD

VOCAB = 49152
N_LAYER = 8
H, FF, NH, NKV, HD = 64, 128, 4, 2, 16
DRAFT_VOCAB = 600


# ---------------------------------------------------------------------------------------------
# tiny checkpoints in each layout
# ---------------------------------------------------------------------------------------------
def make_reference(*, fc_norm=False, norm_output=False, norm_before_fc=False, norm_before_residual=False,
                   own_embeddings=False, draft_vocab: int | None = DRAFT_VOCAB, layers=(1, 3, 6),
                   rope_factors=None, seed=0) -> EagleReference:
    cfg = DrafterConfig(
        hidden_size=H, intermediate_size=FF, num_heads=NH, num_kv_heads=NKV, head_dim=HD, rms_eps=1e-5,
        rope_theta=10000.0, max_position=4096, target_hidden_size=N_EMBD, target_layers=tuple(layers),
        vocab_size=VOCAB, variant=K.VARIANT_EAGLE31 if (fc_norm or norm_output) else K.VARIANT_EAGLE3,
        norm_before_fc=norm_before_fc, norm_before_residual=norm_before_residual, fc_norm=fc_norm,
        fc_norm_eps=1e-5 if fc_norm else None, norm_output=norm_output, rope_freq_factors=rope_factors,
    )
    torch.manual_seed(seed)
    ref = EagleReference(cfg, draft_vocab=draft_vocab, own_embeddings=own_embeddings)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))   # norms around 1, not symmetric noise
            else:
                p.copy_(torch.randn_like(p) * 0.2)
        if draft_vocab:
            ids = torch.sort(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:draft_vocab]).values
            ref.d2t.copy_(ids - torch.arange(draft_vocab))
    return ref


def _llama_config(ref: EagleReference, **extra) -> dict:
    cfg = ref.cfg
    out = {
        "model_type": "llama", "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position,
        "vocab_size": cfg.vocab_size, "hidden_act": "silu",
    }
    if ref.draft_vocab != cfg.vocab_size:
        out["draft_vocab_size"] = ref.draft_vocab
    out.update(extra)
    return out


def _state(ref: EagleReference, rename=lambda k: k, *, t2d=True, full_d2t=False) -> dict:
    sd = {rename(k): v.detach().clone().contiguous() for k, v in ref.state_dict().items()}
    if not full_d2t and ref.draft_vocab == ref.cfg.vocab_size:
        sd.pop(rename("d2t"), None)
    if t2d and ref.draft_vocab != ref.cfg.vocab_size:
        t = torch.zeros(ref.cfg.vocab_size, dtype=torch.bool)
        t[ref.target_ids()] = True
        sd["t2d"] = t
    return sd


def write_checkpoint(layout: str, ref: EagleReference, path: Path, *, ids=None, extra: dict | None = None) -> Path:
    """A checkpoint directory as the named tool writes it."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = ref.cfg
    ids = list(ids) if ids is not None else None
    eagle31 = {}
    if cfg.fc_norm:
        eagle31["fc_norm"] = True
    if cfg.norm_output:
        eagle31["norm_output"] = True
    if layout == "localspec":   # exactly what `localspec train` writes
        config = {"architectures": ["LlamaForCausalLMEagle3"], **_llama_config(ref), "draft_vocab_size": ref.draft_vocab,
                  "target_hidden_size": cfg.target_hidden_size, "tie_word_embeddings": False,
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}
        config.pop("hidden_act")
        if cfg.norm_output:
            config["norm_output"] = True
        sd = _state(ref, full_d2t=True)   # EagleReference.state_dict() as it is
    elif layout == "specforge":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **_llama_config(ref), "num_hidden_layers": 1,
                  "attention_bias": False, "pretraining_tp": 1, "tie_word_embeddings": False,
                  "torch_dtype": "bfloat16", "transformers_version": "4.53.2", **eagle31}
        if ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
        sd = _state(ref)
    elif layout == "vllm":
        config = {"architectures": ["Eagle3LlamaForCausalLM"], **_llama_config(ref), "num_hidden_layers": 1,
                  "norm_before_residual": cfg.norm_before_residual, "target_hidden_size": cfg.target_hidden_size,
                  "transformers_version": "4.51.0", **eagle31}
        if ids is not None:
            config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
        sd = _state(ref, lambda k: k.replace("midlayer.", "layers.0."))
    elif layout == "speculators":
        layer = _llama_config(ref, num_hidden_layers=1, architectures=["LlamaForCausalLM"])
        layer.pop("draft_vocab_size", None)
        config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
                  "speculators_version": "0.3.0", "transformer_layer_config": layer,
                  "draft_vocab_size": ref.draft_vocab, "norm_before_residual": cfg.norm_before_residual,
                  "target_hidden_size": cfg.target_hidden_size, "eagle_aux_hidden_state_layer_ids": ids,
                  "norm_before_fc": cfg.norm_before_fc, "fc_norm": cfg.fc_norm, "norm_output": cfg.norm_output,
                  "embed_requires_grad": False,
                  "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                         "verifier": {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                      "architectures": ["LlamaForCausalLM"]}}}
        sd = _state(ref, lambda k: k.replace("midlayer.", "layers.0.").replace("enc_norm.", "input_norm."))
    elif layout == "modelopt":
        eagle = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True,
                 "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                 "use_mtp_layernorm": False, "norm_before_fc": cfg.norm_before_fc}
        config = {"architectures": ["LlamaForCausalLMEagle3"], **_llama_config(ref), "num_hidden_layers": 1,
                  "eagle_config": eagle, "transformers_version": "4.55.0", **eagle31}
        sd = _state(ref, lambda k: k.replace("enc_norm.", "input_norm."), t2d=False)
    elif layout == "nemo":      # NeMo Automodel: model.* names, flags at top level, default layers
        config = {"architectures": ["LlamaForCausalLM"], **_llama_config(ref), "num_hidden_layers": 1,
                  "target_hidden_size": cfg.target_hidden_size, "transformers_version": "4.57.0", **eagle31}

        def nemo(k: str) -> str:
            if k.startswith(("lm_head", "d2t")):
                return k
            return "model." + k.replace("midlayer.", "layers.0.")
        sd = _state(ref, nemo, t2d=False)
    else:
        raise AssertionError(layout)
    if extra:
        config.update(extra)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    save_file(sd, str(path / "model.safetensors"))
    return path
