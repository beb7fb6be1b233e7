"""Engine(rows_match=True): greedy text identical with and without drafts at 2 threads.

On a CPU a single row past 512 KV cells takes llama.cpp's split-KV attention (its cells divided
among the threads, partial sums reduced) and rounds otherwise than the rows of a verify batch;
at 2 threads greedy lookup drafts then left plain decoding on every summarization prompt of
bench/summarize.jsonl (docs/speculation.md#exactness). With ``rows_match`` a plain step is two rows
and every verify stays under 64 rows, so both take one path. The prompt here is such a prompt
(~390 tokens with the template: the KV view rounds up to 512 cells) and the engine runs on 2
threads, as users run it (the tests' usual 1 thread would hide the effect).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine_checks import run
from localspec import Engine
from localspec.formats.chat_format import Message
from localspec.runtime.batch import Batch
from localspec.runtime.sampling import SamplingParams
from localspec.speculation.policy import PolicyConfig

ROOT = Path(__file__).resolve().parents[1]
GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
N = 96


def long_prompt() -> list[Message]:
    first = json.loads((ROOT / "bench" / "summarize.jsonl").read_text().splitlines()[0])
    return [Message("user", first["prompt"])]


@pytest.fixture(scope="module")
def engine(smollm2):
    with Engine(smollm2, n_ctx=2048, n_threads=2, rows_match=True) as e:
        yield e


def greedy(engine: Engine, prompt, policy: PolicyConfig | None) -> list[int]:
    engine.clear_cache()
    kw = dict(spec=policy is not None, **({"policy": policy} if policy is not None else {}))
    return list(run(engine, prompt, max_tokens=N, sampling=GREEDY, **kw).tokens)


@pytest.fixture(scope="module")
def plain(engine) -> list[int]:
    """Plain decoding's greedy tokens for the long prompt: computed once, the reference of every policy."""
    prompt = long_prompt()
    assert len(engine.prompt_tokens(prompt)) > 256   # past the first 256-cell step of the KV view
    return greedy(engine, prompt, None)


@pytest.mark.parametrize("policy", [PolicyConfig("fixed", 4, source="lookup"), PolicyConfig("auto")],
                         ids=["lookup-chain-4", "auto"])
def test_greedy_drafts_give_plain_decodings_text_at_two_threads(engine, plain, policy):
    assert greedy(engine, long_prompt(), policy) == plain


def test_a_padded_row_equals_the_row_of_a_verify_batch_bit_for_bit(engine):
    """The mechanism itself: a plain step's logits (one row, padded) against the same token's row
    inside a 5-row batch over the same ~400-token context; the filler leaves no cell behind."""
    ctx = engine.ctx
    tokens = engine.prompt_tokens(long_prompt())
    assert engine.calibrator.acquire()   # the engine's background calibration decodes too
    try:
        check_rows(engine, ctx, tokens)
    finally:
        engine.calibrator.release()


def check_rows(engine: Engine, ctx, tokens: list[int]) -> None:
    engine.clear_cache()
    for i in range(0, len(tokens), 256):
        ctx.decode(tokens[i:i + 256], i, all_logits=False)
    nxt = [int(np.argmax(ctx.logits(-1)))]
    rows = []
    for k in range(4):   # four plain steps, as plain decoding takes them
        batch = Batch(ctx, exact=True)   # a batch of an exact generation (rows_match): one row padded
        batch.add(0, [nxt[-1]], len(tokens) + k, all_logits=False)
        batch.decode()
        assert ctx.pos_max(0) == len(tokens) + k   # the filler row is gone
        rows.append(np.array(ctx.logits(0)))
        nxt.append(int(np.argmax(rows[-1])))
    ctx.seq_rm(len(tokens))
    ctx.decode(nxt[:4], len(tokens), all_logits=True)   # the same tokens as one verify batch
    for k in range(4):
        assert np.array_equal(np.array(ctx.logits(k)), rows[k]), f"row {k} differs"



def test_four_slots_of_eagle_chains_keep_plain_decodings_text(smollm2):
    """rows_match with several slots: each slot's rows in its own KV stream. In one pool of cells a
    slot's later rows landed in holes that other slots' rejected drafts left below its earlier
    cells, the one-row attention summed its cells in another order, and 4 slots of fixed EAGLE
    chains left plain decoding's text (here the third chat prompt at its 128th token; with the
    store's Q4_0 target, two copy prompts at their 58th and 86th)."""
    from localspec.core.events import DoneEvent
    from localspec.runtime.bench import load_prompts
    from localspec.runtime.config import GenerationConfig
    from localspec.store.models import DEFAULT_DRAFTER_FILE

    four = [([Message("system", p.system)] if p.system else []) + [Message("user", p.prompt)]
            for p in load_prompts(ROOT / "bench" / "chat.jsonl")[:4]]
    with Engine(smollm2, n_ctx=1024, n_threads=1, rows_match=True) as one:
        alone = []
        for messages in four:
            one.clear_cache()
            alone.append(list(run(one, messages, max_tokens=128, sampling=GREEDY, spec=False).tokens))
    chains = GenerationConfig(max_tokens=128, sampling=GREEDY,
                              policy=PolicyConfig("fixed", 4, source="eagle", tree="off"))
    drafter = ROOT / "localspec" / "data" / DEFAULT_DRAFTER_FILE
    with Engine(smollm2, drafter, n_ctx=1024, parallel=4, n_threads=1, rows_match=True) as multi:
        assert multi.kv_layout == "streams"
        done = {i: e for i, e in multi.batch_generate(four, chains) if isinstance(e, DoneEvent)}
    assert sum(done[i].stats.accepted for i in range(4)) > 0
    assert [list(done[i].tokens) for i in range(4)] == alone
