"""How many tokens to draft each cycle.

``fixed`` always drafts ``draft_max`` (tests, benchmarks). ``auto`` drafts while the drafter is
confident (top-1 probability at least ``p_min``), and measures what each verified token actually
costs: if speculative cycles deliver fewer tokens per second than plain steps, it falls back to
plain decoding and re-probes after a while, so speculation never makes generation slower for long.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

POLICIES = ("auto", "fixed")


@dataclass
class PolicyConfig:
    name: str = "auto"
    draft_max: int = 4
    p_min: float = 0.3          # auto: stop drafting below this drafter confidence
    probe_every: int = 16       # auto: cycles of plain decoding before trying drafts again


def top1_probability(logits: np.ndarray) -> tuple[int, float]:
    """The drafter's most likely token and its softmax probability."""
    best = int(np.argmax(logits))
    top = logits[best]
    total = float(np.exp(logits - top, dtype=np.float32).sum())
    return best, 1.0 / total


class DraftPolicy:
    def __init__(self, config: PolicyConfig) -> None:
        self.config = config
        self._plain_rate = 0.0   # EMA of tokens/s in plain cycles
        self._spec_rate = 0.0    # EMA of tokens/s in speculative cycles
        self._plain_left = 2     # cycles of plain decoding before the next probe; the first
                                 # ones measure what a plain step delivers on this machine

    @property
    def fixed(self) -> bool:
        return self.config.name == "fixed"

    def depth(self, room: int) -> int:
        """How many tokens to draft at most this cycle (0: a plain step)."""
        k = min(self.config.draft_max, room)
        if self.fixed or k <= 0:
            return max(k, 0)
        if self._plain_left > 0:
            self._plain_left -= 1
            return 0
        return k

    def keep_drafting(self, probability: float) -> bool:
        return self.fixed or probability >= self.config.p_min

    def observe(self, drafted: int, emitted: int, seconds: float) -> None:
        if self.fixed or seconds <= 0:
            return
        rate = emitted / seconds
        alpha = 0.2
        if drafted == 0:
            self._plain_rate = rate if self._plain_rate == 0 else (1 - alpha) * self._plain_rate + alpha * rate
            return
        self._spec_rate = rate if self._spec_rate == 0 else (1 - alpha) * self._spec_rate + alpha * rate
        if self._plain_rate > 0 and self._spec_rate < self._plain_rate:
            self._plain_left = self.config.probe_every
            self._spec_rate = 0.0  # the next probe starts fresh
