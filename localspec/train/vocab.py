"""The draft vocabulary: the target tokens the drafter may propose, by frequency in the data."""

from __future__ import annotations

import numpy as np


def choose_draft_vocab(token_lists, n_vocab: int, size: int, *, always: list[int] = ()) -> np.ndarray:
    """Sorted absolute target ids of the ``size`` most frequent tokens (ties: lower id first)."""
    counts = np.zeros(n_vocab, dtype=np.int64)
    for toks in token_lists:
        if len(toks):
            np.add.at(counts, np.asarray(toks, dtype=np.int64), 1)
    for t in always:
        counts[t] += 1 << 40
    size = min(size, n_vocab)
    order = np.lexsort((np.arange(n_vocab), -counts))
    return np.sort(order[:size]).astype(np.int64)


def mappings(ids: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d2t offsets as checkpoints store them, t2d bool mask, target id -> draft id or -1)."""
    d2t = ids - np.arange(len(ids), dtype=np.int64)
    t2d = np.zeros(n_vocab, dtype=bool)
    t2d[ids] = True
    index = np.full(n_vocab, -1, dtype=np.int64)
    index[ids] = np.arange(len(ids))
    return d2t, t2d, index


def coverage(ids: np.ndarray, token_lists, n_vocab: int) -> float:
    mask = np.zeros(n_vocab, dtype=bool)
    mask[ids] = True
    total = hit = 0
    for toks in token_lists:
        a = np.asarray(toks, dtype=np.int64)
        total += a.size
        hit += int(mask[a].sum())
    return hit / total if total else 0.0
