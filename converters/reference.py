"""A torch reference of the EAGLE-3 / EAGLE-3.1 drafter, independent of llama.cpp.

Used to verify conversions (llama.cpp's logits and fed-back state against this on the same target
features) and as the model that ``localspec train`` optimises. It follows the checkpoint
semantics, not llama.cpp's: HF-style rotary embedding (``rotate_half``) on unpermuted q/k weights,
separate ``fc_norm`` weights, ``d2t`` as offsets (draft id + d2t[draft id] = target id). Its
parameter names are the SpecForge / SafeAILab layout (``fc``, ``midlayer.*``, ``norm``,
``lm_head``), so ``state_dict()`` is a checkpoint that ``localspec convert`` reads.

One drafter step at position P takes the pair (token at P+1, g at P), where g is ``encode()`` of
the target features at P for committed positions, or the fed-back state of the previous step for
drafted ones; its output predicts the token at P+2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from .canonical import DrafterConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()).to(x.dtype)


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalisation without a weight (the part of fc_norm the runtime applies)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class Attention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_head, self.n_kv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(2 * h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        if cfg.rope_freq_factors is not None:  # llama3 rope scaling, as ggml's freq_factors
            inv = inv / torch.tensor(cfg.rope_freq_factors, dtype=torch.float64)
        self.register_buffer("inv_freq", inv.float(), persistent=False)

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        # x: [..., T, heads, d]; HF rotate_half convention
        ang = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def forward(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None):
        """x: [T, 2h]; pos: [T]; mask: [T, T_past + T] boolean (True = may attend)."""
        t = x.shape[0]
        q = self._rope(self.q_proj(x).view(t, self.n_head, self.head_dim), pos)
        k = self._rope(self.k_proj(x).view(t, self.n_kv, self.head_dim), pos)
        v = self.v_proj(x).view(t, self.n_kv, self.head_dim)
        if past is not None:
            k = torch.cat([past[0], k], 0)
            v = torch.cat([past[1], v], 0)
        rep = self.n_head // self.n_kv
        kk = k.repeat_interleave(rep, dim=1)
        vv = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("thd,shd->hts", q, kk) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask[None, :, :], float("-inf"))
        out = torch.einsum("hts,shd->thd", scores.softmax(-1), vv).reshape(t, -1)
        return self.o_proj(out), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)
        self.norm_before_residual = cfg.norm_before_residual

    def forward(self, emb, g, pos, mask, past=None):
        g_n = self.hidden_norm(g)
        x = torch.cat([self.input_layernorm(emb), g_n], -1)
        attn, kv = self.self_attn(x, pos, mask, past)
        h = attn + (g_n if self.norm_before_residual else g)
        return h + self.mlp(self.post_attention_layernorm(h)), kv


@dataclass
class StepOutput:
    logits: torch.Tensor      # [T, target vocab]: -inf outside the draft vocabulary
    prenorm: torch.Tensor     # [T, h]
    feedback: torch.Tensor    # [T, h]: the state fed to the next step (post-norm for EAGLE-3.1)
    kv: tuple[torch.Tensor, torch.Tensor]


class EagleReference(nn.Module):
    def __init__(self, cfg: DrafterConfig, *, draft_vocab: int | None = None, own_embeddings: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        ht, h = cfg.target_hidden_size, cfg.hidden_size
        self.draft_vocab = draft_vocab or cfg.vocab_size
        self.fc = nn.Linear(3 * ht, h, bias=False)
        self.fc_norm = nn.ModuleList([RMSNorm(ht, cfg.fc_norm_eps or cfg.rms_eps) for _ in range(3)]) if cfg.fc_norm else None
        self.enc_norm = RMSNorm(3 * ht, cfg.rms_eps) if cfg.norm_before_fc else None
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_eps)
        self.lm_head = nn.Linear(h, self.draft_vocab, bias=False)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if own_embeddings else None
        # d2t as stored by checkpoints: offsets, target id = draft id + d2t[draft id]
        self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.long))

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        """[T, 3*target_hidden] -> g [T, hidden]."""
        if self.fc_norm is not None:
            blocks = features.chunk(3, dim=-1)
            features = torch.cat([norm(b) for norm, b in zip(self.fc_norm, blocks)], -1)
        if self.enc_norm is not None:
            features = self.enc_norm(features)
        return self.fc(features)

    def target_ids(self) -> torch.Tensor:
        return torch.arange(self.draft_vocab, device=self.d2t.device) + self.d2t

    def step(self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
             past=None, *, full_vocab: bool = True) -> StepOutput:
        """emb: token embeddings [T, h] of the tokens at P+1; g: [T, h]; pos: positions P."""
        prenorm, kv = self.midlayer(emb, g, pos, mask, past)
        normed = self.norm(prenorm)
        logits = self.lm_head(normed)
        if full_vocab and self.draft_vocab != self.cfg.vocab_size:
            full = logits.new_full((logits.shape[0], self.cfg.vocab_size), float("-inf"))
            full[:, self.target_ids()] = logits
            logits = full
        feedback = normed if self.cfg.norm_output else prenorm
        return StepOutput(logits, prenorm, feedback, kv)

    @staticmethod
    def causal_mask(t: int, past: int = 0) -> torch.Tensor:
        return torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past)
