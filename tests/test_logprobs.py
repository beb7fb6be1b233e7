"""Logprobs: the target's raw log-softmax at each emitted token, from the rows the generation
already has; the same with and without speculation (chain, tree, lookup), on tokens and DoneEvent."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localspec import DoneEvent, Engine, GenerationConfig, TokenEvent
from localspec.runtime.sampling import SamplingParams
from localspec.speculation.policy import PolicyConfig

from engine_checks import PROMPTS
from tiny_models import noisy_and_repeat

POLICIES = [PolicyConfig("fixed", 6, source="lookup"), PolicyConfig("fixed", 4, source="eagle"),
            PolicyConfig("fixed", 4, source="eagle", tree="on", tree_width=3, tree_nodes=12)]
COPY = "a b c d e f g a b c d e f g a b c"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return noisy_and_repeat(tmp_path_factory.mktemp("logprobs"))


def events(engine, prompt, **kw) -> tuple[list[TokenEvent], DoneEvent]:
    out = list(engine.generate(prompt, GenerationConfig(**kw)))
    return [e for e in out if isinstance(e, TokenEvent)], out[-1]


def test_logprobs_are_the_raw_log_softmax_and_spell_the_text(tiny):
    with Engine(tiny["noisy"], n_ctx=1024) as engine:
        toks, done = events(engine, PROMPTS[0], max_tokens=12, spec=False, logprobs=3)
        model = engine.model
        # recompute the first token's distribution with a plain decode of the prompt
        engine.clear_cache()
        prompt = engine.prompt_tokens(PROMPTS[0])
        engine.ctx.seq_rm(0)
        engine.ctx.decode(prompt, 0, all_logits=False)
        row = engine.ctx.logits(-1).astype(np.float64)
        engine.verifier.forget()
    ref = row - (row.max() + math.log(np.exp(row - row.max()).sum()))
    first = done.logprobs[0]
    assert first.token == done.tokens[0] and abs(first.logprob - ref[first.token]) < 1e-4
    assert [t.token for t in first.top] == list(np.argsort(-ref, kind="stable")[:3])
    assert all(abs(t.logprob - ref[t.token]) < 1e-4 for t in first.top)
    assert len(done.logprobs) == len(done.tokens)
    assert [lp.token for lp in done.logprobs] == done.tokens
    assert b"".join(lp.bytes for lp in done.logprobs) == b"".join(model.piece(t) for t in done.tokens)
    assert [e.logprobs for e in toks if e.token >= 0] == [(lp,) for lp in done.logprobs]
    for lp in done.logprobs:
        assert len(lp.top) == 3 and lp.logprob <= 0.0
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        assert lp.top[0].logprob >= lp.logprob - 1e-9     # greedy: the chosen token is the top one


def test_logprobs_are_the_same_with_and_without_speculation(tiny):
    with Engine(tiny["noisy"], tiny["d_repeat"], n_ctx=1024) as engine:
        for prompt in PROMPTS[:4] + [COPY]:
            _, plain = events(engine, prompt, max_tokens=32, spec=False, logprobs=5)
            for policy in POLICIES:
                _, spec = events(engine, prompt, max_tokens=32, logprobs=5, policy=policy)
                assert spec.tokens == plain.tokens
                for a, b in zip(plain.logprobs, spec.logprobs):
                    assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-3
                    assert_same_alternatives(a.top, b.top)


def assert_same_alternatives(a, b, tol=1e-3):
    """The same top alternatives, rank by rank within ``tol``; two tokens may trade places only at a
    near-tie (batched rows round differently from one-row decoding on some CPUs: an AVX2-only EPYC
    reordered two alternatives 4e-5 apart at 1 thread), or drop out at the cut-off at one."""
    assert len(a) == len(b)
    assert all(abs(x.logprob - y.logprob) < tol for x, y in zip(a, b)), (a, b)
    in_a = {t.token: t.logprob for t in a}
    for rank, y in enumerate(b):
        if y.token != a[rank].token:
            assert (y.token in in_a and abs(in_a[y.token] - y.logprob) < tol) or \
                abs(a[-1].logprob - y.logprob) < tol, (rank, a, b)


def test_no_logprobs_unless_asked_and_zero_alternatives(tiny):
    with Engine(tiny["repeat"], n_ctx=512) as engine:
        toks, done = events(engine, COPY, max_tokens=6)
        assert done.logprobs is None and all(e.logprobs == () for e in toks)
        _, done = events(engine, COPY, max_tokens=6, logprobs=0,
                         sampling=SamplingParams(temperature=0.7, seed=1))
        assert len(done.logprobs) == len(done.tokens) and all(lp.top == () for lp in done.logprobs)


def test_smollm2_logprobs_with_the_shipped_drafter_match_plain_decoding(smollm2):
    from pathlib import Path
    drafter = Path(__file__).resolve().parents[1] / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"
    msgs = [{"role": "user", "content": "List three fruits."}]
    with Engine(smollm2, drafter, n_ctx=1024) as engine:
        engine.clear_cache()
        _, plain = events(engine, msgs, max_tokens=40, spec=False, logprobs=3)
        for policy in (PolicyConfig("fixed", 4, source="eagle", tree="off"),
                       PolicyConfig("fixed", 4, source="eagle", tree="on"), PolicyConfig("fixed", 6, source="lookup")):
            engine.clear_cache()
            _, spec = events(engine, msgs, max_tokens=40, logprobs=3, policy=policy)
            assert spec.stats.drafted > 0
            n = next((i for i, (a, b) in enumerate(zip(plain.tokens, spec.tokens)) if a != b), len(plain.tokens))
            assert n > 20                       # same text (up to a near-tie late on)
            for a, b in zip(plain.logprobs[:n], spec.logprobs[:n]):
                assert abs(a.logprob - b.logprob) < 1e-3
                assert all(abs(x.logprob - y.logprob) < 1e-3 for x, y in zip(a.top, b.top))
    assert "".join(lp.text for lp in plain.logprobs) == plain.text
