"""DFlash and DSpark checkpoints (z-lab's ``DFlashDraftModel``; DeepSeek's and the DFlash-lineage
DSpark exports) to the ``dflash`` GGUF that the pinned llama.cpp's ``convert_hf_to_gguf.py``
writes (``conversion/qwen.py``: ``DFlashModel``, a Qwen3 model, and ``DSparkModel``).

The tensors, as gguf-py's ``TensorNameMap`` maps them for ``MODEL_ARCH.DFLASH``: the Qwen3 layer
names per ``model.layers.N``, ``model.fc`` -> ``fc``, ``model.hidden_norm`` -> ``enc.output_norm``,
``model.norm`` -> ``output_norm``, ``model.markov_head.markov_w1/2`` -> ``markov_w1/2``,
``model.confidence_head.proj`` -> ``conf_proj``; a full-vocabulary DSpark's ``lm_head`` is dropped
(the target's is read), ``t2d`` too. The keys: the Qwen3 model's sizes, ``dflash.block_size``
(``dflash_config.block_size``, else ``block_size``, else 16), ``dflash.target_layers`` (the
checkpoint's ``target_layer_ids`` + 1: llama.cpp extracts layer inputs), ``attention.causal``
where the checkpoint says, DSpark's ``sample_from_anchor`` and ``has_confidence_head``, and the
target's tokenizer with ``tokenizer.ggml.mask_token_id`` (a DSpark draft ships none: the target's
GGUF supplies it, as ``--target-model-dir`` does for llama.cpp's converter).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from localspec.core.errors import LocalspecError

BLOCK_ARCHITECTURES = ("DFlashDraftModel", "Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator",
                       "Lfm2DSparkDraftModel", "LingDSparkModel")
ARCH = "dflash"
_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
          "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GLOBAL = {"model.fc.weight": "fc.weight", "model.hidden_norm.weight": "enc.output_norm.weight",
           "model.norm.weight": "output_norm.weight", "model.embed_tokens.weight": "token_embd.weight",
           "model.lm_head.weight": "output.weight", "model.markov_head.markov_w1.weight": "markov_w1.weight",
           "model.markov_head.markov_w2.weight": "markov_w2.weight",
           "model.confidence_head.proj.weight": "conf_proj.weight", "model.confidence_head.proj.bias": "conf_proj.bias"}


def is_block_checkpoint(config: dict) -> bool:
    """A DFlash or DSpark checkpoint (its ``architectures``, or a ``dflash_config``)."""
    return bool(set(config.get("architectures") or ()) & set(BLOCK_ARCHITECTURES)) or "dflash_config" in config


def normalized_config(config: dict) -> dict:
    """The speculators format's config (``transformer_layer_config`` beside its own keys) as one
    dict, as llama.cpp's DSparkModel reads it; a DSpark's ``sample_from_anchor`` (EAGLE-3-style
    exports, the speculators format among them, put a bonus anchor first: False)."""
    out = dict(config)
    if _is_dspark(config):
        out.setdefault("sample_from_anchor", "transformer_layer_config" not in config
                       and "aux_hidden_state_layer_ids" not in config)
    out.update(config.get("transformer_layer_config") or {})
    return out


def _is_dspark(config: dict) -> bool:
    return any("DSpark" in a for a in config.get("architectures") or ())


def gguf_name(name: str) -> str | None:
    """A checkpoint tensor's GGUF name (None: not written)."""
    if not name.startswith("model."):
        name = "model." + name
    if name.endswith((".markov_w1", ".markov_w2")):
        name += ".weight"
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    if m and m.group(2) in _LAYER:
        return f"blk.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
    return _GLOBAL.get(name)


