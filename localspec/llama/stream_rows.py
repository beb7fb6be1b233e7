"""The order a batch's rows go in when the KV cache keeps one stream per sequence (``kv_unified`` off).

llama.cpp cuts such a batch into micro-batches with ``llama_batch_allocr::split_equal(n_ubatch,
sequential=true)`` (``src/llama-batch.cpp``): a micro-batch takes one run of consecutive sequence
ids, scanning the rows in batch order, so a batch whose rows are not sorted by sequence (slots 2,
0, 1, 3: the scheduler adds slots in arrival order) decodes as several graphs where one would do.
The context hands llama.cpp the rows sorted by sequence (:func:`arrange`, stable: each sequence's
rows keep their order) and maps its callers' row numbers onto the sorted ones: logits through
``llama_get_logits_ith``, and the per-token outputs (target layer inputs, the MTP hidden states),
which come back in the order the rows went in (tests/test_kv_layout.py reads them back row by row
against a unified context).
"""

from __future__ import annotations

from typing import Sequence


def arrange(seqs: Sequence[int]) -> list[int] | None:
    """The caller's rows (``seqs``: each row's sequence id) in the order to hand llama.cpp: sorted
    by sequence, stable. None where they already are (a step of consecutive slots)."""
    if all(seqs[i] <= seqs[i + 1] for i in range(len(seqs) - 1)):
        return None
    return sorted(range(len(seqs)), key=seqs.__getitem__)


def inverse(sent: Sequence[int]) -> list[int]:
    """Where each caller row went in: ``inverse(sent)[sent[j]] == j``."""
    at = [0] * len(sent)
    for j, i in enumerate(sent):
        at[i] = j
    return at
