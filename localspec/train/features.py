"""What the drafter trains on, recomputed from token ids by prefill through the target GGUF.

The same quantised target, the same three layer inputs (``set_embeddings_layer_inp``, exactly what
the runtime feeds the drafter) and the same token embeddings as at run time. Per sequence:
- ``feats`` [T, 3*H] float16: each of the three layer inputs RMS-scaled without weight (what the
  EAGLE-3.1 runtime hands to fc; the learned fc_norm weight is applied in torch on top, and
  RMS-scaling an already scaled block changes nothing);
- ``top_ids`` / ``top_logits`` [T, k]: the target's k largest logits at every position (the
  distribution the drafter distils).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Callable

import llama_cpp
import numpy as np

from ..llama import llama_ext
from ..core.errors import LocalspecError
from ..llama.process import llama_failure
from ..llama.llama_model import Context, Model

RMS_EPS = 1e-6


def default_layers(n_layer: int) -> tuple[int, int, int]:
    """Low, middle and high target layers (llama.cpp convention: the INPUT of these layers)."""
    if n_layer < 3:
        raise LocalspecError(f"the target has {n_layer} layers; EAGLE-3 needs at least 3")
    if n_layer < 6:
        return (0, n_layer // 2, n_layer - 1)
    return (2, n_layer // 2, n_layer - 3)


@dataclass
class SeqFeatures:
    tokens: np.ndarray       # [T] int32
    n_prompt: int
    feats: np.ndarray        # [T, 3H] float16
    top_ids: np.ndarray      # [T, k] int32
    top_logits: np.ndarray   # [T, k] float16


def _rms_scale(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True) + RMS_EPS)


class FeatureExtractor:
    def __init__(self, model: Model, layers: tuple[int, int, int], *, top_k: int = 16, n_ctx: int = 2048,
                 n_batch: int = 512, n_threads: int | None = None) -> None:
        llama_ext.check_available()
        self.model = model
        self.layers = tuple(layers)
        self.top_k = top_k
        self.ctx = Context(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        for lid in self.layers:
            llama_ext.set_embeddings_layer_inp(self.ctx.ptr, lid, True)

    def __call__(self, tokens: list[int], n_prompt: int) -> SeqFeatures:
        n = len(tokens)
        if n > self.ctx.n_ctx:
            raise LocalspecError(f"internal: sequence of {n} tokens exceeds the feature context {self.ctx.n_ctx}")
        h = self.model.n_embd
        feats = np.empty((n, 3 * h), dtype=np.float16)
        top_ids = np.empty((n, self.top_k), dtype=np.int32)
        top_logits = np.empty((n, self.top_k), dtype=np.float16)
        self.ctx.clear()
        for start in range(0, n, self.ctx.n_batch):
            chunk = tokens[start:start + self.ctx.n_batch]
            m = len(chunk)
            self.ctx.decode(chunk, start, all_logits=True)
            for k, lid in enumerate(self.layers):
                ptr = llama_ext.get_embeddings_layer_inp(self.ctx.ptr, lid)
                if not ptr:
                    raise LocalspecError(f"llama.cpp extracted no features for target layer {lid}")
                rows = np.ctypeslib.as_array(ptr, shape=(m, h))
                feats[start:start + m, k * h:(k + 1) * h] = _rms_scale(rows)
            ptr = llama_cpp.llama_get_logits(self.ctx.ptr)
            if not ptr:
                raise llama_failure("llama.cpp returned no logits")
            logits = np.ctypeslib.as_array(ptr, shape=(m, self.model.n_vocab))
            idx = np.argpartition(logits, -self.top_k, axis=1)[:, -self.top_k:]
            vals = np.take_along_axis(logits, idx, axis=1)
            order = np.argsort(-vals, axis=1)
            top_ids[start:start + m] = np.take_along_axis(idx, order, axis=1)
            top_logits[start:start + m] = np.take_along_axis(vals, order, axis=1)
        return SeqFeatures(np.asarray(tokens, dtype=np.int32), n_prompt, feats, top_ids, top_logits)

    def close(self) -> None:
        self.ctx.close()


def extract_all(model: Model, layers, seqs: list[tuple[list[int], int]], *, top_k: int = 16,
                max_len: int = 2048, n_threads: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> list[SeqFeatures]:
    """Features of every (tokens, n_prompt) pair, truncated to ``max_len`` tokens."""
    ex = FeatureExtractor(model, layers, top_k=top_k, n_ctx=max_len, n_threads=n_threads)
    out = []
    try:
        for i, (toks, n_prompt) in enumerate(seqs):
            out.append(ex(list(toks[:max_len]), n_prompt))
            if progress:
                progress(i + 1, len(seqs))
    finally:
        ex.close()
    return out


def token_embeddings(target_path) -> np.ndarray:
    """The target's token embeddings [n_vocab, H] float32, dequantised as llama.cpp stores them."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(target_path))
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            data = dequantize(t.data, t.tensor_type)
            return np.asarray(data, dtype=np.float32).reshape(-1, int(t.shape[0]))
    raise LocalspecError(f"{target_path}: no token_embd.weight tensor")


def has_tied_output(target_path) -> bool:
    import gguf

    reader = gguf.GGUFReader(str(target_path))
    return not any(t.name == "output.weight" for t in reader.tensors)
