"""Each emitted token's log-probability, read from the logit rows the generation already has.

The distribution is the target's raw logits, log-softmaxed: before repetition penalties, the
grammar's mask, temperature and the top-k/top-p/min-p filters. That is what OpenAI reports and what
llama-server reports by default (``post_sampling_probs=false``: ``get_token_probabilities`` in
``tools/server/server-common.cpp`` softmaxes ``llama_get_logits_ith``). A verify row under
speculation holds the same logits as the one-token decode of plain decoding, so the values agree
with and without speculation (up to the last bits of batched arithmetic), and cost no decode.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.events import TokenLogprob


class LogprobRecorder:
    """Turns a logit row and the token chosen from it into a :class:`TokenLogprob` with ``k``
    alternatives."""

    def __init__(self, model, k: int) -> None:
        self.model = model          # piece(token) -> bytes
        self.k = k

    def _entry(self, token: int, logprob: float, top: tuple[TokenLogprob, ...] = ()) -> TokenLogprob:
        data = self.model.piece(token)
        return TokenLogprob(int(token), data.decode("utf-8", "replace"), data, float(logprob), top)

    def record(self, logits: np.ndarray, token: int) -> TokenLogprob:
        row = np.asarray(logits, dtype=np.float64)
        top_logit = row.max()
        norm = top_logit + np.log(np.exp(row - top_logit).sum())
        top: tuple[TokenLogprob, ...] = ()
        k = min(self.k, row.shape[0])
        if k:
            ids = np.argpartition(-row, k - 1)[:k]
            ids = ids[np.lexsort((ids, -row[ids]))]       # most probable first, ties by id
            top = tuple(self._entry(int(i), row[i] - norm) for i in ids)
        return self._entry(token, row[token] - norm, top)

    def rows(self, ctx, tokens: Sequence[int], rows: Sequence[int]) -> list[TokenLogprob]:
        """One entry per committed token, ``rows[j]`` being the batch row that chose ``tokens[j]``."""
        return [self.record(ctx.logits(r), t) for t, r in zip(tokens, rows)]
