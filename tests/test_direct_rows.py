"""The EAGLE drafter's rows through a plain llama_batch (llama.ext_rows.DirectRows: one
llama_decode / llama_encode a batch) give bit for bit what the extended batch gives (four C calls
a row and llama_process): the fc encode, a catch-up, chain steps, a batched step and a tree's
branches, on the shipped SmolLM2 pair.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.core.errors import LocalspecError
from localspec.llama.ext_rows import DirectRows
from localspec.runtime.engine import Engine

DRAFTER = Path(__file__).resolve().parents[1] / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"


def _drafts(eng, d, seq, toks: list[int]) -> list[np.ndarray]:
    """What the drafter returns for the prompt's rows and four greedy steps after them."""
    n = len(toks)
    d.ctx.seq_rm(0)
    eng.ctx.seq_rm(0)
    eng.ctx.decode(toks, 0, all_logits=False)
    feats = d.features(n)
    # a chain's accepted rows (consecutive: read as a slice) and a tree's path (taken row by row)
    assert np.array_equal(d.features(3, [1, 2, 3]), feats[1:4])
    assert np.array_equal(d.features(2, [0, 2]), feats[[0, 2]])
    g = d.encode(feats, seq)
    logits, state = seq.decode(toks[1:] + [toks[-1]], g, 0)
    out = [g.copy(), np.array(logits), state.copy()]
    pos = n
    for _ in range(3):
        logits, state = seq.decode([int(np.argmax(logits))], state[None, :], pos)
        out += [np.array(logits), state.copy()]
        pos += 1
    (logits, state), = d.decode_steps([(seq, int(np.argmax(logits)), state, pos)])
    out += [np.array(logits), state.copy()]
    top = [int(t) for t in np.argsort(-logits)[:3]]   # three branches of a tree, in sequences 1..3
    for s in (1, 2, 3):
        seq.fork(0, s)
    branches = seq.decode_branches(top, np.stack([state] * 3), pos + 1, [1, 2, 3])
    for s in (1, 2, 3):
        seq.forget(s)
    return out + [a for branch in branches for a in branch]


def test_direct_rows_give_the_extended_batch_s_results(smollm2):
    with Engine(smollm2, DRAFTER, n_ctx=256) as eng:
        d, seq = eng.drafter, eng.drafters[0]
        assert d.direct   # the EAGLE kind's rows go the direct way
        for text in ("The capital of France is Paris. The capital of Italy is",
                     "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" * 3):
            toks = eng.prompt_tokens(text)
            direct = _drafts(eng, d, seq, toks)
            d.direct = False
            try:
                extended = _drafts(eng, d, seq, toks)
            finally:
                d.direct = True
            assert len(direct) == len(extended) == 17
            for a, b in zip(direct, extended):
                assert a.shape == b.shape and np.array_equal(a, b)


def test_direct_rows_refuse_rows_of_another_width():
    rows = DirectRows(4, 8, tokens=True)
    with pytest.raises(LocalspecError, match="shape"):
        rows.fill([0], [1], np.zeros((1, 7), dtype=np.float32), [0], True)
    with pytest.raises(LocalspecError, match="rows for a batch of 4"):
        rows.fill([0] * 5, [1] * 5, np.zeros((5, 8), dtype=np.float32), list(range(5)), True)
