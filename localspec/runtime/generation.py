"""One generation (one request in one slot): prefill, then cycles of draft, verify, commit, emit.

Each cycle the policy picks a draft source and depth (or none) from the cost model and live
acceptance (:class:`~localspec.runtime.drafting.DraftStep`), the target verifies ``[last, d1..dk]``
(or a draft tree) in ONE decode and commits the longest accepted prefix plus its own next token
(:class:`~localspec.runtime.verifier.TargetVerifier`), the sources learn from the outcome, and
:class:`~localspec.runtime.text_stream.TokenOutput` turns the committed tokens into TokenEvents and
says when to stop. With no draft source the same cycle is plain decoding.

One generation is one slot: each step it adds its rows to a :class:`~localspec.runtime.batch.Batch`
(``plan``: a prompt chunk, ``last``, or ``last`` and a draft chain or tree) and says what they are
in a typed row plan (:class:`PrefillRows`, :class:`StepRow`, :class:`VerifyRows`,
:class:`TreeRows`), the batch is decoded once, and it reads its own rows back (``settle``,
dispatching on the plan's type). It decodes nothing itself: the scheduler
(:mod:`localspec.runtime.scheduler`) is the one driver, one decode per step for all its slots
(``Engine.generate`` is a scheduler of one slot). Its state (prefilling, generating, done) is what
the scheduler's :class:`~localspec.runtime.scheduler.SlotState` follows.

Observers (``after_prefill(ctx, sampler)``, and optionally ``after_verify(ctx, sampler, verified)``)
read the target's logits before the sampler moves on, for measurement such as bench's logit margins
(:mod:`localspec.runtime.margins`); their time after the prompt is not counted as generation time.
Only those with ``after_verify`` cost anything per cycle (a prefill-only probe, as bench's clock,
leaves the cycles as a user's are).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

from ..core.errors import LocalspecError
from ..core.events import CycleEvent, DoneEvent, Event, GenerationStats
from ..speculation import tree
from ..speculation.eagle import EagleDrafter
from ..llama.grammar import Grammar
from ..speculation.lookup import NgramLookup
from ..speculation.policy import DraftPolicy
from ..speculation.prediction import PredictionSource, prediction_tokens_used
from ..speculation.recall import Recall
from .config import GenerationConfig
from .batch import Batch
from .drafting import Draft, DraftChain, DraftStep
from .logprobs import LogprobRecorder
from .sampling import Sampler
from .text_stream import TokenOutput
from .verifier import TargetVerifier, TreeLayout, Verified


class GenerationObserver(Protocol):
    """Reads the target's logits after the prompt; ``after_verify(ctx, sampler, verified)``, where
    the observer has one, after every verification too."""

    def after_prefill(self, ctx, sampler: Sampler) -> None: ...


@dataclass(slots=True)   # made every verified cycle: not frozen (a frozen __init__ is 3x)
class _Cycle:
    drafted: int
    accepted: int
    source: str | None


_PLAIN = _Cycle(0, 0, None)


# -- the row plan: what a generation's rows in this step's batch are (plan -> settle) ----------------
@dataclass(slots=True)
class PrefillRows:
    """A chunk of the prompt: ``n`` rows from batch row ``offset``, logits for the last only."""
    offset: int
    n: int


@dataclass(slots=True)
class StepRow:
    """A plain step: ``last`` alone at batch row ``offset``."""
    offset: int


@dataclass(slots=True)
class VerifyRows:
    """A chain to verify (``uncached + [last] + drafts``, then any filler rows: ``rows`` in all) from ``offset``."""
    offset: int
    draft: Draft
    rows: int


@dataclass(slots=True)
class TreeRows:
    """A draft tree's rows from ``offset``, each in the sequences of the leaves below it
    (:meth:`~localspec.runtime.verifier.TargetVerifier.tree_rows`)."""
    offset: int
    draft: Draft
    layout: TreeLayout


RowPlan = PrefillRows | StepRow | VerifyRows | TreeRows


class Generation:
    """One generation (a request's state, in one slot of the target context): :meth:`plan` adds its rows to a step's
    :class:`~localspec.runtime.batch.Batch`, :meth:`settle` reads them after the batch's one
    decode and queues the events, :meth:`check` ends it when it is due.
    :class:`~localspec.runtime.scheduler.Scheduler` drives it (alone, or with other slots' in the
    same batches)."""

    def __init__(self, verifier: TargetVerifier, prompt: list[int], config: GenerationConfig, policy: DraftPolicy,
                 drafter: EagleDrafter | None, calibration: tree.Calibration, *,
                 observers: Sequence[GenerationObserver] = (), cancel: threading.Event | None = None,
                 recall: Recall | None = None, exact: bool = False) -> None:
        self.verifier = verifier
        self.exact = exact                        # rows_match: its batches keep every row on one path (runtime.batch)
        self.prompt = prompt
        self.config = config
        self.policy = policy
        self.drafter = drafter                    # None when this generation does not draft with it
        self.calibration = calibration
        self.observers = list(observers)
        self._verify_observers = [o for o in observers if hasattr(o, "after_verify")]   # read every cycle
        self.cancel = cancel
        self.recall = recall                      # earlier generations' text: drafts from it, this one's text to it
        grammar = (Grammar(verifier.model, config.grammar, config.grammar_triggers)
                   if config.grammar is not None else None)
        self.sampler = Sampler(config.sampling, prompt, grammar)  # the context penalties count, the grammar
        self.stats = GenerationStats(prompt_tokens=len(prompt), spec=policy.active)
        self.output = TokenOutput(verifier.model, config.stop, config.max_tokens)
        self.logprobs = LogprobRecorder(verifier.model, config.logprobs) if config.logprobs is not None else None
        self._pending_logprobs: list | None = None   # those of the tokens the last cycle committed
        self.predicted = ((list(config.prediction_tokens) if config.prediction_tokens is not None else
                           verifier.model.tokenize(config.prediction, add_special=False, parse_special=False))
                          if config.prediction is not None else None)    # Predicted Outputs' tokens
        self.drafting: DraftStep | None = None
        self.finish: str | None = None
        self.events: list[Event] = []             # queued for the driver (take)
        self.done = False                         # the DoneEvent is queued
        self._work: RowPlan | None = None        # what this step's rows are (plan -> settle)
        self._plain = not config.spec             # nothing drafts: every step is a plain one
        self._shared = False                      # this step's batch holds other slots' rows
        self._alone = True                        # this step's rows are the batch's first
        self._promised = 0                        # rows promised in the batch for a chain being drafted
        self._started = False
        self._t_start = self._t_cycle = 0.0
        self._t_gen = 0.0
        self._drafter_t0 = 0.0

    def close(self) -> None:
        """Free what the generation holds outside Python (its grammar's states); at its end, or
        when its driver drops it."""
        self.sampler.close()

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events

    @property
    def prefilling(self) -> bool:
        return not self._started or self.verifier.prefilling

    # -- one step ----------------------------------------------------------------------------------
    def plan(self, batch: Batch, reserve: int = 0, *, batched: bool = False,
             batch_rows: int = 0) -> DraftChain | None:
        """Add this step's rows to ``batch``: the prompt's next chunk (as many rows as the batch
        has left), or the draft of a cycle with ``last`` (leaving ``reserve`` rows for the slots
        after this one; ``batch_rows``: the rows the batch holds or has promised to the slots
        before this one and the fewest the ones after it need, which the policy prices a draft
        against). ``batched``: an EAGLE chain is returned undriven, its rows promised in the
        batch; :meth:`add_rows` adds them once the scheduler drafted it."""
        verifier = self.verifier
        if not self._started:
            self._begin()
        if verifier.prefilling:
            tokens, pos = verifier.prefill_chunk(batch.rows_left())
            self._work = PrefillRows(batch.add(verifier.seq, tokens, pos, all_logits=False), len(tokens))
            return None
        if self._plain:   # nothing may draft (spec off): the plain step's one row, no draft asked for
            self._t_cycle = time.perf_counter()
            self._work = StepRow(batch.add(verifier.seq, [verifier.last], verifier.n_past, all_logits=False))
            return None
        self.policy.batch_rows = batch_rows
        self._t_cycle = time.perf_counter()
        if not verifier.uncached and self.drafting.rests():   # the policy rests: spec-off's one row, nothing asked
            self._work = StepRow(batch.add(verifier.seq, [verifier.last], verifier.n_past, all_logits=False))
            return None
        self._alone = batch.rows == 0 and batch.promised == 0
        limit = min(batch.rows_left(), batch.outputs_left()) - reserve - 1 - len(verifier.uncached)
        if reserve:   # a fair share of the batch's logit rows: the slots after this one may draft too
            limit = min(limit, batch.outputs_left() // (reserve + 1) - 1 - len(verifier.uncached))
        draft = self.drafting.draft(max(0, min(verifier.room(), self.output.remaining - 1, limit)), verifier.n_past,
                                    batched=batched)
        if isinstance(draft, DraftChain):
            self._promised = draft.k + 1 + len(verifier.uncached)
            batch.promised += self._promised
            return draft
        self.add_rows(batch, draft)
        return None

    def add_rows(self, batch: Batch, draft: Draft) -> None:
        """This cycle's rows for ``draft`` (a plain step's one row, a chain or a tree to verify)."""
        verifier = self.verifier
        batch.promised -= self._promised
        self._promised = 0
        if draft.tree is not None:
            layout = verifier.tree_rows(draft.tree)
            self._work = TreeRows(batch.add_sets(layout.tokens, layout.positions, layout.seqs), draft, layout)
        elif draft.source is None and not verifier.uncached:
            self._work = StepRow(batch.add(verifier.seq, [verifier.last], verifier.n_past, all_logits=False))
        else:
            rows = self.policy.verify_rows(len(draft.tokens) + 1) if draft.tokens and self._alone else 0
            tokens, start = verifier.chain_rows(draft.tokens, rows)
            offset = batch.add(verifier.seq, tokens, start, all_logits=bool(draft.tokens))
            if draft.planned is not None:   # its drafts (placeholders now) fill the rows after last
                at = len(verifier.uncached) + 1
                batch.draft_at(draft, offset + at, len(tokens) - at)
            self._work = VerifyRows(offset, draft, len(tokens))

    def settle(self, batch: Batch, *, shared: bool = False) -> None:
        """After the batch's decode: commit what the rows decided and queue the events.
        ``shared``: the batch held other slots' rows too (the scheduler tells the cost model
        about the whole batch once)."""
        work, self._work = self._work, None
        self._shared = shared
        if type(work) is StepRow:   # the most frequent first
            pending, cycle = self._plain_step(self._t_cycle, work.offset, batch.seconds)
        elif isinstance(work, PrefillRows):
            first = self.verifier.prefill_done(work.n, self.sampler, work.offset)
            if first >= 0:
                self._advance(self._prefilled(first, work.offset + work.n - 1), None)
            return
        elif isinstance(work, TreeRows):
            v = self.verifier.settle_tree(work.draft.tree, work.layout, self.sampler, batch.at(work.offset))
            pending, cycle = self._verified(work.draft, v)
        elif isinstance(work, VerifyRows):
            v = self.verifier.verify(work.draft.tokens, self.sampler, batch.at(work.offset), work.rows)
            pending, cycle = self._verified(work.draft, v)
        else:
            raise LocalspecError(f"internal: a step settled with no rows planned ({work!r})")
        self._advance(pending, cycle)

    def check(self) -> bool:
        """End the generation if it is due (after the driver handed the step's events on: a
        consumer may cancel on one); whether it is done."""
        if self.done:
            return True
        finish = self.output.finish   # what ends it, tested inline (every step, right after a decode)
        if finish is None and self.cancel is not None and self.cancel.is_set():
            finish = "cancelled"
        verifier = self.verifier
        if finish is None and verifier.n_past >= verifier.n_ctx and not self.prefilling:
            finish = "context"
        self.finish = finish
        if finish is not None:
            self.events.extend(self.output.close())
            self.stats.generation_seconds = time.perf_counter() - self._t_gen if self._t_gen else 0.0
            self.stats.policy_choices = dict(self.policy.choices)
            if self.predicted is not None:
                (self.stats.accepted_prediction_tokens,
                 self.stats.rejected_prediction_tokens) = prediction_tokens_used(self.predicted, self.output.tokens)
            self.events.append(DoneEvent(self.output.text, self.output.tokens, self.finish, self.stats.snapshot(),
                                         logprobs=self.output.logprobs if self.logprobs is not None else None))
            self.done = True
            self.close()
            if self.recall is not None:
                self.recall.add(self.prompt + self.output.tokens)
        return self.done

    def _advance(self, pending: list[tuple[int, bool]], cycle: _Cycle | None) -> None:
        """The committed tokens' events, the clock (inline: a call less each cycle), the cycle's event."""
        output, stats = self.output, self.stats
        before = len(output.tokens)
        self.events.extend(output.emit(pending, self._pending_logprobs))
        stats.generated_tokens = len(output.tokens)
        stats.generation_seconds = time.perf_counter() - self._t_gen
        if self.drafter:
            stats.drafter_seconds = self.drafter.seconds - self._drafter_t0
        if cycle is not None:
            self.events.append(CycleEvent(cycle.drafted, cycle.accepted, stats.generated_tokens - before,
                                          stats.snapshot(), cycle.source))

    def _begin(self) -> None:
        """Start the prompt (reusing the cached prefix); its chunks follow in plan/settle."""
        self._started = True
        self._t_start = time.perf_counter()
        self.verifier.begin(self.prompt, self.drafter, exact=self.exact)
        self.stats.prompt_cached = self.verifier.prefill_chunk(0)[1]

    def _prefilled(self, first: int, row: int) -> list[tuple[int, bool]]:
        """The prompt is in; ``first`` was chosen from its logits (batch row ``row``)."""
        for observer in self.observers:
            observer.after_prefill(self.verifier.ctx, self.sampler)
        self._record_logprobs([first], [row])
        self.sampler.commit([first])
        lookup = NgramLookup(self.prompt + [first]) if self.policy.lookup else None
        prediction = None
        if lookup is not None and self.predicted:
            prediction = PredictionSource(self.predicted)
            prediction.extend([first])
        # recalled drafts for greedy requests only: a sampled request's random draws follow its drafts,
        # and a seeded one repeats only if they depend on nothing but the request
        recall = self.recall if self.config.sampling.greedy else None
        self.drafting = DraftStep(self.policy, self.drafter, lookup, self.calibration, self.config.policy.draft_max,
                                  self.sampler.grammar, prediction, recall)
        self.stats.prompt_seconds = time.perf_counter() - self._t_start
        self._t_gen = time.perf_counter()
        self._drafter_t0 = self.drafter.seconds if self.drafter else 0.0
        return [(first, False)]

    def _verified(self, draft, v: Verified) -> tuple[list[tuple[int, bool]], _Cycle]:
        """After a verification: the committed tokens and the cycle's counts."""
        policy = self.policy
        self.stats.record_verify(v.batch, v.seconds)
        t_cycle = self._t_cycle + self._observe(v) if self._verify_observers else self._t_cycle
        if self.logprobs is not None:
            self._record_logprobs(v.tokens, v.logit_rows)
        self.drafting.record(draft, v)
        if self.sampler.needs_context:
            self.sampler.commit(v.tokens)
        if not draft.tokens:   # what policy.declined looks at (a model source that drafted nothing)
            policy.declined(draft)
        source = draft.source if v.drafted else None   # every source by its own name
        depth = draft.tree.depth if draft.tree is not None else None
        self.stats.record_cycle(v.drafted, v.accepted, source, depth=depth)
        policy.observe(draft.source if v.drafted else None, v.drafted, v.accepted, verify_seconds=v.seconds,
                       drafter_seconds=draft.seconds,
                       cycle_seconds=time.perf_counter() - t_cycle, drafter_steps=draft.steps, depth=depth,
                       batch=v.batch, cost_observed=self._shared)
        return [(d, True) for d in v.drafts] + [(v.correction, False)], _Cycle(v.drafted, v.accepted, source)

    def _plain_step(self, t_cycle: float, offset: int, decoded_seconds: float) -> tuple[list[tuple[int, bool]], _Cycle]:
        """A cycle that drafts nothing, kept lean (most cycles of most text): the same outcome
        and bookkeeping as verifying no drafts, without building a verification record, and
        without the calls that would do nothing (each costs 5-20 µs right after a decode)."""
        verifier = self.verifier
        pos = verifier.n_past
        tok, seconds = verifier.step(self.sampler, offset, decoded_seconds)
        if self._verify_observers:   # what they read of a verification: this step's one row, before the commit
            t_cycle += self._observe(Verified(pos, [tok], [offset], 0, 1, seconds))
        if self.logprobs is not None:
            self._record_logprobs([tok], [offset])
        self.stats.record_plain(seconds)
        if self.drafting.listens:
            self.drafting.commit([tok], pos, [offset])
        if self.sampler.needs_context:
            self.sampler.commit((tok,))
        self.policy.observe_plain(seconds, time.perf_counter() - t_cycle, self._shared)
        return [(tok, False)], _PLAIN

    def _observe(self, verified: Verified) -> float:
        """Run the observers; their seconds, which do not count as generation time."""
        if not self._verify_observers:
            return 0.0
        t0 = time.perf_counter()
        for observer in self._verify_observers:
            observer.after_verify(self.verifier.ctx, self.sampler, verified)
        spent = time.perf_counter() - t0
        self._t_gen += spent
        return spent

    def _record_logprobs(self, tokens: list[int], rows: list[int]) -> None:
        """The committed tokens' log-probabilities, from the rows that chose them (before the next decode)."""
        if self.logprobs is not None:
            self._pending_logprobs = self.logprobs.rows(self.verifier.ctx, tokens, rows)
