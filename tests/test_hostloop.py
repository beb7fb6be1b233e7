"""The host loop in C (localspec.llama._hostloop, built at install) against numpy, its independent
reference: the argmax of a row (the first of equal maxima, NaN first, as numpy's), EAGLE-3.1's
fed-back state, and a greedy draft chain: the same drafts and output as the Python loop."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from localspec.llama import hostloop
from localspec.runtime.engine import Engine
from localspec.speculation.drafter import ALL_OUTPUT_ROWS

from engine_checks import chain_drafts

DRAFTER = Path(__file__).resolve().parents[1] / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"
C = pytest.mark.skipif(not hostloop.COMPILED, reason="the C host loop is off (LOCALSPEC_HOSTLOOP=numpy)")


def test_the_c_host_loop_was_built():
    """An install from the README builds it (a C compiler is what llama-cpp-python needs too);
    LOCALSPEC_HOSTLOOP=numpy is the one way to run without it."""
    if os.environ.get("LOCALSPEC_HOSTLOOP", "").lower() != "numpy":
        assert hostloop.COMPILED


@pytest.fixture(params=["wide", "sse2"])
def simd(request):
    """The argmax's (and the exp-sum's) AVX2 path where the CPU has it, then the SSE2 (scalar) one."""
    if hostloop._c is None:
        yield "numpy"
        return
    hostloop._c.simd(request.param == "wide")
    try:
        yield hostloop._c.simd()
    finally:
        hostloop._c.simd(True)


@C
@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 31, 33, 63, 64, 65, 255, 256, 257, 1000, 49152])
def test_argmax_is_numpy_s(n, simd):
    rng = np.random.default_rng(n)
    for trial in range(40):
        x = rng.standard_normal(n).astype(np.float32)
        if trial % 4 == 1:                       # ties: the first of equal maxima
            x[rng.integers(0, n, size=3)] = x.max() + 1
        elif trial % 4 == 2:                     # -inf rows (a drafter's row outside its vocabulary)
            x[rng.random(n) < 0.9] = -np.inf
        elif trial % 4 == 3 and n > 1:           # a NaN counts as the largest: its first index
            x[rng.integers(0, n, size=2)] = np.nan
        assert hostloop.argmax(x) == int(np.argmax(x)), (n, trial)
    assert hostloop.argmax(np.full(n, -np.inf, np.float32)) == 0
    z = np.zeros(n, np.float32)
    z[n // 2] = -0.0
    assert hostloop.argmax(z) == 0


@C
@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 255, 256, 257, 272, 49152, 49153])
def test_the_top_token_s_probability_is_numpy_s(n, simd):
    """hostloop.top1 (a drafter's confidence test: the argmax and its softmax probability) against
    numpy's exp and sum over the row, on both SIMD paths: the same token, the probability within
    1e-6; a row whose top is NaN or +inf gives NaN, as numpy's sum does."""
    rng = np.random.default_rng(n)
    for scale in (0.05, 1.0, 4.0, 30.0, 200.0):
        x = (rng.standard_normal(n) * scale).astype(np.float32)
        if n > 3:
            x[rng.random(n) < 0.2] = -np.inf          # a drafter's row outside its vocabulary
            x[0] = max(x[0], 0.0)                     # not all of it
        best = int(np.argmax(x))
        ref = 1.0 / float(np.exp(x - x[best], dtype=np.float32).sum())
        tok, prob = hostloop.top1(x)
        assert tok == best
        assert abs(prob - ref) <= 1e-6 * ref, (n, scale, prob, ref)
    for bad in (np.nan, np.inf):
        x = np.zeros(max(n, 2), np.float32)
        x[1] = bad
        assert hostloop.top1(x)[0] == 1 and np.isnan(hostloop.top1(x)[1])
    with pytest.raises(ValueError):
        hostloop.top1(np.empty(0, np.float32))


@C
def test_the_fed_back_state_is_numpy_s_up_to_rounding():
    rng = np.random.default_rng(0)
    h = (rng.standard_normal(576) * 3).astype(np.float32)
    norm = rng.random(576).astype(np.float32)
    out = np.empty(576, np.float32)
    hostloop.normed_state(out, h, norm.ctypes.data, 1e-5)
    ref = h.astype(np.float64) * norm / np.sqrt(np.mean(h.astype(np.float64) ** 2) + 1e-5)
    np.testing.assert_allclose(out, ref, rtol=2e-6, atol=0)


def test_argmax_of_any_row_is_numpy_s():
    """A row that is no contiguous float32 buffer (strided, float64) goes to numpy's argmax."""
    x = np.arange(40, dtype=np.float32) % 7
    for row in (x[::3], x.astype(np.float64), x[::-1]):
        assert hostloop.argmax(row) == int(np.argmax(row))


@C
def test_bad_arguments_are_errors_not_crashes():
    with pytest.raises(ValueError):   # numpy's own error for an empty row
        hostloop.argmax(np.empty(0, np.float32))
    with pytest.raises(TypeError):
        hostloop.argmax_rows(1)
    with pytest.raises(TypeError):
        hostloop.greedy_chain(1, 2, 3)
    with pytest.raises(TypeError):
        hostloop.catch_up_rounds(1, 2, 3)
    with pytest.raises(TypeError, match="then"):   # a verify to run after the chain, not a tuple of six
        hostloop.catch_up_chain(*[None] * 18, (1, 2))
    with pytest.raises(ValueError):   # a row of another type, or too short for its output
        hostloop.normed_state(np.empty(4, np.float32), np.ones(4, np.float64), 1, 1e-5)
    with pytest.raises(ValueError):
        hostloop.normed_state(np.empty(3, np.float32), np.ones(4, np.float32), np.ones(4, np.float32).ctypes.data, 1e-5)


@C
def test_a_greedy_chain_in_c_drafts_what_the_python_loop_drafts(smollm2, monkeypatch):
    """A fixed EAGLE chain of 4 through a greedy generation: every chain's drafts and the output
    with the C loop, then with the whole host loop in numpy (argmax, states, the layer inputs,
    the catch-up's encode and decode, the Python chain). The last prompt's first catch-up is
    longer than the drafter's batch: C sends it in the chunks the Python path sends."""
    prompts = ["Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox",
               "Write a short poem about the sea.",
               "Summarize: " + " ".join(f"Item {i} is a {c} box on shelf {i % 7}." for i, c in
                                        zip(range(14), ["red", "blue", "green"] * 5))]
    rows = []
    chain = hostloop.catch_up_chain

    def counted(*args):
        rows.append(len(args[10]))
        return chain(*args)
    with Engine(smollm2, DRAFTER, n_ctx=512) as eng:
        with monkeypatch.context() as m:
            m.setattr(hostloop, "catch_up_chain", counted)
            in_c = [chain_drafts(eng, p, 48) for p in prompts]   # a catch-up and its chain in one call
        assert max(rows) > 2 * eng.drafter.ctx.n_batch and min(rows) <= ALL_OUTPUT_ROWS
        with monkeypatch.context() as m:
            m.setattr(hostloop, "catch_up_chain", None)        # the catch-up's call, then the chain's
            assert [chain_drafts(eng, p, 48) for p in prompts] == in_c
        for name in ("greedy_chain", "normed_state", "argmax_ith", "catch_up", "catch_up_chain", "gather_rows"):
            monkeypatch.setattr(hostloop, name, None)
        in_numpy = [chain_drafts(eng, p, 48) for p in prompts]
    assert in_c == in_numpy
    assert sum(len(d) for drafts, _ in in_c for _, d in drafts) > 20


@C
def test_slots_greedy_chains_in_c_draft_what_their_python_rounds_draft(smollm2, monkeypatch):
    """Three slots with fixed EAGLE chains of 4: every slot's catch-up and chain in one C call a
    step (catch_up_rounds), or its chain's steps after the first draft in one (greedy_rounds),
    give every slot the drafts, accepted drafts and output that the scheduler's Python rounds
    give (the same rows decoded, round by round)."""
    from localspec import GenerationConfig
    from localspec.speculation.policy import PolicyConfig
    from engine_checks import Collect, drain

    prompts = ["Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox",
               "Write a short poem about the sea.", "Count: 1, 2, 3, 4, 5, 6,"]
    config = GenerationConfig(max_tokens=40, policy=PolicyConfig("fixed", 4, source="eagle", tree="off"))
    calls: dict[str, list[int]] = {"catch_up_rounds": [], "greedy_rounds": []}

    def counted(name: str, chains_at: int):
        fn = getattr(hostloop, name)

        def call(*args):
            calls[name].append(len(args[chains_at]))
            return fn(*args)
        return call

    def slots() -> dict:
        with Engine(smollm2, DRAFTER, n_ctx=256, parallel=3) as eng:
            sinks = {p: Collect() for p in prompts}
            drain(eng.scheduler(), [(p, config, sinks[p]) for p in prompts], prepare=eng.prepare)
        return {p: (sinks[p].done.tokens, sinks[p].done.stats.sources) for p in prompts}

    monkeypatch.setattr(hostloop, "catch_up_rounds", counted("catch_up_rounds", 12))
    fused = slots()
    assert calls["catch_up_rounds"] and max(calls["catch_up_rounds"]) >= 2   # several chains in one call
    monkeypatch.setattr(hostloop, "catch_up_rounds", None)
    monkeypatch.setattr(hostloop, "greedy_rounds", counted("greedy_rounds", 7))
    assert slots() == fused
    assert calls["greedy_rounds"] and max(calls["greedy_rounds"]) >= 2
    monkeypatch.setattr(hostloop, "greedy_rounds", None)
    assert slots() == fused
    assert sum(sources.get("eagle", (0, 0, 0))[2] for _, sources in fused.values()) > 0


@C
def test_the_target_s_layer_inputs_are_numpy_s(smollm2, monkeypatch):
    """llama_ext.layer_inputs in one C call (gather_rows) against its numpy path: every row, a
    chain's slice, a tree's path in any order; as they are (bit for bit) and RMS-scaled per block."""
    from localspec.llama import llama_ext

    with Engine(smollm2, DRAFTER, n_ctx=512) as eng:
        d = eng.drafter
        layers, width = d.kind.layers, eng.ctx.model.n_embd
        eng.ctx.seq_rm(0)
        eng.ctx.decode(list(range(100, 112)), 0, all_logits=False)
        asks = [(12, None), (3, [4, 5, 6]), (3, [7, 2, 9]), (1, [11])]
        for eps in (None, 1e-6):
            in_c = [llama_ext.layer_inputs(eng.ctx, layers, width, *eng.ctx.token_rows(n, rows), {}, eps) for n, rows in asks]
            with monkeypatch.context() as m:
                m.setattr(hostloop, "gather_rows", None)
                ref = [llama_ext.layer_inputs(eng.ctx, layers, width, *eng.ctx.token_rows(n, rows), {}, eps) for n, rows in asks]
            for a, b in zip(in_c, ref):
                assert a.shape == b.shape == (a.shape[0], 3 * width)
                if eps is None:
                    assert np.array_equal(a, b)
                else:
                    np.testing.assert_allclose(a, b, rtol=3e-6, atol=1e-7)


@pytest.mark.parametrize("parallel", [1, 4])
def test_the_argmax_of_a_verify_s_rows_is_numpy_s(smollm2, parallel):
    """Context.argmax_rows (one C call for a verify's rows) against numpy's argmax of each row's
    logits, in one KV stream and in one stream per slot (rows sent re-ordered by sequence)."""
    with Engine(smollm2, None, n_ctx=256, parallel=parallel) as eng:
        ctx = eng.ctx
        tokens = list(range(200, 212))
        seqs = [i % parallel for i in range(len(tokens))]
        positions = [i // parallel for i in range(len(tokens))]
        for s in range(parallel):
            ctx.seq_rm(0, seq=s)
        ctx.decode_batch(tokens, positions, seqs, [True] * len(tokens))
        ref = [int(np.argmax(ctx.logits(i))) for i in range(len(tokens))]
        assert ctx.argmax_rows(0, len(tokens)) == ref
        assert ctx.argmax_rows(3, 4) == ref[3:7]
        assert [ctx.argmax(i) for i in range(len(tokens))] == ref
        # a greedy verify's: the rows up to the first whose argmax is not its draft
        assert ctx.argmax_rows(3, 4, ref[3:6]) == ref[3:7]           # every draft agreed: the last is the next token
        assert ctx.argmax_rows(3, 4, [ref[3], ref[4] + 1, ref[5]]) == ref[3:5]
        assert ctx.argmax_rows(3, 4, [ref[3] + 1, ref[4], ref[5]]) == ref[3:4]


@C
def test_a_greedy_verify_drops_the_rejected_drafts_cells(smollm2, monkeypatch):
    """Context.argmax_rows with a trim (a greedy verify): the verify's argmaxes as without it, and in
    the same C call the cells from the first rejected draft's on dropped (or after the drafts, with
    filler rows), as the verifier's seq_rm did; a malformed trim is an error, not a crash."""
    with Engine(smollm2, None, n_ctx=256) as eng:
        ctx = eng.ctx

        def rows() -> list[int]:   # positions 0..11 decoded; the argmax of each
            ctx.seq_rm(0)
            ctx.decode(list(range(200, 212)), 0, all_logits=True)
            return [int(np.argmax(ctx.logits(i))) for i in range(12)]

        ref = rows()   # row r verifies the draft at position r + 1
        assert ctx.argmax_rows(3, 4, [ref[3], ref[4] + 1, ref[5]], trim=(0, 4, False)) == ref[3:5]
        assert ctx.pos_max(0) == 4                     # position 5 held the rejected draft
        rows()
        assert ctx.argmax_rows(3, 4, ref[3:6], trim=(0, 4, False)) == ref[3:7]
        assert ctx.pos_max(0) == 11                    # every draft kept, nothing dropped
        rows()
        assert ctx.argmax_rows(3, 4, ref[3:6], trim=(0, 4, True)) == ref[3:7]
        assert ctx.pos_max(0) == 6                     # the rows after the drafts were filler
        with pytest.raises(TypeError):
            hostloop.argmax_rows(ctx.address, (0,), eng.model.n_vocab, (1,), (ctx.trim_address, 0))
        monkeypatch.setattr(hostloop, "argmax_rows", None)   # numpy's argmaxes, llama.cpp's own seq_rm
        rows()
        assert ctx.argmax_rows(3, 4, [ref[3], ref[4] + 1, ref[5]], trim=(0, 4, False)) == ref[3:5]
        assert ctx.pos_max(0) == 4


@C
@pytest.mark.parametrize("parallel", [1, 4])
def test_several_sequences_rows_in_c_decode_as_through_numpy(smollm2, monkeypatch, parallel):
    """Context.decode_batch fills several sequences' rows in one C call (decode_rows): every
    row's logits are those of the numpy and ctypes fill, in one KV stream and in one per slot;
    after it every row is sequence 0's again (decode() relies on it); a token out of range is an
    OverflowError, never wrapped."""
    tokens = list(range(300, 316))
    seqs = [i % parallel for i in range(len(tokens))]
    positions = [i // parallel for i in range(len(tokens))]
    outputs = [i % 3 != 1 for i in range(len(tokens))]
    rows = [i for i, o in enumerate(outputs) if o]

    def logits(ctx) -> np.ndarray:
        for s in range(parallel):
            ctx.seq_rm(0, seq=s)
        ctx.decode_batch(tokens, positions, seqs, outputs)
        return np.stack([np.array(ctx.logits(i)) for i in rows])

    with Engine(smollm2, None, n_ctx=256, parallel=parallel) as eng:
        ctx = eng.ctx
        in_c = logits(ctx)
        assert all(ctx._batch.seq_id[i][0] == 0 for i in range(len(tokens)))
        with monkeypatch.context() as m:
            m.setattr(ctx, "_run_rows", None)
            np.testing.assert_array_equal(logits(ctx), in_c)
        with pytest.raises(OverflowError):
            ctx.decode_batch([2 ** 32 + 5, 7], [0, 0], [0, parallel - 1], [True, True])
        assert all(ctx._batch.seq_id[i][0] == 0 for i in range(2))


def test_token_texts_and_cells_through_the_host_loop_are_llama_cpp_s(smollm2):
    """Every token's text (one C call for the vocabulary) is llama_token_to_piece's, and the
    cells' calls (seq_rm, seq_pos_max) give what llama.cpp's own give through ctypes."""
    import ctypes
    import llama_cpp
    with Engine(smollm2, None, n_ctx=256) as eng:
        model, ctx = eng.model, eng.ctx
        buf = ctypes.create_string_buffer(256)
        for special in (False, True):
            table = model.pieces(special=special)
            assert len(table) == model.n_vocab
            for token in list(range(0, 40)) + list(range(model.n_vocab - 40, model.n_vocab)) + [model.eos]:
                n = llama_cpp.llama_token_to_piece(model.vocab, token, buf, 256, 0, special)
                assert table[token] == buf.raw[:n], (token, special)
        assert model.piece(model.eos) == b"" and model.special_piece(model.eos) != b""
        with pytest.raises(Exception, match="not in the vocabulary"):
            model.piece(model.n_vocab)
        with pytest.raises((OverflowError, ValueError)):   # never wrapped into another token id
            ctx.decode([2 ** 32 + 5], 0, all_logits=False)
        ctx.decode(list(range(200, 210)), 0, all_logits=False)
        assert ctx.pos_max(0) == 9 == llama_cpp.llama_memory_seq_pos_max(ctx.memory, 0)
        ctx.seq_rm(6)
        assert ctx.pos_max(0) == 5 == llama_cpp.llama_memory_seq_pos_max(ctx.memory, 0)


@C
def test_the_c_catch_up_marks_the_rows_the_drafter_marks():
    """The C catch-up sends a catch-up whole up to the rows whose every output the drafter's
    Python path asks for, and in chunks past them: the two agree on where that is."""
    assert hostloop.ALL_OUTPUT_ROWS == ALL_OUTPUT_ROWS
