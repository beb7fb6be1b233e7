"""Speculative sampling keeps the target's distribution: exact rule, then end to end."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from localspec import DoneEvent, Engine, GenerationConfig, PolicyConfig, SamplingParams
from localspec.runtime.sampling import Sampler, distribution
from sampling_checks import SIGMAS, within_binomial_bounds  # noqa: F401
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
    samples: dict[bool, list[tuple[int, ...]]] = {False: [], True: []}
    drafted = accepted = 0
    with Engine(target, drafter, n_ctx=256) as engine:
        for spec in (False, True):
            for seed in range(n):
                cfg = GenerationConfig(max_tokens=6, spec=spec, policy=PolicyConfig("fixed", 2, tree=tree),
                                       sampling=SamplingParams(seed=seed + (0 if spec else 10_000), **params))
                done = [e for e in engine.generate("The quick brown fox", cfg) if isinstance(e, DoneEvent)][0]
                samples[spec].append(tuple(done.tokens))
                if spec:
                    drafted += done.stats.drafted
                    accepted += done.stats.accepted
    assert 0.1 * drafted < accepted < 0.9 * drafted  # both branches of the rule are exercised
    for position in (2, 3, 4, 5):
        plain = Counter(s[position] for s in samples[False] if len(s) > position)
        spec = Counter(s[position] for s in samples[True] if len(s) > position)
        n1, n2 = sum(plain.values()), sum(spec.values())
        assert n1 > 0.9 * n and n2 > 0.9 * n
        for tok in set(plain) | set(spec):
            f1, f2 = plain[tok] / n1, spec[tok] / n2
            pooled = (plain[tok] + spec[tok]) / (n1 + n2)
            sigma = np.sqrt(max(pooled * (1 - pooled), 1e-9) * (1 / n1 + 1 / n2))
            assert abs(f1 - f2) <= SIGMAS * sigma, f"position {position}, token {tok}: {f1:.3f} vs {f2:.3f}"
