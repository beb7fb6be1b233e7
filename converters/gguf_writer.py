"""Write a canonical drafter (:mod:`.canonical`) as an ``eagle3`` GGUF, atomically.

The target's tokenizer is copied from its GGUF (llama.cpp needs one in every model file). The file
appears at its final path only when complete: on any failure no output exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from localspec.formats import gguf_consts as K
from localspec.core.atomic import atomic_path
from localspec.core.errors import LocalspecError
from localspec.llama.gguf_native import ARRAY, GGUFHeader

from .canonical import DrafterWeights
from .provenance import base_name, looks_like_path

OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def _value_type(kind: int):
    import gguf

    return gguf.GGUFValueType(kind)


def _tensor_for(name: str, data: np.ndarray, outtype: str) -> tuple[np.ndarray, Any]:
    """The array to store and its raw ggml type (None: inferred from the numpy dtype)."""
    import gguf

    if name == K.T_D2T:
        return data.astype(np.int64), None
    matrix = data.ndim == 2
    if not matrix or outtype == "f32":
        return data.astype(np.float32), None
    if outtype == "f16":
        return data.astype(np.float16), None
    qtype = {"bf16": gguf.GGMLQuantizationType.BF16, "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]
    if outtype == "q8_0" and data.shape[-1] % 32:
        return data.astype(np.float16), None  # rows not divisible into Q8_0 blocks
    return gguf.quants.quantize(data.astype(np.float32), qtype), qtype


def write_drafter_gguf(weights: DrafterWeights, target_gguf: str | Path, out: str | Path, *,
                       outtype: str = "f16", progress: bool = False) -> Path:
    """Write the drafter to ``out`` atomically."""
    if outtype not in OUTTYPES:
        raise LocalspecError(f"unknown output type '{outtype}' (one of {', '.join(OUTTYPES)})")
    out = Path(out)
    with atomic_path(out) as tmp:
        write_gguf_file(weights, target_gguf, tmp, outtype=outtype, progress=progress)
    return out


def write_gguf_file(weights: DrafterWeights, target_gguf: str | Path, tmp: str | Path, *,
                    outtype: str = "f16", progress: bool = False) -> Path:
    """Write the drafter to ``tmp`` as it is (a partial file of :func:`localspec.core.atomic.atomic_path`)."""
    import gguf

    if outtype not in OUTTYPES:
        raise LocalspecError(f"unknown output type '{outtype}' (one of {', '.join(OUTTYPES)})")
    cfg = weights.config
    target = GGUFHeader(target_gguf)
    tmp = Path(tmp)
    arch = K.EAGLE3_ARCH
    writer = gguf.GGUFWriter(str(tmp), arch)
    writer.add_name(f"EAGLE drafter ({cfg.variant}) for {target.kv.get(K.KEY_NAME) or Path(target_gguf).stem}")
    writer.add_uint32(K.key(K.KEY_CONTEXT_LENGTH, arch), cfg.max_position)
    writer.add_uint32(K.key(K.KEY_EMBEDDING_LENGTH, arch), cfg.hidden_size)
    writer.add_uint32(K.key(K.KEY_FEED_FORWARD_LENGTH, arch), cfg.intermediate_size)
    writer.add_uint32(K.key(K.KEY_BLOCK_COUNT, arch), 1)
    writer.add_uint32(K.key(K.KEY_HEAD_COUNT, arch), cfg.num_heads)
    writer.add_uint32(K.key(K.KEY_HEAD_COUNT_KV, arch), cfg.num_kv_heads)
    writer.add_float32(K.key(K.KEY_RMS_EPS, arch), cfg.rms_eps)
    writer.add_float32(K.key(K.KEY_ROPE_FREQ_BASE, arch), cfg.rope_theta)
    writer.add_uint32(K.key(K.KEY_ROPE_DIMENSION_COUNT, arch), cfg.head_dim)
    writer.add_uint32(K.key(K.KEY_KEY_LENGTH, arch), cfg.head_dim)
    writer.add_uint32(K.key(K.KEY_VALUE_LENGTH, arch), cfg.head_dim)
    writer.add_uint32(K.key(K.KEY_VOCAB_SIZE, arch), cfg.vocab_size)
    writer.add_array(K.key(K.KEY_TARGET_LAYERS, arch), [int(x) for x in cfg.target_layers])
    writer.add_uint32(K.key(K.KEY_TARGET_HIDDEN_SIZE, arch), cfg.target_hidden_size)
    writer.add_bool(K.key(K.KEY_NORM_BEFORE_RESIDUAL, arch), cfg.norm_before_residual)
    writer.add_bool(K.key(K.KEY_NORM_BEFORE_FC, arch), cfg.norm_before_fc)
    writer.add_string(K.KEY_LS_VARIANT, cfg.variant)
    writer.add_bool(K.KEY_LS_FC_NORM, cfg.fc_norm)
    if cfg.fc_norm_eps is not None:
        writer.add_float32(K.KEY_LS_FC_NORM_EPS, cfg.fc_norm_eps)
    writer.add_bool(K.KEY_LS_NORM_OUTPUT, cfg.norm_output)
    if cfg.source_layout:
        writer.add_string(K.KEY_LS_SOURCE_LAYOUT, cfg.source_layout)
    source = base_name(cfg.source) if looks_like_path(cfg.source) else cfg.source
    if source:
        writer.add_string(K.KEY_LS_SOURCE, source)
    if cfg.source_revision:
        writer.add_string(K.KEY_LS_SOURCE_REVISION, cfg.source_revision)
    for key, value in target.kv.items():
        if not key.startswith(K.KEY_TOKENIZER_PREFIX):
            continue
        kind, sub = target.types[key]
        if kind == ARRAY:
            writer.add_key_value(key, list(value.tolist() if isinstance(value, np.ndarray) else value),
                                 _value_type(kind), sub_type=_value_type(sub))
        else:
            writer.add_key_value(key, value, _value_type(kind))
    tensors = dict(weights.tensors)
    if weights.d2t is not None:
        tensors[K.T_D2T] = weights.d2t
    for name, data in tensors.items():
        array, raw = _tensor_for(name, np.asarray(data), outtype)
        if raw is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, array, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=progress)
    writer.close()
    return tmp
