"""Repetition penalties over a window of recent tokens, as llama.cpp's ``penalties`` sampler applies them.

For each token seen ``c > 0`` times among the last ``repeat_last_n`` tokens of the context::

    logit = logit * repeat_penalty  if logit <= 0  else  logit / repeat_penalty
    logit -= c * frequency_penalty + presence_penalty

The window covers the whole context, prompt included: llama-server feeds every prompt token to the
sampler (``common_sampler_accept(..., is_generated=false)``) before it samples the first reply token,
and each sampled token after that, so the first reply token is already penalised for what the prompt
(for a chat: the template's tail and the user's message) repeats. ``repeat_last_n`` -1 is the whole
context (Ollama's meaning); 0 turns penalties off.

Under speculation a drafted position is judged with the counts of exactly its own context: the
committed tokens plus the drafts before it (``after``), as plain decoding would have seen them.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

import numpy as np


class PenaltyWindow:
    """Counts of the tokens in the window of the committed context, kept up to date as it grows."""

    def __init__(self, *, last_n: int, repeat: float, frequency: float, presence: float,
                 context: Iterable[int] = ()) -> None:
        self.last_n = last_n                      # -1: the whole context
        self.repeat = np.float32(repeat)
        self.frequency = np.float32(frequency)
        self.presence = np.float32(presence)
        self.tokens: list[int] = []
        self.counts: Counter[int] = Counter()
        self.push(context)

    def push(self, tokens: Iterable[int]) -> None:
        """Commit tokens to the context (the oldest leave the window)."""
        for tok in tokens:
            self.tokens.append(int(tok))
            self.counts[int(tok)] += 1
            if 0 < self.last_n < len(self.tokens):
                old = self.tokens[-self.last_n - 1]
                self.counts[old] -= 1
                if not self.counts[old]:
                    del self.counts[old]

    def counts_after(self, after: Sequence[int]) -> Counter[int] | dict[int, int]:
        """The window's counts for a context of the committed tokens followed by ``after``."""
        if not after:
            return self.counts
        counts = Counter(self.counts)
        counts.update(int(t) for t in after)
        if self.last_n > 0:
            n = len(self.tokens)
            start_now = max(0, n - self.last_n)
            start_then = max(0, n + len(after) - self.last_n)
            extended = self.tokens[start_now:] + [int(t) for t in after]
            counts.subtract(extended[: start_then - start_now])
            counts = Counter({t: c for t, c in counts.items() if c > 0})
        return counts

    def apply(self, logits: np.ndarray, after: Sequence[int] = ()) -> np.ndarray:
        """A penalised copy of one row of logits for the context ``committed + after``."""
        counts = self.counts_after(after)
        out = np.array(logits, dtype=np.float32)
        if not counts:
            return out
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        c = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        vals = out[ids]
        vals = np.where(vals <= 0, vals * self.repeat, vals / self.repeat)
        vals -= c * self.frequency + self.presence
        out[ids] = vals
        return out
