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

from .sources import CLASSES, Found, SourceContext, TextSource

MAX_N = 4
MIN_N = 1
LONG_N = 16      # the long index's n-gram length
MATCH_CAP = 64   # proposals report how far back their match really goes, up to this many tokens

# lookup statistics classes: by matched length 1, 2, 3, 4-7, 8-15, 16-31, 32-63, 64+ (lookup.MATCH_CAP),
# and loops apart (see match_bucket)
LOOKUP_BUCKETS = (1, 2, 3, 4, 8, 16, 32, 64)
# (first draft, later drafts) acceptance priors by bucket. A match of 16+ tokens is a copy or a
# loop, and greedy decoding goes on with it: its priors sit a little below the acceptance measured
# on the bench sets' greedy output (weight 2: a generation's own outcomes take over within a few
# cycles; docs/speculation.md, "Policy `auto`").
LOOKUP_PRIORS = ((0.15, 0.2), (0.3, 0.35), (0.45, 0.5), (0.6, 0.65), (0.7, 0.75), (0.9, 0.97),
                 (0.97, 0.995), (0.98, 0.998))
# Loops: a match at least as long as the distance back to the occurrence it continues (the text
# repeats its last ``period`` tokens verbatim, lookup.NgramLookup.find) of 4-7, 8-15, 16-31
# tokens. Greedy decoding that has gone once round a loop mostly goes round again (measured:
# docs/speculation.md, "Loops"). Longer matches share the length buckets (nearly every match of
# 32+ tokens is a loop). Only LONG_MATCH decides how deep a loop drafts, as for other matches
# (deep drafts of shorter loops lost on coding).
LOOP_BUCKETS = (4, 8, 16)
LOOP_PRIORS = ((0.75, 0.95), (0.9, 0.97), (0.95, 0.99))
LONG_MATCH = 16        # auto: a lookup match this long (a copy, a loop) may draft up to lookup_max


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
            if i >= LONG_N:   # one tuple of the last LONG_N tokens; the short keys are its tails
                tail = tuple(toks[i - LONG_N:i])
                long[tail] = i
                tail = tail[-max_n:] if max_n <= LONG_N else tuple(toks[i - max_n:i])
            else:
                tail = tuple(toks[max(0, i - max_n):i])
            for j in range(len(tail)):
                index[tail[j:]] = i
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


def _bucket(match: int, buckets: tuple[int, ...] = LOOKUP_BUCKETS) -> int:
    i = 0
    while i + 1 < len(buckets) and match >= buckets[i + 1]:
        i += 1
    return i


def match_bucket(match: int, period: int = 0) -> int:
    """The place among lookup's statistics classes of a proposal whose suffix match is ``match``
    tokens long and continues an occurrence ``period`` tokens back (0: unknown): its length
    bucket, or a loop class (:data:`LOOP_BUCKETS`, after the length buckets) when the match
    spans the whole period."""
    if LOOP_BUCKETS[0] <= match < LOOKUP_BUCKETS[-2] and 0 < period <= match:
        return len(LOOKUP_BUCKETS) + _bucket(match, LOOP_BUCKETS)
    return _bucket(match)


def _span(buckets: tuple[int, ...], i: int, last: str) -> str:
    lo = buckets[i]
    hi = buckets[i + 1] - 1 if i + 1 < len(buckets) else None
    return str(lo) if hi == lo else f"{lo}-{hi}" if hi is not None else f"{lo}{last}"


# lookup's statistics classes, in match_bucket's order: "match 4-7", "loop 8-15", ...
_LENGTH_CLASSES = tuple((f"match {_span(LOOKUP_BUCKETS, i, '+')}", prior, LOOKUP_BUCKETS[i] >= LONG_MATCH)
                        for i, prior in enumerate(LOOKUP_PRIORS))
_LOOP_CLASSES = tuple((f"loop {_span(LOOP_BUCKETS + (LOOKUP_BUCKETS[-2],), i, '')}", prior, LOOP_BUCKETS[i] >= LONG_MATCH)
                      for i, prior in enumerate(LOOP_PRIORS))


class LookupSource(TextSource):
    """N-gram lookup as a draft source: the generation's own text (its history), free."""

    name = "lookup"
    order = 10
    classes = _LENGTH_CLASSES + _LOOP_CLASSES

    def __init__(self, history: NgramLookup, base: int) -> None:
        self.history = history
        self.base = base

    @classmethod
    def create(cls, ctx: SourceContext) -> "LookupSource | None":
        return cls(ctx.history, CLASSES.first(cls.name)) if ctx.history is not None else None

    def find(self) -> Found | None:
        history = self.history
        start, match = history.find()
        if not match:
            return None
        return Found(self, match, self.base + match_bucket(match, len(history) - start), start, match >= LONG_N)

    def propose(self, found: Found, k: int) -> list[int]:
        return self.history.continuation(found.at, k)
