"""Frequencies against expected probabilities within binomial bounds (sampling tests)."""

from __future__ import annotations

from collections import Counter

import numpy as np

SIGMAS = 5.0  # per-category bound: a fair test fails by chance with probability ~1e-6 per category


def within_binomial_bounds(counts: Counter, n: int, expected: dict[int, float]) -> None:
    for tok, p in expected.items():
        f = counts.get(tok, 0) / n
        sigma = max(np.sqrt(p * (1 - p) / n), 1e-9)
        assert abs(f - p) <= SIGMAS * sigma + 1e-12, f"token {tok}: frequency {f:.4f}, expected {p:.4f}"
    assert set(counts) <= set(expected), "sampled a token outside the filtered distribution"
