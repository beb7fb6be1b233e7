"""Training the torch reference drafter (EAGLE-3.1) with a training-time test (TTT) unroll.

Notation: row Q of a sequence. Step 0 at row Q takes the pair (token at Q+1, g = encode(target
features at Q)) and predicts the token at Q+2, attending to the step-0 pairs at rows <= Q. Step k
(k >= 1) reproduces what the runtime does k draft steps after the last committed row P = Q - k:
its input is (token at Q+1, the fed-back post-norm state of step k-1 at row Q-1); it attends to the
committed step-0 pairs at rows <= Q-k and to its own chain's pairs of steps 1..k (rows Q-k+1..Q).
The loss at each step is the cross-entropy to the target's top-k distribution at row Q+1 (the
target's own prediction of the token at Q+2, renormalised over its k largest logits and the draft
vocabulary) plus a smaller hard term on the target's greedy token; only response tokens count.

Because a step's tokens are the target's own greedy tokens, ``correct_k[Q]`` chains exactly like
runtime drafting: the accepted length of a cycle starting at P is the number of consecutive steps
k with ``correct_k[P+k]``. The held-out estimate of tokens per cycle at depth D walks each
response as the runtime does (a cycle starts right after the previous one's accepted drafts and
correction), so it counts the hard rows after a rejection as often as the runtime meets them;
``tau_all``, the mean over every response row as a cycle start, reads higher.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.nn import functional as F

from ..converters.canonical import DrafterConfig
from ..converters.reference import EagleReference
from ..core.atomic import atomic_path
from ..core.errors import LocalspecError
from .features import SeqFeatures


@dataclass
class TrainConfig:
    ttt_steps: int = 4
    lr: float = 6e-4
    min_lr_ratio: float = 0.05
    warmup_steps: int = 30
    weight_decay: float = 0.01
    batch_tokens: int = 4096
    max_len: int = 512
    hard_weight: float = 0.5
    step_decay: float = 0.8
    eval_every_s: float = 90.0
    checkpoint_every_s: float = 120.0
    time_budget_s: float = 600.0
    max_steps: int = 0          # 0: time budget only
    seed: int = 0
    threads: int = 0


@dataclass
class Batch:
    feats: torch.Tensor      # [B, T, 3H] float32
    emb_ids: torch.Tensor    # [B, T] token at Q+1 (0 where none)
    tgt_ids: torch.Tensor    # [B, T, k] draft ids of the target's top-k at Q+1 (-1 outside draft vocab)
    tgt_logp: torch.Tensor   # [B, T, k] target log-probs over its top-k
    hard: torch.Tensor       # [B, T] draft id of the token at Q+2 (-1: outside vocab or none)
    valid: torch.Tensor      # [B, T] bool: row Q predicts a response token at Q+2
    tokens: int

    def to(self, device) -> "Batch":
        if str(device) == "cpu":
            return self
        return Batch(*(getattr(self, f).to(device) for f in
                       ("feats", "emb_ids", "tgt_ids", "tgt_logp", "hard", "valid")), self.tokens)


def make_batch(seqs: list[SeqFeatures], t2d_index: np.ndarray, max_len: int, rng: random.Random) -> Batch:
    windows = []
    for s in seqs:
        n = len(s.tokens)
        start = 0
        if n > max_len:
            # a window that keeps some response: start anywhere from 0 to n - max_len
            start = rng.randint(0, n - max_len)
        windows.append((s, start, min(n, start + max_len)))
    T = max(e - b for _, b, e in windows)
    B = len(windows)
    H3 = seqs[0].feats.shape[1]
    k = seqs[0].top_ids.shape[1]
    feats = np.zeros((B, T, H3), np.float32)
    emb_ids = np.zeros((B, T), np.int64)
    tgt_ids = np.full((B, T, k), -1, np.int64)
    tgt_logits = np.full((B, T, k), -1e4, np.float32)
    hard = np.full((B, T), -1, np.int64)
    valid = np.zeros((B, T), bool)
    for i, (s, b, e) in enumerate(windows):
        m = e - b
        feats[i, :m] = s.feats[b:e]
        toks = s.tokens[b:e].astype(np.int64)
        emb_ids[i, :m - 1] = toks[1:]
        if m > 2:
            tgt_ids[i, :m - 1] = t2d_index[s.top_ids[b + 1:e]]
            tgt_logits[i, :m - 1] = s.top_logits[b + 1:e]
            hard[i, :m - 2] = t2d_index[toks[2:]]
            pos = np.arange(b, e - 2)
            valid[i, :m - 2] = pos + 2 >= s.n_prompt
    tl = torch.from_numpy(tgt_logits)
    logp = tl - torch.logsumexp(tl, -1, keepdim=True)
    return Batch(torch.from_numpy(feats), torch.from_numpy(emb_ids), torch.from_numpy(tgt_ids), logp,
                 torch.from_numpy(hard), torch.from_numpy(valid), int(valid.sum()))


def batches(seqs: list[SeqFeatures], batch_tokens: int, max_len: int, rng: random.Random):
    """One epoch of length-bucketed batches of about ``batch_tokens`` tokens, in random order."""
    order = sorted(range(len(seqs)), key=lambda i: (min(len(seqs[i].tokens), max_len), rng.random()))
    groups, cur, cur_max = [], [], 0
    for i in order:
        L = min(len(seqs[i].tokens), max_len)
        if cur and max(cur_max, L) * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, L)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    return groups


class TTTModel:
    """The TTT forward pass over a padded batch, on EagleReference's modules (same parameters)."""

    def __init__(self, ref: EagleReference, emb: torch.Tensor, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.ref = ref.to(self.device)
        self.emb = emb.to(self.device)  # [n_vocab, H] float32, frozen (the target's)

    def forward(self, batch: Batch, steps: int):
        ref = self.ref
        ml = ref.midlayer
        att = ml.self_attn
        B, T, _ = batch.feats.shape
        nh, nkv, d = att.n_head, att.n_kv, att.head_dim
        rep = nh // nkv
        g = ref.encode(batch.feats)                                   # [B, T, H]
        e_n = ml.input_layernorm(F.embedding(batch.emb_ids, self.emb))  # same token input every step
        dev = batch.feats.device
        pos = torch.arange(T, device=dev)
        ang = pos.float()[:, None] * att.inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[None, None]
        sin = torch.cat([ang.sin(), ang.sin()], -1)[None, None]

        def rope(x):  # x: [B, heads, T, d]
            half = d // 2
            return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

        causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
        keys: list[tuple[torch.Tensor, torch.Tensor]] = []
        outs = []
        hidden = g
        for k in range(steps):
            g_n = ml.hidden_norm(hidden)
            x = torch.cat([e_n, g_n], -1)
            q = rope(att.q_proj(x).view(B, T, nh, d).transpose(1, 2))
            kk = rope(att.k_proj(x).view(B, T, nkv, d).transpose(1, 2)).repeat_interleave(rep, 1)
            vv = att.v_proj(x).view(B, T, nkv, d).transpose(1, 2).repeat_interleave(rep, 1)
            keys.append((kk, vv))
            scale = 1.0 / math.sqrt(d)
            k0, v0 = keys[0]
            if k == 0:
                s0 = (q @ k0.transpose(-1, -2)) * scale
                s0 = s0.masked_fill(~causal, float("-inf"))
                out = s0.softmax(-1) @ v0
            else:
                s0 = (q @ k0.transpose(-1, -2)) * scale
                s0 = s0.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=dev).tril(-k), float("-inf"))
                diag, vals = [], []
                for i in range(1, k + 1):
                    ki, vi = keys[i]
                    shift = k - i                              # key of step i at row Q - shift
                    ks = F.pad(ki, (0, 0, shift, 0))[:, :, :T] if shift else ki
                    vs = F.pad(vi, (0, 0, shift, 0))[:, :, :T] if shift else vi
                    diag.append((q * ks).sum(-1, keepdim=True) * scale)
                    vals.append(vs)
                p = torch.cat([s0] + diag, -1).softmax(-1)
                out = p[..., :T] @ v0
                for i, vs in enumerate(vals):
                    out = out + p[..., T + i:T + i + 1] * vs
            attn = att.o_proj(out.transpose(1, 2).reshape(B, T, nh * d))
            h = attn + (g_n if ml.norm_before_residual else hidden)
            h = h + ml.mlp(ml.post_attention_layernorm(h))
            normed = ref.norm(h)
            outs.append(normed)
            fb = normed if ref.cfg.norm_output else h
            hidden = F.pad(fb, (0, 0, 1, 0))[:, :T]               # step k+1 at row Q reads row Q-1
        return outs

    def loss_and_stats(self, batch: Batch, steps: int, cfg: TrainConfig):
        outs = self.forward(batch, steps)
        total = 0.0
        weights = 0.0
        correct = []
        T = batch.feats.shape[1]
        for k, normed in enumerate(outs):
            valid = batch.valid.clone()
            valid[:, :k] = False
            rows = normed[valid]                                     # [N, H]
            if rows.shape[0] == 0:
                correct.append(torch.zeros_like(batch.valid))
                continue
            logits = self.ref.lm_head(rows)                          # [N, Vd]
            logq = logits.log_softmax(-1)
            tid = batch.tgt_ids[valid]
            tlogp = batch.tgt_logp[valid]
            inv = tid >= 0
            p = torch.where(inv, tlogp.exp(), torch.zeros_like(tlogp))
            p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
            soft = -(p * logq.gather(1, tid.clamp_min(0))).sum(-1).mean()
            hard_ids = batch.hard[valid]
            hv = hard_ids >= 0
            hard = -(logq.gather(1, hard_ids.clamp_min(0)[:, None])[:, 0] * hv).sum() / hv.sum().clamp_min(1)
            w = cfg.step_decay ** k
            total = total + w * (soft + cfg.hard_weight * hard)
            weights += w
            c = torch.zeros_like(batch.valid)
            c[valid] = logits.argmax(-1) == batch.hard[valid]
            correct.append(c)
        return total / weights, correct


