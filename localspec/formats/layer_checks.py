"""A target's layer patterns against what its architecture's llama.cpp code asserts or divides by.

The metadata says which blocks are NextN (MTP) heads, which layers slide, which reuse another
layer's KV, which are recurrent and how wide an expert is; llama.cpp's loader, cache and graph
take each as given and abort the whole process (``GGML_ASSERT``, or a division by zero) where they
do not fit, on plain decoding too. Read from the pinned llama.cpp (``src/llama-model.cpp``, ``src/models/*.cpp``,
``src/llama-kv-cache.cpp``); the list, with the assert each check stands in front of, is in
docs/design-notes.md. :func:`check_layers` runs in ``gguf_info.check_target``, before anything loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol

import numpy as np

from . import gguf_consts as K
from ..core.errors import LocalspecError


class GGUFInfo(Protocol):
    """What these checks read of a ``gguf_info.GGUFInfo`` (named structurally: gguf_info imports
    this module)."""

    path: Path
    arch: str
    n_layer: int
    metadata: Mapping[str, Any]
    tensors: Mapping[str, Any]


def check_layers(info: GGUFInfo) -> None:
    """One LocalspecError naming the file and the key, or nothing."""
    for check in (_nextn_problem, _sliding_problem, _shared_kv_problem, _recurrent_problem, _expert_problem):
        problem = check(info)
        if problem:
            raise LocalspecError(f"{info.path.name}: {problem}")


def _value(info: GGUFInfo, template: str) -> Any:
    return info.metadata.get(K.key(template, info.arch))


def _scalar(info: GGUFInfo, template: str) -> int | None:
    """An integer key's value (read_gguf checked its kind); None when absent or given per layer."""
    value = _value(info, template)
    return None if value is None or isinstance(value, (list, np.ndarray)) else int(value)


def _per_layer_flags(value: Any, n_layer: int) -> list[bool] | None:
    """A per-layer array as llama.cpp reads it into its layer flags (non-zero: set; the layers
    past the array's end: not set); None when the value is not an array."""
    if not isinstance(value, (list, np.ndarray)):
        return None
    items = value.tolist() if isinstance(value, np.ndarray) else value
    return ([bool(x) for x in items] + [False] * n_layer)[:n_layer]


def _nextn_problem(info: GGUFInfo) -> str | None:
    """NextN blocks are the last ``nextn_predict_layers`` blocks, after at least one trunk layer;
    each holds eh_proj, enorm and hnorm, or none does (a trunk-only file, its heads elsewhere):
    step35's loader makes every head's tensors optional when the first lacks eh_proj, and its MTP
    graph then asserts them (``GGML_ASSERT(layer.nextn.eh_proj)``); the graphs of the
    architectures outside MTP_CHAINED_ARCHS assert a single block (``n_layer_nextn == 1``)."""
    n, key = _scalar(info, K.KEY_NEXTN_PREDICT_LAYERS), K.key(K.KEY_NEXTN_PREDICT_LAYERS, info.arch)
    if not n:
        return None
    if n >= info.n_layer:
        return (f"{key} {n} leaves none of its {info.n_layer} blocks to the trunk (a target's NextN blocks "
                "come after at least one layer of its own)")
    blocks = range(info.n_layer - n, info.n_layer)
    missing = [f"blk.{i}.{t}" for i in blocks for t in K.NEXTN_TENSORS if f"blk.{i}.{t}" not in info.tensors]
    if missing and len(missing) < n * len(K.NEXTN_TENSORS):
        return (f"{key} declares {n} NextN blocks (blk.{blocks[0]}..blk.{blocks[-1]}) but the file lacks "
                f"{missing[0]}{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}: every NextN block "
                "needs its nextn tensors, or none has them")
    if not missing and n > 1 and info.arch not in K.MTP_CHAINED_ARCHS:
        return (f"{key} is {n}: llama.cpp's {info.arch} drafts with a single NextN block "
                f"(chained heads: {', '.join(sorted(K.MTP_CHAINED_ARCHS))})")
    return None


def _sliding_layers(info: GGUFInfo) -> list[bool] | None:
    """Which layers slide, as the architecture's loader marks them; None: it has no sliding
    windows, or its loader refuses the file itself (a missing required key)."""
    pattern = _value(info, K.KEY_SLIDING_WINDOW_PATTERN)
    if info.arch in K.SWA_ARCHS:
        return _per_layer_flags(pattern, info.n_layer)
    period = K.SWA_IF_WINDOW_ARCHS.get(info.arch)
    window = _scalar(info, K.KEY_SLIDING_WINDOW)
    if period is None or not window:
        return None
    flags = _per_layer_flags(pattern, info.n_layer)
    if flags is not None:
        return flags
    if pattern is not None:   # a period of its own (an integer), or a value its loader refuses
        if not isinstance(pattern, (int, np.integer)) or isinstance(pattern, bool):
            return None
        period = int(pattern)
    trunk = info.n_layer - (_scalar(info, K.KEY_NEXTN_PREDICT_LAYERS) or 0)
    return [i < trunk and (period == 0 or i % period < period - 1) for i in range(info.n_layer)]


