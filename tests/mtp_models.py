"""Tiny GGUF targets that carry their own MTP (NextN) draft heads, written with ``gguf``.

The architecture is llama.cpp's ``step35`` (Step-3.5): a dense trunk here (its MoE tensors are
optional), ``step35.nextn_predict_layers`` heads appended past the trunk as blocks
``blk.{n_layer}..`` with the NextN tensors (``nextn.eh_proj``, ``nextn.enorm``, ``nextn.hnorm``).
With one head, ``draft-mtp`` drafts every step with it; with several, llama.cpp chains them (head
``k`` drafts step ``k``), which is why this architecture is the fixture: it is the one the pinned
llama.cpp chains.

The weights make drafting worth testing: the trunk mostly repeats its last token (unit
embeddings, a tied-like output, small random layer outputs: ``noise``), and each head's
``eh_proj`` passes the token embedding through (plus ``head_noise``), so a head mostly predicts
"the same token again": many drafts are accepted, some are not. The SmolLM2 tokenizer is copied
from the embedded target, as tests/tiny_models.py does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tiny_models import HEAD_DIM, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, _copy_tokenizer, add_shape, unit_embeddings, write_gguf
from localspec.core.paths import embedded_target

ARCH = "step35"
N_TRUNK = 2
SWA_WINDOW = 8192   # wider than any context the tests use: the window never cuts


def _block(writer, i: int, rnd, out_scale: float) -> None:
    writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
    writer.add_tensor(f"blk.{i}.attn_q.weight", rnd(N_HEAD * HEAD_DIM, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_k.weight", rnd(N_HEAD_KV * HEAD_DIM, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_v.weight", rnd(N_HEAD_KV * HEAD_DIM, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_output.weight", rnd(N_EMBD, N_HEAD * HEAD_DIM, scale=out_scale))
    writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
    writer.add_tensor(f"blk.{i}.ffn_gate.weight", rnd(N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_up.weight", rnd(N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_down.weight", rnd(N_EMBD, N_FF, scale=out_scale))


def build_mtp_target(path: Path, *, heads: int = 1, seed: int = 0, noise: float = 0.012,
                     head_noise: float = 0.005, with_heads: bool = True) -> Path:
    """A step35 target with ``heads`` MTP heads (``with_heads=False``: the same trunk, no heads)."""
    import gguf

    rng = np.random.default_rng(seed + 7)

    def rnd(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    n_next = heads if with_heads else 0
    n_all = N_TRUNK + n_next
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name(f"tiny-mtp-{heads}")
    n_vocab = _copy_tokenizer(writer, embedded_target())
    add_shape(writer, n_all, n_vocab)
    writer.add_uint32(f"{ARCH}.expert_feed_forward_length", N_FF)
    writer.add_uint32(f"{ARCH}.attention.sliding_window", SWA_WINDOW)
    # the trunk's first layer slides (llama.cpp's step35 asserts some layer does), the rest attend fully
    writer.add_array(f"{ARCH}.attention.sliding_window_pattern", [i == 0 for i in range(n_all)])
    if n_next:
        writer.add_uint32(f"{ARCH}.nextn_predict_layers", n_next)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    embd = unit_embeddings(n_vocab, seed)
    writer.add_tensor("token_embd.weight", embd.astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    writer.add_tensor("output.weight", embd.astype(np.float16))   # logits: similarity to each token
    for i in range(N_TRUNK):
        _block(writer, i, rnd, noise)
    for i in range(N_TRUNK, n_all):
        _block(writer, i, rnd, head_noise)
        add_nextn(writer, i, N_EMBD, rnd, head_noise)
    write_gguf(writer)
    return path


def add_nextn(writer, i: int, n_embd: int, rnd, head_noise: float) -> None:
    """Block ``i``'s NextN projection (over [token embedding, target state]) and its norms: a head
    that mostly passes the token's embedding on (drafts "the same token again"), plus noise."""
    eh = np.concatenate([np.eye(n_embd, dtype=np.float32), np.zeros((n_embd, n_embd), np.float32)], axis=1)
    writer.add_tensor(f"blk.{i}.nextn.eh_proj.weight", eh + rnd(n_embd, 2 * n_embd, scale=head_noise / 4))
    writer.add_tensor(f"blk.{i}.nextn.enorm.weight", np.ones(n_embd, np.float32))
    writer.add_tensor(f"blk.{i}.nextn.hnorm.weight", np.ones(n_embd, np.float32))
