"""Shared engine checks: the prompt set, one generation to its DoneEvent, and losslessness up to a
numerical near-tie. Used by test_engine, test_speculation, test_tree and test_penalties."""

from __future__ import annotations

from localspec import DoneEvent, Engine, GenerationConfig

PROMPTS = [
    "Hello world, this is",
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):",
    "1, 2, 3, 4, 5,",
    "Once upon a time",
    "Translate to French: good morning",
    "SELECT * FROM users WHERE",
    "Les feux de la Saint-Jean",
]
NEAR_TIE = 1e-3  # logit gap under which batched and one-token kernels may pick differently


def run(engine: Engine, prompt, **kw) -> DoneEvent:
    done = None
    for event in engine.generate(prompt, GenerationConfig(**kw)):
        if isinstance(event, DoneEvent):
            done = event
    assert done is not None
    return done


def assert_lossless(plain: DoneEvent, spec: DoneEvent) -> None:
    """Token-identical, or the first difference sits at a numerical near-tie of plain decoding."""
    a, b = plain.tokens, spec.tokens
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            assert plain.margins[i] < NEAR_TIE, f"diverged at {i} with a clear gap {plain.margins[i]:.4f}"
            return
    assert len(a) == len(b)


def propose(lookup, k: int) -> tuple[list[int], int]:
    """A lookup's proposal of up to ``k`` tokens and its match length ((``[]``, 0): no match), as
    the engine's draft step builds it: ``find``, then ``continuation``."""
    start, n = lookup.find()
    return (lookup.continuation(start, k), n) if n and k > 0 else ([], 0)
