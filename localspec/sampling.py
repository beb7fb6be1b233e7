"""Token choice from target logits, and the speculative acceptance rule that keeps it lossless.

Filters follow llama.cpp's default order (top-k, top-p, min-p, then temperature). Drafts are
proposed deterministically (the drafter's top token), so the rejection rule is: accept draft ``x``
with probability ``p(x)``; on rejection sample from ``p`` with ``x`` removed and renormalised. The
emitted token then has exactly the distribution ``p``:
``P(y) = p(x)[y = x] + (1 - p(x)) p(y)[y != x] / (1 - p(x)) = p(y)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import options


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None

    def __post_init__(self) -> None:
        # ranges, types and finiteness: localspec.options (one table for every entry point)
        for name in ("temperature", "top_k", "top_p", "min_p"):
            object.__setattr__(self, name, options.check(name, getattr(self, name)))
        object.__setattr__(self, "seed", options.check_seed(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The target's sampling distribution as (token ids, probabilities), most probable first."""
    n = logits.shape[0]
    k = params.top_k if 0 < params.top_k < n else n
    if k < n:
        ids = np.argpartition(logits, n - k)[n - k:]
    else:
        ids = np.arange(n)
    vals = logits[ids].astype(np.float64)
    order = np.argsort(-vals, kind="stable")
    ids, vals = ids[order], vals[order]
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        ids, vals, probs = ids[:keep], vals[:keep], probs[:keep]
    if params.min_p > 0.0:
        keep = int(np.count_nonzero(probs >= params.min_p * probs[0]))
        ids, vals = ids[:keep], vals[:keep]
    scaled = (vals - vals[0]) / params.temperature
    probs = np.exp(scaled)
    probs /= probs.sum()
    return ids, probs


class Sampler:
    """Chooses tokens from logits: argmax when greedy, else from :func:`distribution`."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def choose(self, logits: np.ndarray) -> int:
        if self.params.greedy:
            return int(np.argmax(logits))
        ids, probs = distribution(logits, self.params)
        return int(ids[self.rng.choice(len(ids), p=probs)])

    def verify(self, logits: np.ndarray, draft: int) -> tuple[bool, int]:
        """Judge one drafted token against the target's logits at its position.

        Returns (accepted, token): the draft itself if accepted, else the target's replacement.
        """
        if self.params.greedy:
            best = int(np.argmax(logits))
            return best == draft, best
        ids, probs = distribution(logits, self.params)
        hit = np.flatnonzero(ids == draft)
        p_draft = float(probs[hit[0]]) if hit.size else 0.0
        if p_draft > 0.0 and self.rng.random() < p_draft:
            return True, draft
        if hit.size:
            probs = probs.copy()
            probs[hit[0]] = 0.0
            total = probs.sum()
            if total <= 0.0:  # p(draft) was 1 up to rounding
                return True, draft
            probs /= total
        return False, int(ids[self.rng.choice(len(ids), p=probs)])