def chain_tau(correct: list[torch.Tensor], valid: torch.Tensor, depth: int) -> tuple[float, float]:
    """(sum of accepted lengths, number of cycle starts) for chains of ``depth`` drafts."""
    B, T = valid.shape
    alive = valid.clone()
    acc = torch.zeros(B, T, device=valid.device)
    for k in range(min(depth, len(correct))):
        ck = torch.zeros_like(valid)
        ck[:, :T - k] = correct[k][:, k:]       # step k of a chain starting at row P sits at row P+k
        alive = alive & ck
        acc += alive.float()
    return float(acc[valid].sum()), float(valid.sum())


def walk_tau(correct: list[torch.Tensor], valid: torch.Tensor, depth: int) -> tuple[float, float]:
    """(tokens, cycles) walking each row's response cycle by cycle, as the runtime drafts: accept
    the consecutive correct steps (at most ``depth``), commit them plus the target's own token, and
    start the next cycle after them. The first cycle starts at the first response token (the
    target's own, from the prompt's prefill), or at the window's start when it cuts the response."""
    ok = [c.cpu().numpy() for c in correct[:depth]]
    val = valid.cpu().numpy()
    tokens = cycles = 0
    for i in range(val.shape[0]):
        rows = np.flatnonzero(val[i])
        if not len(rows):
            continue
        P, end = int(rows[0]) + (rows[0] > 0), int(rows[-1]) + 1
        while P < end:
            L = 0
            while L < len(ok) and P + L < end and ok[L][i, P + L]:
                L += 1
            tokens += L + 1
            cycles += 1
            P += L + 1
    return float(tokens), float(cycles)


