"""N-gram lookup drafts ("prompt lookup"): continue the text the way it continued before.

The history is the prompt plus every committed token. For the longest suffix of the history
(``max_n`` tokens down to ``min_n``) that occurred earlier, the proposal is what followed its most
recent earlier occurrence. Drafts are a deterministic function of the history, so the engine's
acceptance rule stays exact for sampling too.

The index maps each n-gram to the position right after its latest occurrence that has a
continuation; it is updated as tokens arrive (``max_n`` dictionary writes per token), so a proposal
costs a few dictionary reads, whatever the length of the history.

A second index holds ``LONG_N``-grams (one more dictionary write per token). It finds the
occurrence that matches a long stretch even when the short suffix occurred again since in
another context: the text being copied (a passage of the prompt, a loop in the output), whose
continuation can be drafted far ahead (see ``policy.MAX_DEPTH``). Like llama.cpp's ``ngram-mod``
(24-token n-grams), but an exact dictionary rather than a hash table, and the continuation is
read from the text itself rather than chained token by token.

Shadow scoring: a proposal is free, so every cycle's proposal is scored against the tokens that are
actually committed after it, whether or not it was verified. The policy thus knows lookup's
per-depth acceptance even while it decodes plain, and comes back to lookup as soon as it pays.
"""

from __future__ import annotations

from typing import Sequence

MAX_N = 4
MIN_N = 1
LONG_N = 16      # the long index's n-gram length
MATCH_CAP = 64   # proposals report how far back their match really goes, up to this many tokens


class NgramLookup:
    def __init__(self, tokens: Sequence[int] = (), *, max_n: int = MAX_N, min_n: int = MIN_N) -> None:
        self.max_n = max_n
        self.min_n = min_n
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        self._long: dict[tuple[int, ...], int] = {}   # LONG_N-grams -> the position after
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        toks, index, max_n, long = self.tokens, self._index, self.max_n, self._long
        for tok in tokens:
            i = len(toks)  # the new token's position: it continues every n-gram ending at i-1
            for n in range(1, min(max_n, i) + 1):
                index[tuple(toks[i - n:i])] = i
            if i >= LONG_N:
                long[tuple(toks[i - LONG_N:i])] = i
            toks.append(tok)

    def find(self) -> tuple[int, int]:
        """(start, match): where the text after the latest earlier occurrence of the longest
        matching suffix begins, and the match's length (0, 0: none). The suffix is found through
        the index for up to ``max_n`` tokens, then followed backwards up to ``MATCH_CAP`` tokens,
        since a long match (copying a passage) predicts its continuation far better than a short
        one. A ``LONG_N``-token suffix seen before is looked up first: its latest occurrence is the
        one the text is copying. ``len(self) - start`` is the distance back to that occurrence:
        a match at least that long is a loop (the text repeats its last tokens verbatim)."""
        toks = self.tokens
        size = len(toks)
        if size == 0:
            return 0, 0
        start = self._long.get(tuple(toks[size - LONG_N:])) if size > LONG_N else None
        if start is not None:
            return start, self._extend_match(start, LONG_N)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            start = self._index.get(tuple(toks[size - n:]))
            if start is not None:
                return start, self._extend_match(start, n)
        return 0, 0

    def _extend_match(self, start: int, n: int) -> int:
        """The match of ``n`` tokens before ``start`` followed backwards, up to ``MATCH_CAP``."""
        if n < self.max_n:
            return n
        toks = self.tokens
        a, b = start - n - 1, len(toks) - n - 1
        while a >= 0 and n < MATCH_CAP and toks[a] == toks[b]:
            a -= 1
            b -= 1
            n += 1
        return n

    def continuation(self, start: int, k: int) -> list[int]:
        """``k`` tokens of the text from ``start`` on (:meth:`find`)."""
        toks = self.tokens
        avail = len(toks) - start
        if avail >= k:
            return toks[start:start + k]
        # the continuation runs into the present: it repeats with period len - start
        period = toks[start:]
        return (period * (k // avail + 1))[:k]


class ShadowScore:
    """Scores proposals against the tokens committed after them: per-depth acceptance of a source
    whose drafts cost nothing to produce, verified or not.

    ``sink(key, proposal_length, accepted)`` hears each proposal (added with its ``key``, the
    policy's lookup class) once it is settled (its first miss, or all of it matched). With
    ``hits``, matched positions are reported as they come,
    ``hits(key, lo, hi)`` for positions lo..hi-1: a 128-token proposal on a loop is otherwise
    settled only 128 tokens later, and deep drafts would wait that long for their evidence."""

    __slots__ = ("_open", "sink", "hits")

    def __init__(self, sink, hits=None) -> None:
        self._open: list[list] = []  # [proposal, matched so far, key]
        self.sink = sink
        self.hits = hits

    def add(self, proposal: list[int], key: int) -> None:
        if proposal:
            self._open.append([proposal, 0, key])

    def commit(self, tokens: Sequence[int]) -> None:
        if not self._open:
            return
        still = []
        hits = self.hits
        for entry in self._open:
            proposal, done, key = entry
            start, m, settled = done, len(proposal), False
            for tok in tokens:
                if proposal[done] != tok:
                    settled = True
                    break
                done += 1
                if done == m:
                    settled = True
                    break
            if hits is not None and done > start:
                hits(key, start, done)
            if settled:
                self.sink(key, m, done)
            else:
                entry[1] = done
                still.append(entry)
        self._open = still

    def clear(self) -> None:
        self._open = []
