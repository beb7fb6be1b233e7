"""Speculative sampling keeps the target's distribution: exact rule, then end to end."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from localspec import DoneEvent, Engine, GenerationConfig, SamplingParams
from localspec.runtime.sampling import Sampler, distribution
from sampling_checks import SIGMAS, assert_same_marginals, plain_and_speculative_samples, within_binomial_bounds
from tiny_models import build_drafter, build_target

def test_distribution_filters_in_llama_cpp_order():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], dtype=np.float32))
    ids, probs = distribution(logits, SamplingParams(temperature=1.0, top_k=4, top_p=1.0, min_p=0.0))
    assert list(ids) == [0, 1, 2, 3]
    assert probs.sum() == pytest.approx(1.0)
    assert probs[0] / probs[1] == pytest.approx(2.5, rel=1e-5)
    ids, _ = distribution(logits, SamplingParams(temperature=1.0, top_k=0, top_p=0.8, min_p=0.0))
    assert list(ids) == [0, 1, 2]            # cumulative 0.5, 0.7, 0.85 >= 0.8
    ids, _ = distribution(logits, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.25))
    assert list(ids) == [0, 1, 2]            # >= 0.25 * 0.5
    _, hot = distribution(logits, SamplingParams(temperature=2.0, top_k=0, top_p=1.0, min_p=0.0))
    assert hot[0] / hot[1] == pytest.approx(2.5 ** 0.5, rel=1e-5)


@pytest.mark.parametrize("draft", [0, 2, 4, 7])  # likely, unlikely, filtered out by top-k, outside
def test_rejection_rule_emits_exactly_the_target_distribution(draft):
    rng = np.random.default_rng(1)
    logits = rng.normal(size=8).astype(np.float32) * 1.5
    params = SamplingParams(temperature=0.9, top_k=6, top_p=0.97, min_p=0.0, seed=123)
    ids, probs = distribution(logits, params)
    expected = dict(zip(ids.tolist(), probs.tolist()))
    sampler = Sampler(params)
    n = 40000
    counts = Counter(sampler.verify(logits, draft)[1] for _ in range(n))
    within_binomial_bounds(counts, n, expected)
    accepted = sum(sampler.verify(logits, draft)[0] for _ in range(n)) / n
    p_draft = expected.get(draft, 0.0)
    assert abs(accepted - p_draft) <= SIGMAS * np.sqrt(max(p_draft * (1 - p_draft), 1e-9) / n) + 1e-12


def test_seeded_sampling_is_reproducible(tmp_path):
    target = build_target(tmp_path / "t.gguf", "random")
    with Engine(target, n_ctx=256) as engine:
        cfg = GenerationConfig(max_tokens=20, sampling=SamplingParams(temperature=1.0, seed=7))
        a = [e for e in engine.generate("Hello", cfg) if isinstance(e, DoneEvent)][0].tokens
        b = [e for e in engine.generate("Hello", cfg) if isinstance(e, DoneEvent)][0].tokens
    assert a == b


@pytest.mark.parametrize("tree", ["off", "on"])
def test_speculative_sampling_matches_plain_sampling_end_to_end(tmp_path, tree):
    """Marginal distributions of generated tokens 3..6, plain vs speculative, over many seeds.

    The noisy target repeats its last token often but not always, and the repeat drafter proposes
    that repetition, so drafts are both accepted and rejected (and resampled) at those positions;
    with ``tree`` on, drafts are trees of the drafter's top tokens (speculation.tree)."""
    target = build_target(tmp_path / "t.gguf", "noisy", noise=0.006)
    drafter = build_drafter(tmp_path / "d.gguf", target, "repeat")
    params = dict(temperature=0.4, top_k=8, top_p=1.0, min_p=0.0)
    n = 300
    with Engine(target, drafter, n_ctx=256) as engine:
        samples, drafted, accepted = plain_and_speculative_samples(engine, params, n, tree)
    assert 0.1 * drafted < accepted < 0.9 * drafted  # both branches of the rule are exercised
    assert_same_marginals(samples, n)
