"""Shared engine checks: the prompt set, one generation to its DoneEvent, and losslessness up to a
numerical near-tie, the slots' helpers (a sink that collects, a scheduler drained), and a fixed
EAGLE chain's drafts through a generation. Used by test_engine, test_speculation, test_tree,
test_penalties, test_slots, test_mtp, test_direct_rows and test_hostloop."""

from __future__ import annotations

from pathlib import Path

from localspec import DoneEvent, Engine, GenerationConfig
from localspec.core.events import TokenEvent
from localspec.runtime.scheduler import Scheduler

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


class Collect:
    """A slot's sink: its events in order."""

    def __init__(self) -> None:
        self.events = []

    def __call__(self, event) -> None:
        self.events.append(event)

    @property
    def done(self) -> DoneEvent | None:
        return next((e for e in self.events if isinstance(e, DoneEvent)), None)

    @property
    def n_tokens(self) -> int:
        return sum(1 for e in self.events if isinstance(e, TokenEvent) and e.token >= 0)


def solo(path, prompts, n_ctx=512, **kw) -> dict:
    """Each prompt alone on a fresh cache, greedy, with logit margins (near-ties)."""
    with Engine(path, n_ctx=n_ctx) as engine:
        out = {}
        for p in prompts:
            engine.clear_cache()
            out[p] = run(engine, p, spec=False, record_margins=True, **kw)
        return out


def drain(scheduler: Scheduler, queue=(), admit=None, prepare=None) -> int:
    """Step until every slot is free and ``queue`` (prompt, config, sink) is admitted, each prompt
    made token ids with ``prepare`` (``Engine.prepare``); steps taken."""
    queue, steps = list(queue), 0
    while queue or scheduler.active:
        while queue and scheduler.free:
            prompt, config, sink = queue.pop(0)
            scheduler.admit(prepare(prompt), config, None, sink)
        scheduler.step()
        steps += 1
    return steps


# a CPU-like verify curve (seconds by batch size) at the calibration's sizes (as in test_costmodel)
CPU_CURVE = {1: 0.005, 2: 0.0087, 3: 0.0105, 4: 0.010, 5: 0.016, 6: 0.018, 7: 0.016, 8: 0.014, 9: 0.015,
             12: 0.019, 16: 0.022, 24: 0.032, 32: 0.040, 48: 0.058, 64: 0.075, 96: 0.110, 128: 0.145}


def seed_calibration(cache: Path, key: str) -> None:
    """A calibration under ``key`` (an Engine.cost_key) in ``cache``, as an earlier run leaves it: an
    engine of that key reads it at load and calibrates nothing in the background. For tests that are
    not about the calibration: one takes the engine's threads for up to cost_measure.BUDGET_SECONDS
    whenever the engine is idle, away from the other test worker (xdist)."""
    from localspec.speculation.cost_cache import write_entry

    write_entry(cache, key, {"verify": {str(b): sec for b, sec in CPU_CURVE.items()},
                             "drafter_step": 0.002, "drafter_width": None})


def assert_slots_lossless(target, drafter, prompts, config: GenerationConfig, source: str, *, n_ctx: int = 256,
                          rounds: int = 1, on_engine=None) -> None:
    """The prompts in the slots of one engine (one per prompt), drafting with ``config``: each
    answer is the one the prompt gets alone (plain decoding, a fresh cache), round after round
    (a later round reuses or refills each slot's cache), and ``source`` drafted tokens that were
    accepted. ``on_engine``: a check of the engine before the rounds."""
    alone = solo(target, prompts, n_ctx=n_ctx, max_tokens=config.max_tokens)
    with Engine(target, drafter, n_ctx=n_ctx, parallel=len(prompts)) as engine:
        if on_engine is not None:
            on_engine(engine)
        for _ in range(rounds):
            sinks = {p: Collect() for p in prompts}
            drain(engine.scheduler(), [(p, config, sinks[p]) for p in prompts], prepare=engine.prepare)
            for p in prompts:
                assert_lossless(alone[p], sinks[p].done)
    assert sum(sinks[p].done.stats.sources.get(source, [0, 0, 0])[1] for p in prompts) > 0, \
        [sinks[p].done.stats.sources for p in prompts]


def prefill(engine: Engine, prompt: list[int], sampler, drafter=None) -> int:
    """``prompt`` into sequence 0 as a generation's steps put it there (the verifier's chunks in a
    step's batch, one decode each; ``drafter`` records the rows); the first token chosen."""
    from localspec.runtime.batch import Batch

    verifier, first = engine.verifier, -1
    verifier.begin(prompt, drafter)
    while first < 0:
        batch = Batch(engine.ctx)
        tokens, pos = verifier.prefill_chunk(batch.rows_left())
        offset = batch.add(verifier.seq, tokens, pos, all_logits=False)
        batch.decode()
        first = verifier.prefill_done(len(tokens), sampler, offset)
    return first


def chain_drafts(eng, prompt: str, n: int) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """The drafts of a fixed EAGLE chain of 4 during a greedy generation (each with the chain's
    ``k``: 4, or the room left near the end), and its output."""
    from localspec.runtime.config import GenerationConfig as Config
    from localspec.runtime.sampling import SamplingParams
    from localspec.speculation.model_source import EagleSource
    from localspec.speculation.policy import PolicyConfig

    drafts, propose = [], EagleSource.propose

    def recorded(self, k, *args, **kw):
        draft = propose(self, k, *args, **kw)
        drafts.append((k, draft))   # a planned chain's tokens are drafted in the step's run phase: read after
        return draft

    EagleSource.propose = recorded
    try:
        eng.clear_cache()
        cfg = Config(max_tokens=n, sampling=SamplingParams(temperature=0.0),
                     policy=PolicyConfig("fixed", 4, tree="off", source="eagle", p_min=0.0))
        done = [e for e in eng.generate(prompt, cfg) if isinstance(e, DoneEvent)][0]
    finally:
        EagleSource.propose = propose
    return [(k, list(draft.tokens)) for k, draft in drafts], list(done.tokens)
