"""Read an ``eagle3`` drafter GGUF back into the canonical :class:`~.canonical.DrafterWeights`
(the inverse of :mod:`.gguf_writer`): float32 tensors under their GGUF names, q/k still in
llama.cpp's row order, fc_norm folded into fc, ``d2t`` absolute. Quantized matrices (BF16, Q8_0,
...) are dequantized with the ``gguf`` package to the exact values llama.cpp computes with.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localspec.formats import gguf_consts as K
from localspec.core.errors import LocalspecError
from localspec.formats.gguf_info import check_drafter, read_gguf
from localspec.llama.gguf_native import TENSOR_NUMPY, GGUFHeader

from .canonical import DrafterConfig, DrafterWeights


def tensor_values(header: GGUFHeader, name: str) -> np.ndarray:
    """One tensor as numpy (PyTorch orientation); quantized types dequantized to float32."""
    shape, kind, size, offset = header.tensors[name]
    if kind in TENSOR_NUMPY:
        data = header.tensor_data(name)
        return data if data.dtype.kind in "iu" else data.astype(np.float32)
    import gguf

    raw = np.fromfile(header.path, dtype=np.uint8, count=size, offset=offset)
    if raw.size != size:
        raise LocalspecError(f"{header.path}: file is truncated (tensor {name})")
    dims = tuple(reversed(shape))
    try:
        qtype = gguf.GGMLQuantizationType(kind)
        values = gguf.quants.dequantize(raw.reshape(*dims[:-1], -1), qtype)
    except (ValueError, NotImplementedError) as exc:
        raise LocalspecError(f"{header.path}: cannot read tensor {name} of type {GGUFHeader.type_name(kind)} ({exc})") from None
    return np.asarray(values, dtype=np.float32).reshape(dims)


def stored_types(path: str | Path) -> dict[str, str]:
    """GGUF tensor name -> ggml type name (F32, F16, BF16, Q8_0, ...)."""
    header = GGUFHeader(path)
    return {n: GGUFHeader.type_name(kind) for n, (_, kind, _, _) in header.tensors.items()}


def read_drafter_gguf(path: str | Path) -> DrafterWeights:
    info = read_gguf(path)   # every metadata value checked for its kind there (one error type)
    if not info.is_drafter:
        raise LocalspecError(f"{info.path}: not an EAGLE-3 drafter (architecture {info.arch})")
    check_drafter(info)      # the sizes the tensors are cut by: heads dividing, nothing zero
    header = GGUFHeader(info.path)
    kv, arch = header.kv, K.EAGLE3_ARCH

    def meta(template: str, default=None):
        value = kv.get(K.key(template, arch))
        return default if value is None else value

    head_dim = int(meta(K.KEY_KEY_LENGTH) or meta(K.KEY_ROPE_DIMENSION_COUNT) or 0)
    n_head = int(meta(K.KEY_HEAD_COUNT, 0))
    tensors = {name: tensor_values(header, name) for name in header.tensors if name != K.T_D2T}
    d2t = header.tensor_data(K.T_D2T).astype(np.int64) if K.T_D2T in header.tensors else None
    factors = tensors.get(K.T_ROPE_FREQS)
    cfg = DrafterConfig(
        hidden_size=info.n_embd, intermediate_size=int(meta(K.KEY_FEED_FORWARD_LENGTH, 0)),
        num_heads=n_head, num_kv_heads=int(meta(K.KEY_HEAD_COUNT_KV, n_head)),
        head_dim=head_dim or info.n_embd // max(n_head, 1), rms_eps=float(meta(K.KEY_RMS_EPS, 1e-6)),
        rope_theta=float(meta(K.KEY_ROPE_FREQ_BASE) or 10000.0), max_position=info.n_ctx_train or 4096,
        target_hidden_size=int(info.target_hidden_size or info.n_embd),
        target_layers=tuple(int(x) for x in info.target_layers or ()),  # type: ignore[arg-type]
        vocab_size=int(meta(K.KEY_VOCAB_SIZE, info.n_vocab) or info.n_vocab),
        variant=info.variant or K.VARIANT_EAGLE3, norm_before_fc=info.norm_before_fc,
        norm_before_residual=info.norm_before_residual, fc_norm=info.fc_norm,
        fc_norm_eps=float(info.fc_norm_eps) if info.fc_norm_eps is not None else None, norm_output=info.norm_output,
        source_layout=str(kv.get(K.KEY_LS_SOURCE_LAYOUT) or ""), source=str(kv.get(K.KEY_LS_SOURCE) or ""),
        source_revision=str(kv.get(K.KEY_LS_SOURCE_REVISION) or ""),
        rope_freq_factors=tuple(float(x) for x in factors) if factors is not None else None,
    )
    if len(cfg.target_layers) != 3:
        raise LocalspecError(f"{info.path}: {K.key(K.KEY_TARGET_LAYERS, arch)} must hold 3 layers (got {list(cfg.target_layers)})")
    if d2t is not None and len(d2t) and (d2t.min() < 0 or d2t.max() >= cfg.vocab_size):
        raise LocalspecError(f"{info.path}: d2t maps draft tokens to ids outside the target's vocabulary "
                             f"(0..{cfg.vocab_size - 1}; it names {int(d2t.max() if d2t.max() >= cfg.vocab_size else d2t.min())})")
    return DrafterWeights(cfg, tensors, d2t)
