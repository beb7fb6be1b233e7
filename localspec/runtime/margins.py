"""Bench-only bookkeeping: how close each greedy choice was to a tie.

A :class:`MarginRecorder` is a generation observer (see :mod:`localspec.runtime.generation`): it
reads the logits every committed token was chosen from (penalised, if penalties are on) and keeps
the top-1 minus top-2 gap. ``bench`` reports it at the first divergence between plain and
speculative decoding: a divergence at a near-tie is llama.cpp's batch arithmetic, one with a clear
gap is a bug. The loop does not count an observer's time as generation time.
"""

from __future__ import annotations

import numpy as np

from .sampling import Sampler
from .verifier import Verified


def margin(logits) -> float:
    """Top-1 minus top-2 logit: how close a greedy choice was to a tie."""
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])


class MarginRecorder:
    """Per emitted token, the margin of the logits it was chosen from."""

    def __init__(self) -> None:
        self.margins: list[float] = []

    def after_prefill(self, ctx, sampler: Sampler) -> None:
        self.margins.append(margin(sampler.penalised(ctx.logits(-1))))

    def after_verify(self, ctx, sampler: Sampler, verified: Verified) -> None:
        drafts = verified.drafts
        self.margins.extend(margin(sampler.penalised(ctx.logits(r), drafts[:j]))  # row j follows j drafts
                            for j, r in enumerate(verified.logit_rows))

    def result(self, n_tokens: int) -> list[float]:
        return self.margins[:n_tokens]