def _sliding_problem(info: GGUFInfo) -> str | None:
    """An architecture that attends through sliding windows has a sliding layer: its cache is
    built as one (``llama_kv_cache_iswa``) after ``GGML_ASSERT(hparams.is_swa_any())``."""
    layers = _sliding_layers(info)
    if layers is None or any(layers):
        return None
    key = K.key(K.KEY_SLIDING_WINDOW_PATTERN, info.arch)
    return (f"{key} marks none of its {info.n_layer} layers as sliding; llama.cpp's {info.arch} attends "
            "through sliding windows and needs at least one")


def _shared_kv_problem(info: GGUFInfo) -> str | None:
    """Shared-KV layers (gemma4): the last ``shared_kv_layers`` layers reuse the KV of the last
    sliding layer (``n - 2``) or the last full layer (``n - 1``) before them, ``n`` the layers
    with KV of their own; llama.cpp asserts ``n >= 2`` (``n_layer_kv_from_start``) and finds the
    reused layer in the cache of its kind (``map_layer_ids.find(il_reuse)`` in llama_kv_cache)."""
    if info.arch not in K.SHARED_KV_ARCHS:
        return None
    shared = _scalar(info, K.KEY_SHARED_KV_LAYERS) or 0
    own = info.n_layer - shared
    key = K.key(K.KEY_SHARED_KV_LAYERS, info.arch)
    if own < 2:
        return (f"{key} {shared} leaves {max(own, 0)} of its {info.n_layer} layers with a KV cache of their own; "
                f"llama.cpp's {info.arch} needs at least 2 (a sliding and a full one to share)")
    sliding = _per_layer_flags(_value(info, K.KEY_SLIDING_WINDOW_PATTERN), info.n_layer)
    if sliding is None:
        return None
    for il in range(own, info.n_layer):
        reused = own - (2 if sliding[il] else 1)
        if sliding[reused] != sliding[il]:
            kind = "sliding" if sliding[il] else "full"
            return (f"{key} {shared}: layer {il} ({kind}) would reuse the KV of layer {reused}, which is not "
                    f"{kind} (attention.sliding_window_pattern); llama.cpp asserts they match")
    return None


def _recurrent_problem(info: GGUFInfo) -> str | None:
    """Hybrid recurrent targets: the recurrent layers come from ``attention.recurrent_layers`` or
    as ``(i + 1) % full_attention_interval != 0`` (a division by the interval); a gated delta
    net's value heads divide its inner size and are a multiple of its key heads (``d_inner /
    num_v_heads``, ``GGML_ASSERT(num_v_heads % num_k_heads == 0)``)."""
    if info.arch in K.INTERVAL_ARCHS and _value(info, K.KEY_RECURRENT_LAYERS) is None \
            and _scalar(info, K.KEY_FULL_ATTENTION_INTERVAL) == 0:
        return (f"{K.key(K.KEY_FULL_ATTENTION_INTERVAL, info.arch)} is 0: one layer in every "
                "full_attention_interval attends, so it must be at least 1 (llama.cpp divides by it)")
    if info.arch not in K.DELTA_NET_ARCHS:
        return None
    v_heads, k_heads = _scalar(info, K.KEY_SSM_TIME_STEP_RANK), _scalar(info, K.KEY_SSM_GROUP_COUNT)
    inner = _scalar(info, K.KEY_SSM_INNER_SIZE)
    if v_heads is None or k_heads is None or inner is None:
        return None   # llama.cpp's loader requires them and says so
    if not v_heads or not k_heads or v_heads % k_heads or inner % v_heads:
        return (f"gated delta net sizes that do not divide: {K.key(K.KEY_SSM_TIME_STEP_RANK, info.arch)} {v_heads} "
                f"(value heads) must be a positive multiple of ssm.group_count {k_heads} (key heads) and "
                f"divide ssm.inner_size {inner}")
    return None


def _first_layer(info: GGUFInfo, template: str) -> int:
    """A per-layer count of the first layer (the value itself when it is one number; 0: absent)."""
    value = _value(info, template)
    items = value.tolist() if isinstance(value, np.ndarray) else value if isinstance(value, list) else [value]
    return int(items[0]) if items and items[0] is not None else 0


def _expert_problem(info: GGUFInfo) -> str | None:
    """MoE loaders that size an expert as ``n_ff / n_expert_used`` (of the first layer) when
    ``expert_feed_forward_length`` is not given divide by the experts used (qwen35moe checks
    nothing before)."""
    if info.arch not in K.EXPERT_FF_ARCHS or _first_layer(info, K.KEY_EXPERT_FEED_FORWARD_LENGTH):
        return None
    if _first_layer(info, K.KEY_EXPERT_USED_COUNT):
        return None
    return (f"{K.key(K.KEY_EXPERT_USED_COUNT, info.arch)} (of its first layer) is 0 or missing and "
            f"expert_feed_forward_length is not given: llama.cpp's {info.arch} divides feed_forward_length by it")
