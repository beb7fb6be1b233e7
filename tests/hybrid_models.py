"""Tiny hybrid recurrent GGUF targets (llama.cpp's ``qwen35``, Qwen3.5/3.6), written with ``gguf``.

The trunk is Qwen3.5's: every ``full_attention_interval``-th layer attends (gated attention, Q/K
norms, M-RoPE), the others are gated delta nets (linear attention: a recurrent state per sequence,
``attn_qkv``/``attn_gate``, ``ssm_conv1d``, ``ssm_a``/``ssm_dt``/``ssm_alpha``/``ssm_beta``,
``ssm_norm``, ``ssm_out``), each followed by a dense SwiGLU FFN, as
``src/models/qwen35.cpp`` reads them. With ``with_head`` the file carries one NextN (MTP) block
past the trunk (``qwen35.nextn_predict_layers = 1``; a full-attention block plus ``nextn.eh_proj``,
``nextn.enorm``, ``nextn.hnorm``), the one head Qwen3.5's draft-mtp drafts every step with.

The weights follow tests/mtp_models.py: unit token embeddings, the output matrix the embeddings
(logits: similarity to each token), layer outputs scaled by ``noise`` so the model mostly repeats
its last token but not always; the head's ``eh_proj`` passes the token embedding through (plus
``head_noise``). The SmolLM2 tokenizer is copied from the embedded target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mtp_models import add_nextn
from tiny_models import HEAD_DIM, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, _copy_tokenizer, add_shape, unit_embeddings, write_gguf
from localspec.core.paths import embedded_target

ARCH = "qwen35"
N_TRUNK = 4
FULL_ATTENTION_INTERVAL = 4      # layers 0-2 recurrent, layer 3 attends (as Qwen3.5's 3:1)
SSM_STATE = 16                   # head dim of the delta net's keys and values
SSM_K_HEADS = 2                  # ssm.group_count
SSM_V_HEADS = 4                  # ssm.time_step_rank
SSM_INNER = SSM_STATE * SSM_V_HEADS
SSM_CONV = 4


def _ffn(writer, i: int, rnd, out_scale: float) -> None:
    writer.add_tensor(f"blk.{i}.ffn_gate.weight", rnd(N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_up.weight", rnd(N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_down.weight", rnd(N_EMBD, N_FF, scale=out_scale))


N_EXPERT = 2   # qwen35moe, qwen3next: a MoE FFN (two experts, one used) beside a shared expert


def _moe(writer, i: int, rnd, out_scale: float) -> None:
    writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", rnd(N_EXPERT, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_gate_exps.weight", rnd(N_EXPERT, N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_up_exps.weight", rnd(N_EXPERT, N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_down_exps.weight", rnd(N_EXPERT, N_EMBD, N_FF, scale=out_scale))
    writer.add_tensor(f"blk.{i}.ffn_gate_inp_shexp.weight", rnd(N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_gate_shexp.weight", rnd(N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_up_shexp.weight", rnd(N_FF, N_EMBD))
    writer.add_tensor(f"blk.{i}.ffn_down_shexp.weight", rnd(N_EMBD, N_FF, scale=out_scale))


def _attention(writer, i: int, rnd, out_scale: float) -> None:
    writer.add_tensor(f"blk.{i}.attn_q.weight", rnd(2 * N_HEAD * HEAD_DIM, N_EMBD))   # query and its gate
    writer.add_tensor(f"blk.{i}.attn_k.weight", rnd(N_HEAD_KV * HEAD_DIM, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_v.weight", rnd(N_HEAD_KV * HEAD_DIM, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_output.weight", rnd(N_EMBD, N_HEAD * HEAD_DIM, scale=out_scale))
    writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(HEAD_DIM, np.float32))
    writer.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(HEAD_DIM, np.float32))


def _delta_net(writer, i: int, rnd, out_scale: float) -> None:
    conv_dim = 2 * SSM_STATE * SSM_K_HEADS + SSM_INNER
    writer.add_tensor(f"blk.{i}.attn_qkv.weight", rnd(conv_dim, N_EMBD))
    writer.add_tensor(f"blk.{i}.attn_gate.weight", rnd(SSM_INNER, N_EMBD))
    writer.add_tensor(f"blk.{i}.ssm_conv1d.weight", rnd(conv_dim, SSM_CONV, scale=0.5))
    writer.add_tensor(f"blk.{i}.ssm_dt.bias", rnd(SSM_V_HEADS, scale=0.5))
    writer.add_tensor(f"blk.{i}.ssm_a", -np.exp(rnd(SSM_V_HEADS, scale=0.5)))   # -exp(A_log): decay
    if writer.arch == "qwen3next":   # beta and alpha in one projection
        writer.add_tensor(f"blk.{i}.ssm_ba.weight", rnd(2 * SSM_V_HEADS, N_EMBD))
    else:
        writer.add_tensor(f"blk.{i}.ssm_alpha.weight", rnd(SSM_V_HEADS, N_EMBD))
        writer.add_tensor(f"blk.{i}.ssm_beta.weight", rnd(SSM_V_HEADS, N_EMBD))
    writer.add_tensor(f"blk.{i}.ssm_norm.weight", np.ones(SSM_STATE, np.float32))
    writer.add_tensor(f"blk.{i}.ssm_out.weight", rnd(N_EMBD, SSM_INNER, scale=out_scale))


def build_hybrid_target(path: Path, *, seed: int = 0, noise: float = 0.006, head_noise: float = 0.005,
                        with_head: bool = False, arch: str = ARCH, heads: int = 1) -> Path:
    """A qwen35 target (``with_head``: and its one MTP block, or ``heads`` of them, more than
    llama.cpp's qwen35 drafts with); ``arch="qwen35moe"``: its MoE FFNs
    (Qwen3.5/3.6-A3B ...); ``arch="qwen3next"``: Qwen3-Next's
    trunk (the same layers, beta and alpha fused, MoE FFNs), whose state the pinned llama.cpp
    cannot roll back."""
    import gguf

    rng = np.random.default_rng(seed + 11)

    def rnd(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    n_all = N_TRUNK + (heads if with_head else 0)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}{'-mtp' if with_head else ''}")
    n_vocab = _copy_tokenizer(writer, embedded_target())
    add_shape(writer, n_all, n_vocab)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_array(f"{arch}.rope.dimension_sections", [3, 3, 2, 0])   # M-RoPE over HEAD_DIM/2 pairs
    writer.add_uint32(f"{arch}.full_attention_interval", FULL_ATTENTION_INTERVAL)
    writer.add_uint32(f"{arch}.ssm.conv_kernel", SSM_CONV)
    writer.add_uint32(f"{arch}.ssm.inner_size", SSM_INNER)
    writer.add_uint32(f"{arch}.ssm.state_size", SSM_STATE)
    writer.add_uint32(f"{arch}.ssm.time_step_rank", SSM_V_HEADS)
    writer.add_uint32(f"{arch}.ssm.group_count", SSM_K_HEADS)
    if with_head:
        writer.add_uint32(f"{arch}.nextn_predict_layers", heads)
    moe = arch in ("qwen35moe", "qwen3next")
    if moe:
        writer.add_uint32(f"{arch}.expert_count", N_EXPERT)
        writer.add_uint32(f"{arch}.expert_used_count", 1)
        writer.add_uint32(f"{arch}.expert_feed_forward_length", N_FF)
        writer.add_uint32(f"{arch}.expert_shared_feed_forward_length", N_FF)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    embd = unit_embeddings(n_vocab, seed)
    writer.add_tensor("token_embd.weight", embd.astype(np.float16))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    writer.add_tensor("output.weight", embd.astype(np.float16))
    for i in range(N_TRUNK):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(f"blk.{i}.post_attention_norm.weight", np.ones(N_EMBD, np.float32))
        if (i + 1) % FULL_ATTENTION_INTERVAL:
            _delta_net(writer, i, rnd, noise)
        else:
            _attention(writer, i, rnd, noise)
        (_moe if moe else _ffn)(writer, i, rnd, noise)
    for i in range(N_TRUNK, n_all):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        writer.add_tensor(f"blk.{i}.post_attention_norm.weight", np.ones(N_EMBD, np.float32))
        _attention(writer, i, rnd, head_noise)
        (_moe if moe else _ffn)(writer, i, rnd, head_noise)
        add_nextn(writer, i, N_EMBD, rnd, head_noise)
    write_gguf(writer)
    return path
