"""The generation loop: prefill, then cycles of draft, verify, commit, emit; a stream of events.

Each cycle the policy picks a draft source and depth (or none) from the cost model and live
acceptance (:class:`~localspec.runtime.drafting.DraftStep`), the target verifies ``[last, d1..dk]``
(or a draft tree) in ONE decode and commits the longest accepted prefix plus its own next token
(:class:`~localspec.runtime.verifier.TargetVerifier`), the sources learn from the outcome, and
:class:`~localspec.runtime.text_stream.TokenOutput` turns the committed tokens into TokenEvents and
says when to stop. With no draft source the same loop is plain decoding.

``tick`` runs between cycles (the engine's thread-count controller) and counts as generation time.
Observers (``after_prefill(ctx, sampler)``, ``after_verify(ctx, sampler, verified)``) read the
target's logits before the sampler moves on, for measurement such as bench's logit margins
(:mod:`localspec.runtime.margins`); their time after the prompt is not counted as generation time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence

from ..core.events import CycleEvent, DoneEvent, Event, GenerationStats
from ..speculation import tree
from ..speculation.eagle import EagleDrafter
from ..speculation.lookup import NgramLookup
from ..speculation.prediction import PredictionSource, prediction_tokens_used
from ..speculation.policy import EAGLE, DraftPolicy
from ..llama.grammar import Grammar
from .config import GenerationConfig
from .drafting import DraftStep
from .logprobs import LogprobRecorder
from .sampling import Sampler
from .text_stream import TokenOutput
from .verifier import TargetVerifier, Verified


class GenerationObserver(Protocol):
    def after_prefill(self, ctx, sampler: Sampler) -> None: ...

    def after_verify(self, ctx, sampler: Sampler, verified: Verified) -> None: ...


@dataclass(frozen=True)
class _Cycle:
    drafted: int
    accepted: int
    source: str | None


_PLAIN = _Cycle(0, 0, None)


class GenerationLoop:
    """One generation; :meth:`run` yields its events."""

    def __init__(self, verifier: TargetVerifier, prompt: list[int], config: GenerationConfig, policy: DraftPolicy,
                 drafter: EagleDrafter | None, calibration: tree.Calibration, *,
                 observers: Sequence[GenerationObserver] = (), tick: Callable[[], None] | None = None,
                 cancel: threading.Event | None = None) -> None:
        self.verifier = verifier
        self.prompt = prompt
        self.config = config
        self.policy = policy
        self.drafter = drafter                    # None when this generation does not draft with it
        self.calibration = calibration
        self.observers = list(observers)
        self.tick = tick
        self.cancel = cancel
        grammar = (Grammar(verifier.model, config.grammar, config.grammar_triggers)
                   if config.grammar is not None else None)
        self.sampler = Sampler(config.sampling, prompt, grammar)  # the context penalties count, the grammar
        self.stats = GenerationStats(prompt_tokens=len(prompt), spec=policy.active)
        self.output = TokenOutput(verifier.model, config.stop, config.max_tokens)
        self.logprobs = LogprobRecorder(verifier.model, config.logprobs) if config.logprobs is not None else None
        self._pending_logprobs: list | None = None   # those of the tokens the last cycle committed
        self.predicted = (verifier.model.tokenize(config.prediction, add_special=False, parse_special=False)
                          if config.prediction is not None else None)    # Predicted Outputs' tokens
        self.drafting: DraftStep | None = None
        self.finish: str | None = None
        self._t_gen = 0.0
        self._drafter_t0 = 0.0

    def run(self) -> Iterator[Event]:
        try:
            yield from self._run()
        finally:
            self.sampler.close()

    def _run(self) -> Iterator[Event]:
        pending = self._start()
        cycle: _Cycle | None = None
        while True:
            before = len(self.output.tokens)
            yield from self.output.emit(pending, self._pending_logprobs)
            self._clock()
            if cycle is not None:
                yield CycleEvent(cycle.drafted, cycle.accepted, len(self.output.tokens) - before,
                                 self.stats.snapshot(), cycle.source)
            if self._finished():
                break
            if self.tick is not None:
                self.tick()
            pending, cycle = self._cycle()
        yield from self.output.close()
        self.stats.generation_seconds = time.perf_counter() - self._t_gen
        self.stats.policy_choices = dict(self.policy.choices)
        if self.predicted is not None:
            (self.stats.accepted_prediction_tokens,
             self.stats.rejected_prediction_tokens) = prediction_tokens_used(self.predicted, self.output.tokens)
        yield DoneEvent(self.output.text, self.output.tokens, self.finish, self.stats.snapshot(),
                        logprobs=self.output.logprobs if self.logprobs is not None else None)

    def _start(self) -> list[tuple[int, bool]]:
        """Prefill (reusing the cached prefix); the first token, chosen from the prompt's logits."""
        t_start = time.perf_counter()
        first = self.verifier.prefill(self.prompt, self.sampler, self.drafter)
        self._record_logprobs([first], [-1])
        for observer in self.observers:
            observer.after_prefill(self.verifier.ctx, self.sampler)
        self.sampler.commit([first])
        lookup = NgramLookup(self.prompt + [first]) if self.policy.lookup else None
        prediction = None
        if lookup is not None and self.predicted:
            prediction = PredictionSource(self.predicted)
            prediction.extend([first])
        self.drafting = DraftStep(self.policy, self.drafter, lookup, self.calibration, self.config.policy.draft_max,
                                  self.sampler.grammar, prediction)
        self.stats.prompt_seconds = time.perf_counter() - t_start
        self._t_gen = time.perf_counter()
        self._drafter_t0 = self.drafter.seconds if self.drafter else 0.0
        return [(first, False)]

    def _clock(self) -> None:
        stats = self.stats
        stats.generated_tokens = len(self.output.tokens)
        stats.generation_seconds = time.perf_counter() - self._t_gen
        if self.drafter:
            stats.drafter_seconds = self.drafter.seconds - self._drafter_t0

    def _finished(self) -> bool:
        finish = self.output.finish
        if finish is None and self.cancel is not None and self.cancel.is_set():
            finish = "cancelled"
        if finish is None and self.verifier.n_past >= self.verifier.ctx.n_ctx:
            finish = "context"
        self.finish = finish
        return finish is not None

    def _cycle(self) -> tuple[list[tuple[int, bool]], _Cycle]:
        """Draft, verify in one target batch, commit: the committed tokens and the cycle's counts."""
        t_cycle = time.perf_counter()
        verifier, policy = self.verifier, self.policy
        draft = self.drafting.draft(min(verifier.room(), self.output.remaining - 1), verifier.n_past)
        if draft.source is None and not self.observers and not verifier.uncached:
            return self._plain_step(t_cycle)
        if draft.tree is not None:
            v = verifier.verify_tree(draft.tree, self.sampler)
        else:
            rows = policy.verify_rows(len(draft.tokens) + 1) if draft.tokens else 1
            v = verifier.verify(draft.tokens, self.sampler, rows=rows)
        self.stats.record_verify(v.batch, v.seconds)
        self._record_logprobs(v.tokens, v.logit_rows)
        t_cycle += self._observe(v)
        self.drafting.record(draft, v)
        self.sampler.commit(v.tokens)
        if draft.source == EAGLE and not draft.tokens:
            policy.eagle_declined()
        source = draft.source if v.drafted else None
        depth = draft.tree.depth if draft.tree is not None else None
        self.stats.record_cycle(v.drafted, v.accepted, source, depth=depth)
        policy.observe(source, v.drafted, v.accepted, verify_seconds=v.seconds, drafter_seconds=draft.seconds,
                       cycle_seconds=time.perf_counter() - t_cycle, drafter_steps=draft.steps, depth=depth,
                       batch=v.batch)
        return [(d, True) for d in v.drafts] + [(v.correction, False)], _Cycle(v.drafted, v.accepted, source)

    def _plain_step(self, t_cycle: float) -> tuple[list[tuple[int, bool]], _Cycle]:
        """A cycle that drafts nothing, kept lean (most cycles of most text): the same outcome
        and bookkeeping as verifying no drafts, without building a verification record."""
        verifier = self.verifier
        pos = verifier.n_past
        tok, seconds = verifier.step(self.sampler)
        self.stats.record_verify(1, seconds)
        self._record_logprobs([tok], [-1])
        self.drafting.commit([tok], pos, [0])
        self.sampler.commit((tok,))
        self.stats.record_cycle(0, 0)
        self.policy.observe(None, 0, 0, verify_seconds=seconds, drafter_seconds=0.0,
                            cycle_seconds=time.perf_counter() - t_cycle, batch=1)
        return [(tok, False)], _PLAIN

    def _record_logprobs(self, tokens: list[int], rows: list[int]) -> None:
        """The committed tokens' log-probabilities, from the rows that chose them (before the next decode)."""
        if self.logprobs is not None:
            self._pending_logprobs = self.logprobs.rows(self.verifier.ctx, tokens, rows)

    def _observe(self, verified: Verified) -> float:
        """Run the observers; their seconds, which do not count as generation time."""
        if not self.observers:
            return 0.0
        t0 = time.perf_counter()
        for observer in self.observers:
            observer.after_verify(self.verifier.ctx, self.sampler, verified)
        spent = time.perf_counter() - t0
        self._t_gen += spent
        return spent
