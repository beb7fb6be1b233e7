"""Recall: drafts from the text of earlier generations of the same engine.

A server's clients repeat themselves: an agent retries a step, a script sends the same request
again, an editor asks for the same completion twice, a conversation is regenerated. With greedy
decoding the answer is the same text; with sampling much of it often is. A generation's own lookup
index (:mod:`.lookup`) only knows its prompt and its output so far. Recall keeps the prompts and
outputs of the engine's recent generations (every slot's), and when the last ``LONG_N`` tokens of
a generation occurred in one of them, proposes what followed there. It is llama.cpp's
``ngram-mod`` (24-token n-grams in a hash table shared by llama-server's slots) and vLLM's suffix
decoding, kept as an exact index over whole documents: a proposal never runs from one document
into the next, and its match is followed backwards (up to ``MATCH_CAP`` tokens) so the policy
knows how sure it is.

Drafts are verified like any other, so output is unchanged. The store is bounded: past
``capacity`` tokens the older half is dropped.
"""

from __future__ import annotations

from typing import Sequence

from .lookup import LONG_N, MATCH_CAP
from .sources import CLASSES, Found, SourceContext, TextSource

# Recall (speculation.recall: the text of an earlier generation, matched on LONG_N+ tokens) has a
# class of its own after the predictions': a repeated request's text goes on as before until the
# first token where the two runs differ, and greedy runs of one prompt do differ at numerical
# near-ties (another batch shape, another prefix cache). On SmolLM2 chat requests repeated alone
# or 4 at a time, 50-55% of the recalled drafts were accepted; the prior is that of a per-token
# continuation of 0.97, and the live outcomes (one class for every slot) take over from it.
RECALL_PRIOR = (0.95, 0.97)
CAPACITY = 1 << 16   # tokens kept (about 500 requests of 128 tokens); a few MB of index
_END = -1            # between documents: no n-gram and no continuation crosses it


class Recall:
    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.tokens: list[int] = []
        self._index: dict[int, int] = {}   # hash of a LONG_N-gram -> the position after its latest occurrence

    def __len__(self) -> int:
        return len(self.tokens)

    def clear(self) -> None:
        self.tokens, self._index = [], {}

    def add(self, document: Sequence[int]) -> None:
        """Remember one generation's text (its prompt and output tokens)."""
        if len(document) <= LONG_N:
            return
        if len(self.tokens) + len(document) + 1 > self.capacity:
            self._drop_older_half(len(document) + 1)
        toks, index = self.tokens, self._index
        base = len(toks)
        toks.extend(document)
        toks.append(_END)
        for i in range(base + LONG_N, base + len(document)):
            index[hash(tuple(toks[i - LONG_N:i]))] = i

    def _drop_older_half(self, incoming: int) -> None:
        keep = max(0, min(len(self.tokens) // 2, self.capacity - incoming))
        documents, current = [], []
        for tok in self.tokens[len(self.tokens) - keep:]:
            if tok == _END:
                documents.append(current)
                current = []
            else:
                current.append(tok)
        self.clear()   # the first kept piece may be a document's tail: re-added as a document of its own
        for document in documents:
            if len(document) + 1 <= self.capacity:
                self.add(document)

    def find(self, history: Sequence[int]) -> tuple[int, int]:
        """(start, match) for ``history`` (a generation's prompt and output so far): where the text
        after an earlier occurrence of its last ``LONG_N`` tokens begins, and how many tokens of
        ``history`` match before it (``LONG_N`` to ``MATCH_CAP``); (0, 0): none."""
        size = len(history)
        if size < LONG_N or not self._index:
            return 0, 0
        tail = tuple(history[size - LONG_N:])
        start = self._index.get(hash(tail))
        toks = self.tokens
        if start is None or tuple(toks[start - LONG_N:start]) != tail or toks[start] == _END:
            return 0, 0
        n, a, b = LONG_N, start - LONG_N - 1, size - LONG_N - 1
        while a >= 0 and b >= 0 and n < MATCH_CAP and toks[a] == history[b]:
            a, b, n = a - 1, b - 1, n + 1
        return start, n

    def continuation(self, start: int, k: int) -> list[int]:
        """Up to ``k`` tokens from ``start`` (:meth:`find`), to the end of their document."""
        out = self.tokens[start:start + k]
        if _END in out:
            out = out[:out.index(_END)]
        return out


class RecallSource(TextSource):
    """Recall as a draft source: asked only where no other source found a copy (a lookup match
    of ``LONG_N`` tokens in the generation's own text, the prediction), for greedy requests of auto (see DraftStep), on with the
    lookup source; its drafts are lookup's on every surface."""

    name = "recall"
    label = "lookup"       # the surfaces count recalled drafts as lookup's
    switch = "lookup"
    order = 20
    fallback = True
    classes = (("recall", RECALL_PRIOR, True),)

    def __init__(self, recall: Recall, history, index: int) -> None:
        self.recall, self.history, self.index = recall, history, index

    @classmethod
    def create(cls, ctx: SourceContext) -> "RecallSource | None":
        if ctx.recall is None or ctx.history is None or getattr(ctx.policy, "fixed", False):
            return None   # a fixed policy's drafts depend on the request alone
        return cls(ctx.recall, ctx.history, CLASSES.index(cls.name, "recall"))

    def find(self) -> Found | None:
        at, match = self.recall.find(self.history.tokens)
        return Found(self, match, self.index, at) if match else None

    def propose(self, found: Found, k: int) -> list[int]:
        return self.recall.continuation(found.at, k)
