"""DFlash and DSpark checkpoints (z-lab's ``DFlashDraftModel``; DeepSeek's and the DFlash-lineage
DSpark exports; the speculators format's ``DSparkSpeculator``) to the ``dflash`` GGUF that the
pinned llama.cpp's ``convert_hf_to_gguf.py`` writes (``conversion/qwen.py``: ``DFlashModel``, a
Qwen3 model, and ``DSparkModel``): the same keys in the same order with the same types, the same
tensors in the same order with the same types and data (tests/test_dflash_convert.py runs both).

The tensors, as gguf-py's ``TensorNameMap`` maps them for ``MODEL_ARCH.DFLASH``: the Qwen3 layer
names per ``model.layers.N``, ``model.fc`` -> ``fc``, ``model.hidden_norm`` -> ``enc.output_norm``,
``model.norm`` -> ``output_norm``, ``model.markov_head.markov_w1/2`` -> ``markov_w1/2``,
``model.confidence_head.proj`` -> ``conf_proj``; a full-vocabulary DSpark's ``lm_head`` is dropped
(the target's is read), ``t2d`` too, ``d2t`` is written last as absolute I64 target ids. The keys:
``general.*`` as gguf's ``Metadata`` derives them, the Qwen3 model's sizes (with transformers'
``Qwen3Config`` defaults where the config names ``model_type: qwen3``, as llama.cpp reads it
through ``AutoConfig``), ``dflash.block_size``, ``dflash.target_layers`` (the checkpoint's
``target_layer_ids`` + 1: llama.cpp extracts layer inputs), DSpark's ``sample_from_anchor`` and
``has_confidence_head``, and the target's tokenizer with ``tokenizer.ggml.mask_token_id`` (a DSpark
draft ships none: the target's GGUF supplies it, as ``--target-model-dir`` does for llama.cpp).
What the pinned converter does beyond that (DFlash2, sliding windows, RoPE scaling, interleaved
RoPE, a ``mask_embedding.pt``, tensors outside the Qwen3 set) is refused in one line.
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
_SKIPPED = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")   # the converter drops these
# transformers' Qwen3Config defaults (4.57 and 5.x alike) for the keys llama.cpp writes: a config that
# names model_type qwen3 is read through AutoConfig, which fills in what config.json leaves out
_QWEN3_DEFAULTS = {"max_position_embeddings": 32768, "num_key_value_heads": 32, "head_dim": 128,
                   "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
_REFUSED = {"conv_kernel_size": "DFlash2 (conv_kernel_size)", "use_swa": "a sliding window (use_swa)",
            "use_sliding_window": "a sliding window", "mrope_section": "M-RoPE sections"}


def is_block_checkpoint(config: dict) -> bool:
    """A DFlash or DSpark checkpoint (its ``architectures``, or a ``dflash_config``)."""
    return bool(set(config.get("architectures") or ()) & set(BLOCK_ARCHITECTURES)) or "dflash_config" in config


def normalized_config(config: dict) -> dict:
    """The config as llama.cpp's DSparkModel / DFlashModel read it: the speculators format's
    ``transformer_layer_config`` merged in, a DSpark's ``sample_from_anchor`` (EAGLE-3-style
    exports, the speculators format among them, put a bonus anchor first: False), and
    ``Qwen3Config``'s defaults where the config is a qwen3 one."""
    out = dict(config)
    if _is_dspark(config):
        out.setdefault("sample_from_anchor", "transformer_layer_config" not in config
                       and "aux_hidden_state_layer_ids" not in config)
    out.update(config.get("transformer_layer_config") or {})
    if out.get("model_type") == "qwen3":
        for key, value in _QWEN3_DEFAULTS.items():
            if out.get(key) is None:
                out[key] = value
    return out


def _is_dspark(config: dict) -> bool:
    return any("DSpark" in a for a in config.get("architectures") or ())


def gguf_name(name: str) -> str | None:
    """A checkpoint tensor's GGUF name (None: not written, as llama.cpp drops it). A tensor
    llama.cpp's converter would map to something localspec does not convert is one error."""
    if name in ("t2d", "model.t2d", "d2t", "model.d2t") or name.endswith(_SKIPPED):
        return None
    if not name.startswith("model."):
        name = "model." + name
    if name.endswith((".markov_w1", ".markov_w2")):
        name += ".weight"
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", name)
    if m and m.group(2) in _LAYER:
        return f"blk.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
    if name in _GLOBAL:
        return _GLOBAL[name]
    raise LocalspecError(f"tensor {name} is not one localspec converts for a DFlash / DSpark drafter "
                         "(the Qwen3 layers, fc, hidden_norm, norm, the Markov and confidence heads); "
                         "llama.cpp's convert_hf_to_gguf.py may")


