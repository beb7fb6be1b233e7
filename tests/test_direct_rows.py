"""The EAGLE drafter's rows through a plain llama_batch (llama.ext_rows.DirectRows: one
llama_decode / llama_encode a batch) give bit for bit what the extended batch gives (four C calls
a row and llama_process): the fc encode, a catch-up, chain steps, a batched step and a tree's
branches, on the shipped SmolLM2 pair; several slots' catch-ups in one encode and decode give
what each gives alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.core.errors import LocalspecError
from localspec.llama.ext_rows import DirectRows
from localspec.runtime.engine import Engine

from engine_checks import chain_drafts

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
    (logits, state), = d.decode_steps([(seq, int(np.argmax(logits)), state, pos, False)])
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



def _old_chain(seq, logits, state, pos: int, k: int) -> list[int]:
    """A greedy chain as run_chain drove it before ModelDrafter.step and greedy: every step one
    ``decode`` of one row, its state computed."""
    tokens = [int(np.argmax(logits))]
    while len(tokens) < k:
        logits, state = seq.decode([tokens[-1]], state[None, :], pos + len(tokens) - 1)
        tokens.append(int(np.argmax(logits)))
    return tokens


def _stepped_chain(seq, logits, state, pos: int, k: int) -> list[int]:
    """The same chain through ``step`` (the general chain's path: its last step without a state)."""
    tokens = [int(np.argmax(logits))]
    while len(tokens) < k:
        n = len(tokens)
        logits, state = seq.step(tokens[-1], state, pos + n - 1, n == k - 1)
        assert (state is None) == (n == k - 1)
        tokens.append(int(np.argmax(logits)))
    return tokens


def test_greedy_and_stepped_chains_draft_what_the_decode_path_drafts(smollm2):
    """ModelDrafter.greedy (one loop, states written into the batch row) and step (no state for
    the last step) draft bit for bit what one decode per step drafts, with the same logits."""
    with Engine(smollm2, DRAFTER, n_ctx=512) as eng:
        d, seq = eng.drafter, eng.drafters[0]
        for text in ("The capital of France is Paris. The capital of Italy is",
                     "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n" * 2):
            toks = eng.prompt_tokens(text)
            n = len(toks)
            d.ctx.seq_rm(0)
            eng.ctx.seq_rm(0)
            eng.ctx.decode(toks, 0, all_logits=False)
            logits, state = seq.decode(toks[1:] + [toks[-1]], d.encode(d.features(n), seq), 0)
            logits, state = np.array(logits), state.copy()
            got = {}
            for name, chain in (("old", _old_chain), ("greedy", seq.greedy), ("step", _stepped_chain)):
                for k in (1, 2, 4, 6):
                    d.ctx.seq_rm(n, seq=0)
                    got[name, k] = chain(seq, logits, state, n, k) if name != "greedy" else chain(logits, state, n, k)
            for k in (1, 2, 4, 6):
                assert got["old", k] == got["greedy", k] == got["step", k]
                assert len(got["old", k]) == k


def test_a_chain_s_last_step_computes_no_state_and_drafts_the_same(smollm2, monkeypatch):
    """A generation's chains (ModelDrafter.greedy) skip the fed-back state of their last step
    (never read): the drafts and the output are those of the full path (each step through decode,
    its state computed)."""
    from localspec.speculation.drafter import DrafterSequence, ModelDrafter

    from localspec.llama import hostloop

    monkeypatch.setattr(hostloop, "greedy_chain", None)   # the Python loop, whose states are counted
    monkeypatch.setattr(hostloop, "catch_up_chain", None)
    prompt = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox"
    with Engine(smollm2, DRAFTER, n_ctx=512) as eng:
        states, state = [], ModelDrafter.state

        def counted(self, idx, out=None):
            states.append(idx)
            return state(self, idx, out)

        monkeypatch.setattr(ModelDrafter, "state", counted)
        lean, lean_out = chain_drafts(eng, prompt, 40)
        lean_states = len(states)
        monkeypatch.setattr(DrafterSequence, "greedy", _old_chain)   # the path before: every state computed
        states.clear()
        full, full_out = chain_drafts(eng, prompt, 40)
        assert lean == full and lean_out == full_out
        reached = sum(len(d) == k > 1 for k, d in full)   # chains that took their last step
        assert reached > 0
        assert len(states) - lean_states == reached   # one state fewer for each


def _three_catch_ups(eng, prompts: list[list[int]], catch_ups) -> list[np.ndarray]:
    """Each prompt in its slot's target sequence, its rows recorded by the slot's drafter
    sequence and caught up (``catch_ups``: every slot's at once); then two more rows each, caught
    up; then the prompt again after them: every slot's logits and state of the three catch-ups."""
    from localspec.runtime.batch import Batch

    seqs, out = eng.drafters[:len(prompts)], []
    for i, toks in enumerate(prompts):
        eng.ctx.seq_rm(0, seq=i)
        seqs[i].reset(0)
    for again in range(3):
        for i, toks in enumerate(prompts):
            part, pos = [(toks, 0), (toks[:2], len(toks)), (toks, len(toks) + 2)][again]
            batch = Batch(eng.ctx)
            batch.add(i, part, pos, all_logits=False)
            batch.decode()
            seqs[i].observe(part[1:] + [toks[0]], len(part), pos)
        got = catch_ups([(seq, None) for seq in seqs])
        out += [a for logits, state in got for a in (np.array(logits), state.copy())]
    return out


def test_several_slots_catch_up_in_one_encode_and_decode_as_each_alone(smollm2):
    """ModelDrafter.catch_ups of four slots (one fc encode of every slot's committed rows, one
    decode of their pairs, each in its sequence at its positions: a prompt each, one of them
    longer than an all-outputs group; then two rows each; then the prompts again, after the
    pairs each sequence holds) gives bit for bit each slot's catch-up
    alone (its rows written in the same order, so in the same cells; every group has several
    rows: a lone row alone goes through ggml's one-row product, see ModelDrafter.decode_groups)."""
    with Engine(smollm2, DRAFTER, n_ctx=256, parallel=4) as eng:
        d = eng.drafter
        assert d.kind.shares_catch_up
        prompts = [eng.prompt_tokens(t) for t in ("The capital of France is Paris. The capital of Italy is",
                                                  "def add(a, b):\n    return a + b\n",
                                                  "Once upon a time, there was a",
                                                  "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11")]
        encodes, encode_rows = [], d.encode_rows

        def counted(*args):
            encodes.append(args)
            return encode_rows(*args)

        write_direct = d.write_direct

        def counted_direct(*args):   # a lone catch-up's encode and decode in one C call (llama.hostloop)
            done = write_direct(*args)
            if done is not None:
                encodes.append(args)
            return done

        d.encode_rows = counted
        d.write_direct = counted_direct
        alone = _three_catch_ups(eng, prompts, lambda asks: [tuple(map(np.copy, who.catch_up(rows))) for who, rows in asks])
        assert len(encodes) == 12
        encodes.clear()
        shared = _three_catch_ups(eng, prompts, d.catch_ups)
        # one encode a round for the four slots, n_batch rows each (a long round: several, each
        # sequence's rows in every one of them after the pairs it holds)
        rows = sum(map(len, prompts))
        assert rows > d.ctx.n_batch and len(encodes) == 2 * -(-rows // d.ctx.n_batch) + 1 < 12
        assert len(alone) == len(shared) == 24
        for a, b in zip(alone, shared):
            assert a.shape == b.shape and np.array_equal(a, b)


def test_a_shared_decode_reads_its_rows_from_one_block_as_row_by_row(smollm2):
    """A decode shared by several slots (their catch-ups, then a chain step of each) hands every
    slot its row's logits and fed-back state read from one view of the decode's rows
    (Context.logits_block, the drafter's states likewise): the values llama.cpp gives row by row."""
    from localspec.runtime.batch import Batch

    with Engine(smollm2, DRAFTER, n_ctx=256, parallel=4) as eng:
        d, seqs = eng.drafter, eng.drafters[:4]
        prompts = [eng.prompt_tokens(t) for t in ("The capital of France is Paris. The capital of Italy is",
                                                  "def add(a, b):\n    return a + b\n",
                                                  "Once upon a time, there was a", "1, 2, 3, 4, 5, 6")]
        for i, toks in enumerate(prompts):
            eng.ctx.seq_rm(0, seq=i)
            seqs[i].reset(0)
            batch = Batch(eng.ctx)
            batch.add(i, toks, 0, all_logits=False)
            batch.decode()
            seqs[i].observe(toks[1:] + [toks[0]], len(toks), 0)
        caught = [(int(np.argmax(logits)), state.copy()) for logits, state in d.catch_ups([(s, None) for s in seqs])]
        got = d.batched_steps([(seq, tok, state, len(toks), False)
                               for seq, (tok, state), toks in zip(seqs, caught, prompts)])
        block = d.ctx.logits_block(4)
        assert block.shape == (4, d.ctx.model.n_vocab)
        for j, (logits, state) in enumerate(got):
            assert np.array_equal(block[j], d.ctx.logits(j)) and np.array_equal(logits, d.ctx.logits(j))
            assert np.array_equal(state, d.state(j))
        assert len({int(np.argmax(logits)) for logits, _ in got}) > 1   # four slots, four rows of their own
