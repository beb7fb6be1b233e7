"""Write a trained drafter as a checkpoint directory and convert it to GGUF with the converter.

The directory is the SpecForge-style EAGLE-3 layout that ``convert_checkpoint`` reads:
``config.json`` (``LlamaForCausalLMEagle3``, ``eagle_config.eagle_aux_hidden_state_layer_ids`` in
llama.cpp's convention: the input of those target layers, ``norm_output`` for EAGLE-3.1) and
``model.safetensors`` (``EagleReference.state_dict()``: ``fc_norm.{0,1,2}.weight``, ``d2t`` as
int64 offsets, ``t2d`` as a bool mask over the target vocabulary, no token embeddings).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from ..core.atomic import atomic_path, atomic_write
from ..converters.canonical import DrafterConfig
from ..core.errors import LocalspecError
from .dataset import check_free_space


def checkpoint_config(cfg: DrafterConfig, draft_vocab: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(cfg.target_layers)},
        "norm_output": bool(cfg.norm_output),
        # marks llama.cpp's layer-id convention for the converter, whatever else writes this file
        "localspec": {"layer_ids": "input"},
    }


def write_checkpoint_dir(state_dict: dict, cfg: DrafterConfig, out_dir: Path) -> Path:
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    check_free_space(out_dir)
    tensors = {k: v.detach().contiguous().clone() for k, v in state_dict.items()}
    d2t = tensors["d2t"].long()
    ids = torch.arange(len(d2t)) + d2t
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    tensors["d2t"] = d2t
    tensors["t2d"] = t2d
    for k, v in tensors.items():
        if v.is_floating_point():
            tensors[k] = v.float()
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(tensors, str(tmp))
    atomic_write(out_dir / "config.json", json.dumps(checkpoint_config(cfg, len(d2t)), indent=2) + "\n")
    return out_dir


def export_gguf(state_dict: dict, cfg: DrafterConfig, target: Path, out: Path, work: Path, *,
                outtype: str = "f16", force: bool = True):
    """Checkpoint directory under ``work`` -> ``convert_checkpoint`` -> ``out`` (atomic)."""
    from ..converters.convert import convert_checkpoint

    out = Path(out)
    check_free_space(out.parent)
    ckpt_dir = write_checkpoint_dir(state_dict, cfg, Path(work) / "checkpoint-hf")
    return convert_checkpoint(ckpt_dir, target, out, outtype=outtype, force=force)