def _refuse_unconverted(config: dict, ckpt) -> None:
    """The pinned converter's features localspec does not write, each one error line."""
    dflash = config.get("dflash_config") or {}
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    for key, what in _REFUSED.items():
        if dflash.get(key) or config.get(key) or rope.get(key):
            raise LocalspecError(f"{ckpt.source}: {what} is not converted by localspec; "
                                 "use llama.cpp's convert_hf_to_gguf.py")
    if rope.get("rope_type") not in (None, "default"):
        raise LocalspecError(f"{ckpt.source}: RoPE scaling '{rope.get('rope_type')}' is not converted by localspec")
    if config.get("rope_is_neox_style", True) is not True:
        raise LocalspecError(f"{ckpt.source}: interleaved RoPE (rope_is_neox_style false) is not converted by localspec")
    if (Path(ckpt.root) / "mask_embedding.pt").is_file():
        raise LocalspecError(f"{ckpt.source}: a mask_embedding.pt is not converted by localspec")
    if config.get("markov_head_type", "vanilla") != "vanilla":
        raise LocalspecError(f"{ckpt.source}: markov_head_type {config['markov_head_type']!r} "
                             "(only 'vanilla' is supported, as in llama.cpp)")


def block_params(config: dict) -> tuple[dict, int]:
    """The DFlash block parameters llama.cpp's DFlashModel / DSparkModel read from ``config``:
    ``dflash_config`` (normalized from DeepSeek's top-level keys and the speculators format's
    ``aux_hidden_state_layer_ids``, counted from 1), and the mask token."""
    dflash = dict(config.get("dflash_config") or {})
    if "aux_hidden_state_layer_ids" in config:   # the speculators format: layer ids counted from 1
        dflash.setdefault("target_layer_ids", [int(i) - 1 for i in config["aux_hidden_state_layer_ids"]])
    for k in ("target_layer_ids", "mask_token_id"):
        if k not in dflash and k in config:
            dflash[k] = config[k]
    if not dflash.get("target_layer_ids") or dflash.get("mask_token_id") is None:
        raise LocalspecError("a DFlash / DSpark checkpoint needs target_layer_ids and mask_token_id "
                             "(in dflash_config or its config)")
    return dflash, int(dflash["mask_token_id"])


