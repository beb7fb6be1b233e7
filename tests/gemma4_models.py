"""A tiny Gemma 4 target and its assistant (``gemma4-assistant``) drafter, written with ``gguf``.

The target is llama.cpp's ``gemma4`` at toy sizes, with the features its graph and cache are built
around: interleaved sliding-window and full-attention layers (``sliding_window_pattern``, the last
two layers one of each, as the assistant reads them), wider heads on full layers
(``key_length`` 32, ``key_length_swa`` 16, ``rope_freqs`` on the full layers), and layers that
reuse an earlier layer's KV (``shared_kv_layers``), no per-layer embeddings
(``embedding_length_per_layer_input`` 0) and tied embeddings (no ``output.weight``).

The assistant (llama.cpp's ``gemma4-assistant``, ``src/models/gemma4-assistant.cpp``) is a separate
file whose blocks are all NextN blocks (``nextn_predict_layers`` = ``block_count``), narrower than
the target (``embedding_length`` 32, ``embedding_length_out`` the target's 64): it embeds the token
with the target's own embeddings, concatenates the target's last state (``nextn.pre_projection``
over 2 x 64), attends to the target's KV cache (no K/V of its own: ``attn_q`` and ``attn_output``
only, a context made with ``ctx_other``), and returns logits over its ``token_embd`` and the state
to feed back (``nextn.post_projection`` to 64).

The weights make drafting worth testing, as tests/mtp_models.py does: the target mostly repeats its
last token (unit embeddings, tied output, post-norms of small weight: ``noise``), and the
assistant's ``pre_projection`` passes the token's embedding through into its 32 dimensions (its
``token_embd`` is the target's embedding restricted to them), so it mostly predicts "the same token
again" (``head_noise`` adds random parts). The SmolLM2 tokenizer is copied from the embedded target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tiny_models import N_EMBD, N_FF, N_HEAD, N_HEAD_KV, _copy_tokenizer, unit_embeddings, write_gguf
from localspec.core.paths import embedded_target

ARCH = "gemma4"
ASSISTANT_ARCH = "gemma4-assistant"
N_LAYER = 4
SWA_PATTERN = [True, False, True, False]   # the last two: one sliding (read by the assistant's
                                           # sliding layers), one full (read by its full layers)
HEAD_SWA = 16
HEAD_FULL = 32
SWA_WINDOW = 8192          # wider than any context the tests use: the window never cuts
N_EMBD_ASSISTANT = 32
N_FF_ASSISTANT = 64
ASSISTANT_PATTERN = [True, False]   # its two blocks: one reads the target's sliding cache, one the full


def _common_keys(writer, arch: str, n_vocab: int, n_layer: int, pattern: list[bool], n_embd: int, n_ff: int,
                 window: int) -> None:
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_uint32(f"{arch}.attention.key_length", HEAD_FULL)
    writer.add_uint32(f"{arch}.attention.value_length", HEAD_FULL)
    writer.add_uint32(f"{arch}.attention.key_length_swa", HEAD_SWA)
    writer.add_uint32(f"{arch}.attention.value_length_swa", HEAD_SWA)
    writer.add_uint32(f"{arch}.rope.dimension_count", HEAD_FULL)
    writer.add_uint32(f"{arch}.rope.dimension_count_swa", HEAD_SWA)
    writer.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
    writer.add_uint32(f"{arch}.attention.sliding_window", window)
    writer.add_array(f"{arch}.attention.sliding_window_pattern", pattern)
    writer.add_vocab_size(n_vocab)


def _rnd(rng):
    def rnd(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)
    return rnd


def build_gemma4_target(path: Path, *, seed: int = 0, noise: float = 0.6, shared_kv_layers: int = 2,
                        window: int = SWA_WINDOW) -> Path:
    """A gemma4 target of ``N_LAYER`` layers, the last ``shared_kv_layers`` reusing earlier KV, its
    sliding layers attending to the last ``window`` positions."""
    import gguf

    rnd = _rnd(np.random.default_rng(seed + 11))
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_name("tiny-gemma4")
    n_vocab = _copy_tokenizer(writer, embedded_target())
    _common_keys(writer, ARCH, n_vocab, N_LAYER, SWA_PATTERN, N_EMBD, N_FF, window)
    writer.add_uint32(f"{ARCH}.attention.shared_kv_layers", shared_kv_layers)
    writer.add_uint32(f"{ARCH}.embedding_length_per_layer_input", 0)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    embd = unit_embeddings(n_vocab, seed)
    writer.add_tensor("token_embd.weight", embd.astype(np.float16))   # tied: the output head too
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    writer.add_tensor("rope_freqs.weight", np.ones(HEAD_FULL // 2, np.float32))
    for i in range(N_LAYER):
        hd = HEAD_SWA if SWA_PATTERN[i] else HEAD_FULL
        has_kv = i < N_LAYER - shared_kv_layers
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", rnd(N_HEAD * hd, N_EMBD))
        writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(hd, np.float32))
        if has_kv:
            writer.add_tensor(f"blk.{i}.attn_k.weight", rnd(N_HEAD_KV * hd, N_EMBD))
            writer.add_tensor(f"blk.{i}.attn_v.weight", rnd(N_HEAD_KV * hd, N_EMBD))
            writer.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(hd, np.float32))
        writer.add_tensor(f"blk.{i}.attn_output.weight", rnd(N_EMBD, N_HEAD * hd))
        writer.add_tensor(f"blk.{i}.post_attention_norm.weight", np.full(N_EMBD, noise, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", rnd(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rnd(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", rnd(N_EMBD, N_FF))
        writer.add_tensor(f"blk.{i}.post_ffw_norm.weight", np.full(N_EMBD, noise, np.float32))
    write_gguf(writer)
    return path


def build_gemma4_assistant(path: Path, *, seed: int = 0, head_noise: float = 0.02, n_embd_out: int = N_EMBD,
                           target_seed: int | None = None, window: int = SWA_WINDOW, state: float = 0.0) -> Path:
    """The assistant of :func:`build_gemma4_target` (built with ``target_seed``, default ``seed``):
    two NextN blocks 32 wide, ``embedding_length_out`` ``n_embd_out`` (another value makes a
    mismatched pair), its sliding layers' ``window`` the target's; ``state``: the scale of a random
    projection of the target's state into its input (0: the state barely matters)."""
    import gguf

    rnd = _rnd(np.random.default_rng(seed + 13))
    n_layer = len(ASSISTANT_PATTERN)
    writer = gguf.GGUFWriter(str(path), ASSISTANT_ARCH)
    writer.add_name("tiny-gemma4-assistant")
    n_vocab = _copy_tokenizer(writer, embedded_target())
    _common_keys(writer, ASSISTANT_ARCH, n_vocab, n_layer, ASSISTANT_PATTERN, N_EMBD_ASSISTANT, N_FF_ASSISTANT, window)
    writer.add_uint32(f"{ASSISTANT_ARCH}.embedding_length_out", n_embd_out)
    writer.add_uint32(f"{ASSISTANT_ARCH}.nextn_predict_layers", n_layer)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    target_embd = unit_embeddings(n_vocab, seed if target_seed is None else target_seed)
    if n_embd_out != N_EMBD:
        target_embd = np.resize(target_embd, (n_vocab, n_embd_out))
    # logits over the first 32 dimensions of the target's embeddings: the token passed through
    # pre_projection scores itself highest; output_norm's weight sharpens the distribution
    writer.add_tensor("token_embd.weight", target_embd[:, :N_EMBD_ASSISTANT].astype(np.float16))
    writer.add_tensor("output_norm.weight", np.full(N_EMBD_ASSISTANT, 3.0, np.float32))
    pre = np.zeros((N_EMBD_ASSISTANT, 2 * n_embd_out), np.float32)
    pre[:, :N_EMBD_ASSISTANT] = np.eye(N_EMBD_ASSISTANT, dtype=np.float32)
    if state:
        pre[:, n_embd_out:] = rnd(N_EMBD_ASSISTANT, n_embd_out, scale=state)
    writer.add_tensor("nextn.pre_projection.weight", pre + rnd(N_EMBD_ASSISTANT, 2 * n_embd_out, scale=head_noise / 4))
    writer.add_tensor("nextn.post_projection.weight", rnd(n_embd_out, N_EMBD_ASSISTANT))
    writer.add_tensor("rope_freqs.weight", np.ones(HEAD_FULL // 2, np.float32))
    for i in range(n_layer):
        hd = HEAD_SWA if ASSISTANT_PATTERN[i] else HEAD_FULL
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD_ASSISTANT, np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", rnd(N_HEAD * hd, N_EMBD_ASSISTANT))
        writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(hd, np.float32))
        writer.add_tensor(f"blk.{i}.attn_output.weight", rnd(N_EMBD_ASSISTANT, N_HEAD * hd))
        writer.add_tensor(f"blk.{i}.post_attention_norm.weight", np.full(N_EMBD_ASSISTANT, head_noise, np.float32))
        writer.add_tensor(f"blk.{i}.layer_output_scale.weight", np.ones(1, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD_ASSISTANT, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", rnd(N_FF_ASSISTANT, N_EMBD_ASSISTANT))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", rnd(N_FF_ASSISTANT, N_EMBD_ASSISTANT))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", rnd(N_EMBD_ASSISTANT, N_FF_ASSISTANT))
        writer.add_tensor(f"blk.{i}.post_ffw_norm.weight", np.full(N_EMBD_ASSISTANT, head_noise, np.float32))
    write_gguf(writer)
    return path