@dataclass
class TrainState:
    step: int = 0
    elapsed: float = 0.0
    best_tau: float = -1.0
    history: list = field(default_factory=list)
    held_id: str = ""      # which held-out set best_tau was measured on


def new_drafter(cfg: DrafterConfig, ids: np.ndarray, emb: np.ndarray, seed: int) -> EagleReference:
    torch.manual_seed(seed)
    ref = EagleReference(cfg, draft_vocab=len(ids))
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)
        # lm_head from the target's tied embedding rows, scaled to unit mean norm
        rows = torch.from_numpy(emb[ids]).float()
        ref.lm_head.weight.copy_(rows / rows.norm(dim=1).mean())
        ref.d2t.copy_(torch.from_numpy(ids - np.arange(len(ids))))
    return ref


def evaluate(model: TTTModel, seqs: list[SeqFeatures], t2d_index, cfg: TrainConfig, depth: int = 4) -> dict:
    rng = random.Random(0)
    ref = model.ref
    ref.eval()
    acc_sum = n = 0.0
    walk_tokens = walk_cycles = 0.0
    first_ok = 0.0
    loss_sum = 0.0
    nb = 0
    with torch.no_grad():
        for group in batches(seqs, cfg.batch_tokens, cfg.max_len, rng):
            b = make_batch([seqs[i] for i in group], t2d_index, cfg.max_len, rng).to(model.device)
            loss, correct = model.loss_and_stats(b, max(depth, 1), cfg)
            a, c = chain_tau(correct, b.valid, depth)
            acc_sum += a
            n += c
            t, c = walk_tau(correct, b.valid, depth)
            walk_tokens += t
            walk_cycles += c
            first_ok += float(correct[0][b.valid].sum())
            loss_sum += float(loss)
            nb += 1
    ref.train()
    return {"tau": walk_tokens / max(walk_cycles, 1), "tau_all": 1.0 + acc_sum / max(n, 1),
            "first_acc": first_ok / max(n, 1), "loss": loss_sum / max(nb, 1)}


def _held_id(held: list[SeqFeatures]) -> str:
    import hashlib

    h = hashlib.sha1()
    for f in held:
        h.update(np.asarray(f.tokens, dtype=np.int32).tobytes())
    return h.hexdigest()