def _add_model_keys(writer, config: dict, dflash: dict, file_type, target_kv: dict) -> None:
    """The model's keys in the order and with the types of llama.cpp's TextModel, Qwen3Model and
    DFlashModel ``set_gguf_parameters``."""
    writer.add_block_count(config["num_hidden_layers"])
    for key, add in (("max_position_embeddings", writer.add_context_length), ("hidden_size", writer.add_embedding_length),
                     ("intermediate_size", writer.add_feed_forward_length), ("num_attention_heads", writer.add_head_count),
                     ("num_key_value_heads", writer.add_head_count_kv)):
        if config.get(key) is not None:
            add(config[key])
    if config.get("is_causal") is False:
        writer.add_causal_attention(False)
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta"))
    if theta is not None:
        writer.add_rope_freq_base(theta)
    if config.get("rms_norm_eps") is not None:
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if config.get("head_dim") is not None:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_file_type(file_type)
    partial = rope.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    if partial is not None:
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        writer.add_rope_dimension_count(int(head_dim * partial))
    if dflash.get("attention_value_scale") is not None:
        writer.add_float32(f"{ARCH}.attention.value_scale", float(dflash["attention_value_scale"]))
    writer.add_uint32(f"{ARCH}.block_size", dflash.get("block_size", config.get("block_size", 16)))
    for key, add in (("output_multiplier", writer.add_logit_scale),
                     ("final_logit_softcapping", writer.add_final_logit_softcapping),
                     ("input_embedding_scale", writer.add_embedding_scale)):
        value = dflash.get(key, config.get(key))
        if value is not None and (key != "final_logit_softcapping" or float(value) > 0):
            add(float(value))
    writer.add_array(f"{ARCH}.target_layers", [i + 1 for i in dflash["target_layer_ids"]])
    causal = config.get("is_causal")
    if causal is None:
        causal = dflash.get("causal")
    if causal is not None:
        writer.add_causal_attention(bool(causal))
    if any(k.endswith(".rope.dimension_sections") for k in target_kv):   # an M-RoPE target: temporal dim only
        head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        writer.add_rope_dimension_sections([head_dim // 2, 0, 0, 0])


def write_block_gguf(ckpt, target_gguf: Path, out: Path, outtype: str = "f32") -> None:
    """The dflash GGUF of checkpoint ``ckpt`` (a converters.checkpoint.Checkpoint) for the target
    whose tokenizer it copies: tensors first (their count names the size), then the keys in
    llama.cpp's order (general, model, DSpark, quantization version, tokenizer)."""
    import gguf

    from localspec.llama.gguf_native import GGUFHeader

    config = normalized_config(ckpt.config)
    _refuse_unconverted(config, ckpt)
    dflash, mask = block_params(config)
    header = GGUFHeader(target_gguf)
    writer = gguf.GGUFWriter(str(out), ARCH)
    names = ckpt.names()
    _add_tensors(writer, ckpt, config, outtype)
    total, shared, expert, count = writer.get_total_parameter_count()
    meta = gguf.Metadata.load(None, Path(ckpt.root), None, total)
    if ckpt.revision or meta.name is None:   # a Hub download: its repo id (llama.cpp --remote); else the directory
        meta.name = ckpt.provenance or Path(ckpt.source).name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, count)
    writer.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(writer)
    file_type = gguf.LlamaFileType.ALL_F32 if outtype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    _add_model_keys(writer, config, dflash, file_type, header.kv)
    if _is_dspark(config):
        writer.add_bool(f"{ARCH}.sample_from_anchor", bool(config["sample_from_anchor"]))
        writer.add_bool(f"{ARCH}.has_confidence_head", any("confidence_head.proj" in n for n in names))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _copy_tokenizer(writer, header)
    writer.add_uint32("tokenizer.ggml.mask_token_id", mask)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _copy_tokenizer(writer, header) -> None:
    """The target GGUF's tokenizer keys, in its order and with its types."""
    import gguf

    from localspec.llama.gguf_native import ARRAY

    for key, value in header.kv.items():
        if key.startswith("tokenizer.") and key != "tokenizer.ggml.mask_token_id":
            kind, sub = header.types[key]
            if kind == ARRAY:
                items = value.tolist() if isinstance(value, np.ndarray) else list(value)
                writer.add_key_value(key, items, gguf.GGUFValueType(kind), sub_type=gguf.GGUFValueType(sub))
            else:
                writer.add_key_value(key, value, gguf.GGUFValueType(kind))


def _add_tensors(writer, ckpt, config: dict, outtype: str) -> None:
    """The tensors in the checkpoint's order, as llama.cpp types them (F16 matrices under f16,
    F32 vectors), a full-vocabulary DSpark's lm_head dropped, d2t last."""
    n_vocab = config["vocab_size"]
    n_draft = config.get("draft_vocab_size") or n_vocab
    if n_draft > n_vocab:
        raise LocalspecError(f"draft_vocab_size {n_draft} exceeds vocab_size {n_vocab}")
    d2t = None
    for name in ckpt.names():
        if name in ("d2t", "model.d2t"):
            d2t = ckpt.tensor(name)
            continue
        target = gguf_name(name)
        if target is None or (target == "output.weight" and _is_dspark(config) and n_draft == n_vocab):
            continue
        data = ckpt.tensor(name).astype(np.float32)
        if outtype != "f32" and data.ndim >= 2 and target.endswith(".weight"):
            data = data.astype(np.float16)
        writer.add_tensor(target, data)
    if _is_dspark(config) and n_draft < n_vocab and d2t is None:
        raise LocalspecError(f"draft_vocab_size {n_draft} < vocab_size {n_vocab} but no d2t table found")
    if d2t is not None:
        writer.add_tensor("d2t", _absolute_d2t(d2t, n_draft, n_vocab))


def _absolute_d2t(d2t: np.ndarray, n_draft: int, n_vocab: int) -> np.ndarray:
    """d2t's offsets as absolute target ids (I64), checked as llama.cpp's converter checks them."""
    ids = d2t.astype(np.int64).reshape(-1)
    if ids.size != n_draft:
        raise LocalspecError(f"d2t size {ids.size} does not match draft_vocab_size {n_draft}")
    ids = ids + np.arange(ids.size, dtype=np.int64)
    if np.any((ids < 0) | (ids >= n_vocab)):
        raise LocalspecError(f"d2t target ids out of range for target vocab size {n_vocab}")
    if np.unique(ids).size != ids.size:
        raise LocalspecError("d2t contains duplicate target ids")
    return ids
