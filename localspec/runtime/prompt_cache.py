"""The slots' texts kept in host memory after their slot moved on: llama-server's ``--cache-ram``.

A slot keeps one text's KV cells, its last request's; the next request with that prefix reads
only its new tokens (the scheduler sends it to that slot). With more conversations, or repeated
requests, than slots, a slot's text is overwritten while it is still wanted. Before a slot takes
a request that would drop ``MIN_TOKENS`` or more of its cached text, its cells are serialised
into this cache (``llama_state_seq_get_data``); a request whose prompt shares more with a kept
text than with its slot's has that text loaded into the slot first (``llama_state_seq_set_data``),
and prefills only the rest (:func:`worth_loading`: as llama-server's prompt cache, which loads
whenever a kept text matches more of the prompt).
Least recently used texts go first once ``budget`` bytes are held. A text is in a slot or in the
cache, never both: a loaded text leaves the cache (:meth:`PromptCache.take`) before the slot's
own text goes in, so keeping one can never evict the one being loaded.

Loaded cells are the very rows computed before, so the output is that of the request on the
slot that first computed them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import numpy as np

MIN_TOKENS = 32     # a text worth keeping: the prompt would drop at least this many of its tokens
MIN_GAIN = 4        # a load worth doing: at least this many prompt rows it saves ...
MIN_USED = 1 / 8    # ... and at least this share of the kept text's cells it reuses


def worth_loading(gain: int, used: int, kept: int) -> bool:
    """Whether to load a kept text of ``kept`` tokens whose first ``used`` match the prompt,
    ``gain`` more than the slot's own cells do. A load copies all its cells and saves ``gain``
    prompt rows, a forward pass each (measured here: a 170-token text of the default model loads
    in 1-2 ms, a prompt row costs about 2.5 ms), so it pays unless most of the text is of no use."""
    return gain >= MIN_GAIN and used >= kept * MIN_USED


def common_prefix(a, b) -> int:
    """How many leading tokens ``a`` and ``b`` (lists or arrays) share; vectorised, since the
    engine thread compares long prompts (thousands of tokens) with every kept text."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


@dataclass
class Kept:
    tokens: list[int]
    target: object            # the target sequence's cells (Context.seq_state)
    exact_upto: int = 0       # the leading rows that exact rows wrote (TargetVerifier.exact_upto)

    @property
    def nbytes(self) -> int:
        return len(self.target)

    @cached_property
    def array(self) -> np.ndarray:
        return np.asarray(self.tokens)


class PromptCache:
    def __init__(self, budget: int) -> None:
        self.budget = budget            # bytes
        self.used = 0
        self._kept: OrderedDict[tuple[int, ...], Kept] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def best(self, prompt: list[int]) -> tuple[Kept | None, int]:
        """The kept text sharing the longest prefix with ``prompt``, and that prefix's length."""
        best, length = None, 0
        prompt = np.asarray(prompt)
        for kept in self._kept.values():
            n = common_prefix(kept.array, prompt)
            if n > length:
                best, length = kept, n
        return best, length

    def put(self, kept: Kept) -> None:
        key = tuple(kept.tokens)
        old = self._kept.pop(key, None)
        if old is not None:
            self.used -= old.nbytes
        if kept.nbytes > self.budget:
            return
        while self._kept and self.used + kept.nbytes > self.budget:
            _, gone = self._kept.popitem(last=False)
            self.used -= gone.nbytes
        self._kept[key] = kept
        self.used += kept.nbytes

    def touch(self, kept: Kept) -> None:
        """``kept`` counts as used now (the newest); absent (evicted meanwhile): nothing to do."""
        key = tuple(kept.tokens)
        if key in self._kept:
            self._kept.move_to_end(key)

    def take(self, kept: Kept) -> None:
        """``kept`` goes out of the cache (it is being loaded into a slot, which holds it from
        now on; the slot's text is kept again when the slot moves on). Absent: nothing to do."""
        gone = self._kept.pop(tuple(kept.tokens), None)
        if gone is not None:
            self.used -= gone.nbytes

    def clear(self) -> None:
        self._kept.clear()
        self.used = 0