def save_atomic(obj, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def train(ref: EagleReference, emb: np.ndarray, train_seqs: list[SeqFeatures], held: list[SeqFeatures],
          t2d_index: np.ndarray, cfg: TrainConfig, work: Path, *, resume_state: dict | None = None,
          report: Callable[[dict], None] | None = None, should_stop: Callable[[], bool] | None = None,
          device: str = "cpu") -> TrainState:
    """Train until the time budget (cumulative over resumes) or max_steps; keep the best drafter
    (by held-out tokens per cycle) in ``work/best.pt`` and the full state in ``work/checkpoint.pt``."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    model = TTTModel(ref, torch.from_numpy(emb), device)
    params, opt = _optimizer(ref, cfg)
    rng = random.Random(cfg.seed)
    state = _restored(ref, opt, rng, resume_state, _held_id(held))

    def checkpoint() -> None:
        save_atomic({"model": ref.state_dict(), "optim": opt.state_dict(), "state": vars(state),
                     "rng": rng.getstate(), "torch_rng": torch.get_rng_state()}, work / "checkpoint.pt")

    def run_eval() -> None:
        metrics = evaluate(model, held, t2d_index, cfg)
        metrics.update(step=state.step, elapsed=round(state.elapsed, 1))
        state.history.append(metrics)
        if metrics["tau"] > state.best_tau:
            state.best_tau = metrics["tau"]
            save_atomic({k: v.detach().cpu() for k, v in ref.state_dict().items()}, work / "best.pt")
        if report:
            report({"event": "eval", **metrics, "best_tau": state.best_tau})

    t_last = time.perf_counter()
    last_eval = last_ckpt = state.elapsed
    done = False
    while not done:
        for group in batches(train_seqs, cfg.batch_tokens, cfg.max_len, rng):
            done = _finished(state, cfg, should_stop)
            if done:
                break
            b = make_batch([train_seqs[i] for i in group], t2d_index, cfg.max_len, rng).to(device)
            if b.tokens == 0:
                continue
            loss, correct = _step(model, opt, params, b, state, cfg)
            now = time.perf_counter()
            state.elapsed += now - t_last
            t_last = now
            if report:
                acc0 = float(correct[0][b.valid].float().mean()) if b.tokens else 0.0
                report({"event": "step", "step": state.step, "loss": float(loss.detach()), "acc0": acc0,
                        "elapsed": state.elapsed, "budget": cfg.time_budget_s, "lr": opt.param_groups[0]["lr"]})
            if state.elapsed - last_eval >= cfg.eval_every_s:
                run_eval()
                last_eval = state.elapsed
                t_last = time.perf_counter()   # evaluation time does not count against training
            if state.elapsed - last_ckpt >= cfg.checkpoint_every_s:
                checkpoint()
                last_ckpt = state.elapsed
                t_last = time.perf_counter()
    run_eval()
    checkpoint()
    return state


def _optimizer(ref: EagleReference, cfg: TrainConfig):
    """(trainable parameters, AdamW with weight decay on matrices only)."""
    params = [p for p in ref.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    return params, opt


def _restored(ref: EagleReference, opt, rng: random.Random, resume_state: dict | None, held_id: str) -> TrainState:
    """A fresh state, or the checkpoint's (model, optimizer and random states restored in place)."""
    state = TrainState()
    if resume_state is not None:
        ref.load_state_dict(resume_state["model"])
        opt.load_state_dict(resume_state["optim"])
        state = TrainState(**resume_state["state"])
        rng.setstate(resume_state["rng"])
        torch.set_rng_state(resume_state["torch_rng"])
    if state.held_id != held_id:
        state.best_tau = -1.0   # measured on other held-out sequences (the data changed): not comparable
        state.held_id = held_id
    return state


def _finished(state: TrainState, cfg: TrainConfig, should_stop: Callable[[], bool] | None) -> bool:
    return state.elapsed >= cfg.time_budget_s or bool(cfg.max_steps and state.step >= cfg.max_steps) or \
        (should_stop is not None and should_stop())


def _lr_at(cfg: TrainConfig, step: int, elapsed: float) -> float:
    """Linear warm-up, then cosine annealing to ``min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    # anneal along whichever limit comes first: a step cap that the time budget cuts short still
    # ends at the low learning rate
    frac = min(1.0, max(elapsed / cfg.time_budget_s, step / cfg.max_steps if cfg.max_steps else 0.0))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def _step(model: TTTModel, opt, params: list, b, state: TrainState, cfg: TrainConfig):
    """One optimizer step on batch ``b``: (loss, per-step correctness)."""
    for pg in opt.param_groups:
        pg["lr"] = _lr_at(cfg, state.step, state.elapsed)
    loss, correct = model.loss_and_stats(b, cfg.ttt_steps, cfg)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    state.step += 1
    return loss, correct
