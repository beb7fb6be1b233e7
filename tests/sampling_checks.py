"""Frequencies against expected probabilities within binomial bounds, and plain against speculative
sampling end to end (sampling tests)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from localspec import DoneEvent, GenerationConfig, PolicyConfig, SamplingParams

SIGMAS = 5.0  # per-category bound: a fair test fails by chance with probability ~1e-6 per category


def within_binomial_bounds(counts: Counter, n: int, expected: dict[int, float]) -> None:
    for tok, p in expected.items():
        f = counts.get(tok, 0) / n
        sigma = max(np.sqrt(p * (1 - p) / n), 1e-9)
        assert abs(f - p) <= SIGMAS * sigma + 1e-12, f"token {tok}: frequency {f:.4f}, expected {p:.4f}"
    assert set(counts) <= set(expected), "sampled a token outside the filtered distribution"


def plain_and_speculative_samples(engine, params: dict, n: int,
                                  tree: str = "off") -> tuple[dict[bool, list[tuple[int, ...]]], int, int]:
    """``n`` seeded generations of 6 tokens after "The quick brown fox" with sampling ``params``, plain
    (``samples[False]``) and speculative with a fixed policy drafting 2 (``samples[True]``, other
    seeds); and what the speculative ones drafted and accepted."""
    samples: dict[bool, list[tuple[int, ...]]] = {False: [], True: []}
    drafted = accepted = 0
    for spec in (False, True):
        for seed in range(n):
            cfg = GenerationConfig(max_tokens=6, spec=spec, policy=PolicyConfig("fixed", 2, tree=tree),
                                   sampling=SamplingParams(seed=seed + (0 if spec else 10_000), **params))
            done = [e for e in engine.generate("The quick brown fox", cfg) if isinstance(e, DoneEvent)][0]
            samples[spec].append(tuple(done.tokens))
            if spec:
                drafted += done.stats.drafted
                accepted += done.stats.accepted
    return samples, drafted, accepted


def assert_same_marginals(samples: dict[bool, list[tuple[int, ...]]], n: int) -> None:
    """Generated tokens 3..6: each token's frequency, plain vs speculative, within SIGMAS of a
    two-proportion test (the rejection rule keeps the target's distribution)."""
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


def assert_drafts_keep_the_distribution(engine, params: dict, n: int = 250) -> None:
    """Sampled with drafts, each generated token follows the target's own distribution, plain vs
    drafted (:func:`assert_same_marginals`), with drafts both accepted and rejected (both branches
    of the rejection rule ran)."""
    samples, drafted, accepted = plain_and_speculative_samples(engine, params, n)
    assert 0.1 * drafted < accepted < 0.9 * drafted, (drafted, accepted)
    assert_same_marginals(samples, n)
