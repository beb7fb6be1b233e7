"""The target's KV layout with several slots (runtime.kv_layout, llama.stream_rows; issue 45).

With one KV stream per slot a batch goes to llama.cpp sorted by sequence (a micro-batch takes one
run of consecutive sequence ids), and every row is read back under its caller's number: its logits
and its target layer inputs (what the EAGLE and block drafters read) must be those of the same
rows decoded in one unified pool, row for row.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from localspec.core.errors import LocalspecError
from localspec.llama import llama_ext
from localspec.runtime.kv_layout import choose as kv_layout
from localspec.llama.llama_model import Context, Model
from localspec.llama.stream_rows import arrange, inverse
from localspec.runtime.engine import Engine
from localspec.store.models import default_model

LAYERS = (1, 10, 20)


def test_rows_go_in_sorted_by_sequence_and_keep_their_order_within_one():
    assert arrange([0, 1, 2, 3]) is None
    assert arrange([0, 0, 1, 3]) is None
    sent = arrange([3, 2, 2, 0, 2, 1])
    assert sent == [3, 5, 1, 2, 4, 0]
    assert [[3, 2, 2, 0, 2, 1][i] for i in sent] == [0, 1, 2, 2, 2, 3]
    assert inverse(sent) == [5, 2, 3, 0, 4, 1]


def test_auto_takes_streams_for_several_slots_and_the_pool_where_the_engine_relies_on_it():
    assert kv_layout("auto", 4) == "streams"
    assert kv_layout("auto", 1) == "unified"
    assert kv_layout("auto", 4, shared_kv=True) == "unified"
    assert kv_layout("unified", 4) == "unified"
    with pytest.raises(LocalspecError, match="assistant"):
        kv_layout("streams", 4, shared_kv=True)
    with pytest.raises(LocalspecError, match="unknown KV layout"):
        kv_layout("pool", 4)


@pytest.fixture(scope="module")
def pair():
    spec = default_model()   # the embedded SmolLM2-135M Q4_0 and its EAGLE-3.1 drafter
    return spec.target, spec.drafter


@pytest.fixture(scope="module")
def model(pair):
    m = Model(pair[0])
    yield m
    m.close()


def _context(model, unified: bool) -> Context:
    ctx = Context(model, n_ctx=4 * 256, n_seq_max=4, kv_unified=unified, n_threads=1)
    for layer in LAYERS:
        llama_ext.set_embeddings_layer_inp(ctx.ptr, layer, True)
    return ctx


def test_an_unsorted_batch_reads_back_each_rows_logits_and_layer_inputs_under_its_own_number(model):
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(100, 40000, 9 + 5 * s)] for s in range(4)]
    seqs = [3, 2, 2, 0, 2, 1]                       # slot 2 verifies 3 rows, the others step
    tokens = [int(t) for t in rng.integers(100, 40000, len(seqs))]
    read = {}
    for unified in (True, False):
        ctx = _context(model, unified)
        try:
            for s, p in enumerate(prompts):
                ctx.decode_batch(p, list(range(len(p))), [s] * len(p), [False] * (len(p) - 1) + [True])
            seen = {s: len(p) for s, p in enumerate(prompts)}
            positions = []
            for s in seqs:
                positions.append(seen[s])
                seen[s] += 1
            ctx.decode_batch(tokens, positions, seqs, [True] * len(seqs))
            assert ctx.streams is not unified
            logits = np.stack([np.array(ctx.logits(i)) for i in range(len(seqs))])
            last = np.array(ctx.logits(-1))
            rows = llama_ext.layer_inputs(ctx, LAYERS, model.n_embd, *ctx.token_rows(len(seqs), None), {})
            some = llama_ext.layer_inputs(ctx, LAYERS, model.n_embd, *ctx.token_rows(len(seqs), [4, 0]), {})
            read[unified] = logits, last, rows, some
        finally:
            ctx.close()
    (lu, lastu, fu, su), (ls, lasts, fs, ss) = read[True], read[False]
    np.testing.assert_allclose(ls, lu, rtol=0, atol=1e-3)
    np.testing.assert_allclose(lasts, lu[-1], rtol=0, atol=1e-3)
    np.testing.assert_allclose(fs, fu, rtol=0, atol=1e-3)
    np.testing.assert_allclose(ss, fu[[4, 0]], rtol=0, atol=1e-3)
    assert not np.allclose(fu[0], fu[1], atol=1e-1)   # rows differ: a mix-up would show


def test_an_engine_of_several_slots_decodes_in_streams_and_greedy_batches_match_alone(pair):
    prompts = ["Name three colors.", "What is 2 plus 2?", "Say hello in French.", "Count to five."]
    from localspec.runtime.engine import GenerationConfig
    from localspec.core.events import DoneEvent
    config = GenerationConfig(max_tokens=16)
    with Engine(*pair, n_ctx=512, parallel=4, n_threads=1) as engine:
        assert engine.kv_layout == "streams" and engine.ctx.streams
        together = {i: e.tokens for i, e in engine.batch_generate(
            [[{"role": "user", "content": p}] for p in prompts], config) if isinstance(e, DoneEvent)}
        alone = [next(e for e in engine.generate([{"role": "user", "content": p}], config)
                      if isinstance(e, DoneEvent)).tokens for p in prompts]
    assert [together[i] for i in range(4)] == alone


def test_serve_refuses_an_unknown_kv_layout_naming_the_flag():
    run = subprocess.run([sys.executable, "-m", "localspec", "serve", "--kv-layout", "pool"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2   # a usage error, as every choice of the option table (--policy, --tree)
    said = " ".join(run.stderr.replace("│", " ").split())   # the usage box, its lines joined
    assert "Invalid value for '--kv-layout'" in said and "'auto', 'streams', 'unified'" in said
    assert "Traceback" not in run.stderr
