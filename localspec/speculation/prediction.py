"""Predicted Outputs as a draft source: text the user expects the answer to repeat (the file being
edited), proposed as a chain from the point the output has reached in it.

The output starts aligned with the prediction's first token. Each committed token that equals the
prediction's next one moves the alignment on; any other token loses it, and the source then
resynchronises by n-gram lookup restricted to the prediction: the longest suffix of the output
(``MAX_N`` tokens down to one) that occurs in the prediction, at its first occurrence from the
last aligned point on (an edit goes forward through the file), else its last one before it. The
proposal is the prediction's text after the alignment point.

The policy plans it as a lookup proposal with statistics classes of its own
(:class:`PredictedText`'s: just realigned, or followed for ``PREDICTION_SURE`` tokens), by the run of tokens
aligned so far (counted from the resynchronising n-gram); the first alignment counts as followed
(``START_MATCH`` tokens): the prediction is given as what the answer repeats.
Drafts are a deterministic function of the output, so the acceptance rule stays exact.
"""

from __future__ import annotations

import bisect
from typing import Sequence

from .lookup import LONG_MATCH, MATCH_CAP
from .sources import CLASSES, Found, SourceContext, TextSource

MAX_N = 8               # longest output suffix looked up in the prediction when resynchronising
START_MATCH = LONG_MATCH
# Predicted Outputs (speculation.prediction) have two classes of their own after lookup's: a
# prediction (re)aligned on fewer than PREDICTION_SURE tokens (just after an edit), and one the
# output has followed for at least that many (the first alignment counts as followed: the user
# gave the prediction as what the answer repeats). Priors like a loop's / a short match's; the
# live outcomes take over within a few cycles (a prediction the model does not follow stops
# being drafted, as any source that does not pay).
PREDICTION_SURE = 4
PREDICTION_PRIORS = ((0.5, 0.8), (0.9, 0.97))


class PredictionSource:
    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)
        # n-gram of the prediction -> the positions right after each occurrence (ascending), only
        # where the prediction goes on after it
        self._index: dict[tuple[int, ...], list[int]] = {}
        toks = self.tokens
        for n in range(1, MAX_N + 1):
            for end in range(n, len(toks)):
                self._index.setdefault(tuple(toks[end - n:end]), []).append(end)
        self.pos: int | None = 0 if toks else None   # the prediction token the output is expected to give next
        self.run = START_MATCH                        # tokens aligned in a row (the first alignment: a copy)
        self._last = 0                                # the latest aligned point
        self._tail: list[int] = []                    # the output's last MAX_N tokens

    def extend(self, committed: Sequence[int]) -> None:
        """Tokens that joined the output."""
        toks = self.tokens
        for tok in committed:
            self._tail.append(tok)
            pos = self.pos
            if pos is not None and pos < len(toks) and toks[pos] == tok:
                self.pos, self.run = pos + 1, min(self.run + 1, MATCH_CAP)
                self._last = pos + 1
            else:
                self.pos = None
        del self._tail[:-MAX_N]
        if self.pos is None or self.pos >= len(toks):
            self._resync()

    def _resync(self) -> None:
        tail = self._tail
        for n in range(len(tail), 0, -1):
            where = self._index.get(tuple(tail[-n:]))
            if where:
                i = bisect.bisect_left(where, self._last)
                self.pos = where[i] if i < len(where) else where[-1]
                self.run = n
                return
        self.pos = None

    def propose(self, k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens of the prediction from the alignment point, and the run length
        their class is judged by (([], 0): not aligned)."""
        if self.pos is None or k <= 0:
            return [], 0
        return self.tokens[self.pos:self.pos + k], self.run


def prediction_tokens_used(prediction: Sequence[int], output: Sequence[int]) -> tuple[int, int]:
    """(accepted, rejected) as OpenAI defines them for Predicted Outputs: the prediction's tokens
    that appear in the completion (matched in order, difflib's longest matching blocks) and those
    that do not."""
    import difflib

    matcher = difflib.SequenceMatcher(None, list(prediction), list(output), autojunk=False)
    accepted = sum(block.size for block in matcher.get_matching_blocks())
    return accepted, len(prediction) - accepted


class PredictedText(TextSource):
    """Predicted Outputs as a draft source (on with the lookup source: ``--source lookup``, auto)."""

    name = "prediction"
    switch = "lookup"
    order = 0   # before lookup: a prediction wins a tie of matches
    classes = (("realigned", PREDICTION_PRIORS[0]), ("followed", PREDICTION_PRIORS[1], True))

    def __init__(self, prediction: PredictionSource, base: int) -> None:
        self.prediction = prediction
        self.base = base

    @classmethod
    def create(cls, ctx: SourceContext) -> "PredictedText | None":
        if ctx.prediction is None or ctx.history is None:
            return None
        return cls(ctx.prediction, CLASSES.first(cls.name))

    def find(self) -> Found | None:
        run = self.prediction.propose(1)[1]
        # the user's text to repeat: a copy, whatever its run (recall is not asked after it)
        return Found(self, run, self.base + (1 if run >= PREDICTION_SURE else 0), copy=True) if run else None

    def propose(self, found: Found, k: int) -> list[int]:
        return self.prediction.propose(k)[0]

    def commit(self, tokens: Sequence[int]) -> None:
        self.prediction.extend(tokens)