def block_keys(config: dict) -> tuple[dict, int]:
    """The keys llama.cpp's DFlashModel / DSparkModel write from ``config`` (the tokenizer aside),
    and the mask token."""
    dflash = dict(config.get("dflash_config") or {})
    if "aux_hidden_state_layer_ids" in config:   # the speculators format: layer ids counted from 1
        dflash.setdefault("target_layer_ids", [int(i) - 1 for i in config["aux_hidden_state_layer_ids"]])
    for k in ("target_layer_ids", "mask_token_id"):
        if k not in dflash and k in config:
            dflash[k] = config[k]
    layers = dflash.get("target_layer_ids") or []
    if not layers or "mask_token_id" not in dflash:
        raise LocalspecError("a DFlash / DSpark checkpoint needs target_layer_ids and mask_token_id "
                             "(in dflash_config or its config)")
    heads = config["num_attention_heads"]
    keys = {"block_count": config["num_hidden_layers"], "context_length": config.get("max_position_embeddings", 4096),
            "embedding_length": config["hidden_size"], "feed_forward_length": config["intermediate_size"],
            "attention.head_count": heads, "attention.head_count_kv": config.get("num_key_value_heads", heads),
            "rope.freq_base": float(config.get("rope_theta", 10000.0)),
            "attention.layer_norm_rms_epsilon": float(config.get("rms_norm_eps", 1e-6)),
            "block_size": int(dflash.get("block_size", config.get("block_size", 16))),
            "target_layers": [int(i) + 1 for i in layers]}
    head_dim = config.get("head_dim")
    if head_dim:
        keys["attention.key_length"] = keys["attention.value_length"] = int(head_dim)
    causal = config.get("is_causal", dflash.get("causal"))
    if causal is not None:
        keys["attention.causal"] = bool(causal)
    return keys, int(dflash["mask_token_id"])


def write_block_gguf(ckpt, target_gguf: Path, out: Path, outtype: str = "f32") -> None:
    """The dflash GGUF of checkpoint ``ckpt`` (a converters.checkpoint.Checkpoint) for the target
    whose tokenizer it copies."""
    import gguf

    from localspec.llama.gguf_native import ARRAY, GGUFHeader

    config = normalized_config(ckpt.config)
    keys, mask = block_keys(config)
    writer = gguf.GGUFWriter(str(out), ARCH)
    writer.add_name(str(config.get("name") or ckpt.provenance or Path(ckpt.source).name))
    for key, value in keys.items():
        if isinstance(value, bool):
            writer.add_bool(f"{ARCH}.{key}", value)
        elif isinstance(value, list):
            writer.add_array(f"{ARCH}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{ARCH}.{key}", value)
        else:
            writer.add_uint32(f"{ARCH}.{key}", int(value))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if outtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    names = ckpt.names()
    if _is_dspark(config):
        writer.add_bool(f"{ARCH}.sample_from_anchor", bool(config["sample_from_anchor"]))
        writer.add_bool(f"{ARCH}.has_confidence_head", any("confidence_head.proj" in n for n in names))
    header = GGUFHeader(target_gguf)
    for key, value in header.kv.items():
        if key.startswith("tokenizer.") and key != "tokenizer.ggml.mask_token_id":
            kind, sub = header.types[key]
            if kind == ARRAY:
                items = value.tolist() if isinstance(value, np.ndarray) else list(value)
                writer.add_key_value(key, items, gguf.GGUFValueType(kind), sub_type=gguf.GGUFValueType(sub))
            else:
                writer.add_key_value(key, value, gguf.GGUFValueType(kind))
    writer.add_uint32("tokenizer.ggml.mask_token_id", mask)
    _add_tensors(writer, ckpt, config, outtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_tensors(writer, ckpt, config: dict, outtype: str) -> None:
    full_vocab = (config.get("draft_vocab_size") or config["vocab_size"]) == config["vocab_size"]
    for name in ckpt.names():
        if name in ("d2t", "model.d2t"):   # a reduced draft vocabulary: absolute target ids, I64
            offsets = ckpt.tensor(name).astype(np.int64).reshape(-1)
            writer.add_tensor("d2t", offsets + np.arange(offsets.size, dtype=np.int64))
            continue
        target = gguf_name(name)
        if target is None or (target == "output.weight" and _is_dspark(config) and full_vocab):
            continue
        data = ckpt.tensor(name).astype(np.float32)
        if outtype != "f32" and data.ndim == 2:   # matrices in F16, as the converter's --outtype f16
            data = data.astype(np.float16)
        writer.add_tensor(target, data)
