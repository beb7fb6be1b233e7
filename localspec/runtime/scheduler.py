"""The one driver of every generation: slots in one target context, one batch per step.

The engine's context holds N sequences (``n_seq_max = N``) in ONE unified KV cache: a shared
pool of ``N x n_ctx`` cells, each slot's sequence filling at most its own ``n_ctx`` positions, so
no slot can run another out of cells. Each slot (:class:`Slot`, as llama.cpp server's
``server_slot``: one slot owns its state) keeps its verifier (the sequence's committed tokens,
which outlive a request: the next request with the same prefix reuses its KV) and its drafter
sequence, and, while a request runs, a :class:`~localspec.runtime.generation.Generation` with its
own sampler and RNG, penalties, stop and UTF-8 holdback, lookup index and policy; its state
(:class:`SlotState`: idle, prefill, generating, finished) is what the scheduler reads.
``Engine.generate`` is a scheduler of one slot, ``Engine.batch_generate`` and ``serve`` one of
every slot.

The scheduler is given a :class:`SlotHost`, not the engine: the slots' verifiers and drafter
sequences, how to open a generation, the engine's claim, the thread tick, the cost record and the
drafter's step decode. It never calls back into the engine that made it.

Every :meth:`Scheduler.step` is ONE ``llama_decode`` of every active slot's rows
(:class:`~localspec.runtime.batch.Batch`), in three phases:

- **plan** (:meth:`Scheduler.plan` -> :class:`StepPlan`): the slots that generate, in order of
  admission, add their rows (one row each, plus a draft where it pays against the whole batch: the
  policy prices k more rows as V(R + k) - V(R) on a batch of R rows; a model drafter's chain is
  promised its rows, not drafted yet); the prompts being prefilled are listed, in order of arrival;
- **run** (:meth:`Scheduler.run`): the drafter's decodes (the slots' chains together: one drafter
  encode and decode of every slot's committed rows, then one drafter decode per depth for all of
  them: :func:`drive_chains`) and their rows, the prompts' chunks in
  the rows left (a long prompt never holds the streaming slots back for more than one batch), then
  the target's one decode;
- **settle** (:meth:`Scheduler.settle`): each generation accepts what its rows decided; each slot's
  events go to its own sink.

A request goes to the free slot whose cached tokens share the longest prefix with its prompt
(ties: the least recently used). Each slot drafts with its own sequence of the drafter's context
(its own pending target features) and its own lookup index; draft trees only in an engine of one
slot (their branches are sequences of the target context), their rows in the step's batch as a
chain's are (each row in the sequences of the leaves below it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterator, Protocol, Sequence

from ..core.errors import LocalspecError
from ..core.events import Event
from .batch import Batch
from .drafting import CatchUp, Draft, DraftChain
from .config import GenerationConfig
from .generation import Generation, GenerationObserver
from .prompt_cache import MIN_TOKENS, Kept, PromptCache, common_prefix, worth_loading
from .verifier import TargetVerifier


class OpenGeneration(Protocol):
    """Builds one request's :class:`Generation` on a slot's verifier and drafter sequence (not started)."""

    def __call__(self, verifier: TargetVerifier, prompt: list[int], config: GenerationConfig,
                 cancel: threading.Event | None, *, drafter=None,
                 observers: Sequence[GenerationObserver] = ()) -> Generation: ...


# steps after the last step of several slots in which a slot alone still prices its draft as in a
# shared batch: at 4 clients, the first of four requests arriving together drafted a 79-token
# lookup match as if alone, an 80-row verify (~0.3 s here) that held the three others' first
# tokens (TTFT p50 0.33-0.38 s against 0.08-0.09) and, 19 accepted, cost the level 20% of its tok/s
SHARED_GRACE = 4


@dataclass(frozen=True, slots=True)
class SlotHost:
    """All a scheduler may use of the engine that made it (``Engine.scheduler``): the target
    context (its batches, a slot's saved cells), one verifier and drafter sequence per slot, how
    to open a generation, the engine's claim (``claim``: take it from a background calibration,
    False when a generation holds it; ``release``), the thread count's tick (once a step),
    ``record_batch(rows, seconds)`` (a batch of several slots, timed once for the cost model),
    the drafter's decode of every slot's next chain step, its catch-up of every slot's
    committed rows, its run of greedy chains' steps in one call, and of their catch-ups and
    steps in one call (None: no model drafter)."""

    ctx: object
    verifiers: Sequence[TargetVerifier]
    drafters: Sequence
    open_generation: OpenGeneration
    claim: Callable[[], bool]
    release: Callable[[], None]
    tick: Callable[[], None] | None   # None: a fixed thread count, nothing to tick
    record_batch: Callable[[int, float], None]
    draft_steps: Callable | None = None
    catch_ups: Callable | None = None
    greedy_rounds: Callable | None = None
    catch_up_rounds: Callable | None = None


@dataclass(frozen=True)
class SlotFailed:
    """The last event a sink gets when its generation failed on its own (its grammar allows no
    token, a bug in its rows): the slot is free again, the other slots go on."""
    error: BaseException


class SlotState(Enum):
    """Where a slot is, as llama.cpp server's ``server_slot`` says it: free; prefilling a prompt;
    generating (its first token chosen); finished (its DoneEvent is being delivered, it is free
    again at the end of the step)."""

    IDLE = "idle"
    PREFILL = "prefill"
    GENERATING = "generating"
    FINISHED = "finished"


_IDLE, _PREFILL, _GENERATING = SlotState.IDLE, SlotState.PREFILL, SlotState.GENERATING   # read every step


class Slot:
    """One sequence of the target context: its verifier (the sequence's committed tokens, which
    outlive a request), its drafter sequence (None: the engine drafts with no model), and the
    generation it serves with the sink of that generation's events, in an explicit state."""

    def __init__(self, index: int, verifier: TargetVerifier, drafter=None) -> None:
        self.index = index
        self.verifier = verifier
        self.drafter = drafter
        self.state = SlotState.IDLE
        self.generation: Generation | None = None
        self.sink: Callable[[Event], None] | None = None
        self.admitted = 0            # admission order (FIFO prefill; least recently used first)

    @property
    def busy(self) -> bool:
        return self.state is not SlotState.IDLE

    def start(self, generation: Generation, sink: Callable[[Event], None], admitted: int) -> None:
        self.generation, self.sink, self.admitted = generation, sink, admitted
        self.state = SlotState.PREFILL

    def settled(self) -> None:
        """After the step's rows were read: its events to the sink; a prompt whose last chunk
        was in chose the first token, and the slot generates from the next step on."""
        generation = self.generation
        if self.state is SlotState.PREFILL and not generation.prefilling:
            self.state = SlotState.GENERATING
        events, generation.events = generation.events, []   # deliver(), inline: once a step, right after the decode
        for event in events:
            self.sink(event)

    def finish(self) -> None:
        """The generation ended (its DoneEvent queued): deliver it, then the slot is free."""
        self.state = SlotState.FINISHED
        self.deliver()
        self.free()

    def free(self) -> Generation | None:
        """The slot is idle again; the generation it served (not closed here), if any."""
        generation = self.generation
        self.generation, self.sink, self.state = None, None, SlotState.IDLE
        return generation

    def deliver(self) -> None:
        for event in self.generation.take():
            self.sink(event)


@dataclass(slots=True)
class StepPlan:
    """One step, planned (:meth:`Scheduler.plan`), then run and settled: the busy slots
    (``active``, in order of admission), its batch, the slots with rows in it in row order
    (``planned``), the model drafter's chains still to draft (each slot's rows promised in the
    batch), the prompts that take the rows left in arrival order (``prefills``), and the slots
    that failed on their own so far (their index: the error; an exception in one slot's part of a
    step is that slot's failure only, never the other slots')."""

    active: list[Slot]
    batch: Batch
    planned: list[Slot]
    chains: list[tuple[Slot, DraftChain]]
    prefills: list[Slot]
    failed: dict[int, BaseException]


class Scheduler:
    """Slots of an engine (``Engine(parallel=N)``), driven one batch per :meth:`step`: every
    generation runs here (``Engine.generate``: a scheduler of one slot; ``batch_generate`` and
    ``serve``: of every slot). ``host``: what it may use of the engine (:class:`SlotHost`, from
    ``Engine.scheduler``). ``slots``: the engine's first that many slots (None: all).
    ``hold``: keep the engine from the first admission until :meth:`close`, rather than only
    while a slot is busy (a caller that admits more between steps: nothing may take the engine
    in between)."""

    def __init__(self, host: SlotHost, prompt_cache: PromptCache | None = None, *, slots: int | None = None,
                 hold: bool = False) -> None:
        self.host = host
        n = len(host.verifiers) if slots is None else slots
        drafters = host.drafters or [None] * n
        self.slots = [Slot(i, host.verifiers[i], drafters[i]) for i in range(n)]
        self._admissions = 0
        self.prompt_cache = prompt_cache   # the texts of slots that moved on (runtime.prompt_cache)
        self.hold = hold
        self._holding = False              # this scheduler holds the engine (its calibrator's claim)
        self._step_plan: StepPlan | None = None   # the step under way (step_rows -> step_end)
        self._shared_left = 0              # steps a lone slot still prices its draft as shared (plan)

    @property
    def active(self) -> int:
        n = 0
        for slot in self.slots:   # a driver reads this every step: no generator frame
            if slot.state is not _IDLE:
                n += 1
        return n

    @property
    def free(self) -> int:
        return len(self.slots) - self.active

    @property
    def prefilling(self) -> int:
        """Slots whose prompt is not in yet."""
        return sum(1 for s in self.slots if s.state is SlotState.PREFILL)

    def admit(self, prompt: list[int], config: GenerationConfig, cancel: threading.Event | None,
              sink: Callable[[Event], None], *, observers=()) -> int:
        """Start generating ``prompt`` (checked token ids, see ``Engine.prepare``) in a free slot;
        its events go to ``sink`` from :meth:`step` (``observers``: see
        :class:`~localspec.runtime.generation.GenerationObserver`). Returns the slot's index."""
        free = [s for s in self.slots if not s.busy]
        if not free:
            raise LocalspecError("internal: no free slot")
        # ties: the least recently used slot; with a KV stream per slot, the lowest (slots of consecutive
        # numbers decode as one micro-batch: llama.stream_rows)
        slot = max(free, key=lambda s: (common_prefix(s.verifier.kv_tokens, prompt),
                                        -s.index if self.host.ctx.streams else -s.admitted))
        took = self._take()
        try:
            generation = self.host.open_generation(slot.verifier, prompt, config, cancel, drafter=slot.drafter,
                                                   observers=observers)
            try:
                if self.prompt_cache is not None:   # the prompt starts at the slot's next step (Generation.plan)
                    # a load empties the drafter's sequence (see _load): its drafts, and so a sampled text's
                    # draws, would then differ from the same request's elsewhere; such a prompt is read again
                    drafts_shape_text = (slot.drafter is not None and config.spec
                                         and not config.sampling.greedy)
                    self._swap(slot, prompt, load=not drafts_shape_text)
            except BaseException:
                generation.close()
                slot.verifier.forget()   # whatever the swap left in the sequence is not what kv_tokens says
                raise
        except BaseException:
            if took:
                self._release()
            raise
        # the slot is taken only now, whole: a failure above leaves it free (and the engine unlocked)
        self._admissions += 1
        slot.start(generation, sink, self._admissions)
        return slot.index

    def _take(self) -> bool:
        """Take the engine for this scheduler's slots if it does not hold it yet (a background
        calibration stops for it; generate() is refused meanwhile); whether it took it now."""
        if self._holding:
            return False
        if not self.host.claim():
            raise LocalspecError("the engine is already generating")
        self._holding = True
        return True

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self.host.release()

    def _swap(self, slot: Slot, prompt: list[int], *, load: bool = True) -> None:
        """Before ``slot`` takes ``prompt``: keep its text in the prompt cache if the prompt would
        drop MIN_TOKENS of it or more, and (``load``) load a kept text that shares more with the
        prompt where the rows it saves pay for the copy (``prompt_cache.worth_loading``)."""
        verifier, cache = slot.verifier, self.prompt_cache
        have = common_prefix(verifier.kv_tokens, prompt)
        kept, length = cache.best(prompt) if load else (None, 0)
        load = kept is not None and worth_loading(length - have, length, len(kept.tokens))
        if load:   # out of the cache before the slot's own text goes in (which may evict it): the slot holds it now
            cache.take(kept)
        if len(verifier.kv_tokens) - have >= MIN_TOKENS:
            self._keep(slot)
        if load:
            self._load(slot, kept)

    def _keep(self, slot: Slot) -> None:
        target = self.host.ctx.seq_state(slot.verifier.seq)
        if target is not None:
            tokens = list(slot.verifier.kv_tokens)
            self.prompt_cache.put(Kept(tokens, target, min(slot.verifier.exact_upto, len(tokens))))

    def _load(self, slot: Slot, kept: Kept) -> None:
        """The kept cells into the slot's sequence. The drafter's sequence is emptied: it starts
        again from the rows after the prompt (as after plain stretches, see EagleDrafter.catch_up),
        so the drafter does not bound the prefix the prompt reuses."""
        verifier = slot.verifier
        if not self.host.ctx.set_seq_state(verifier.seq, kept.target):
            verifier.forget()
            return
        if slot.drafter is not None:
            slot.drafter.reset(0)
        verifier.loaded(kept.tokens, len(kept.tokens), kept.exact_upto)

    def step(self) -> None:
        """One decode of every busy slot's rows; then each slot's events to its sink, and the
        slots whose generation ended are free again."""
        self.step_rows()
        self.step_end()

    def step_rows(self) -> None:
        """A step's first half: plan, run and settle it (one decode of every busy slot's rows), and
        each slot's events to its sink. A driver that hands the events on itself
        (``Engine.generate``) does so before :meth:`step_end`, so that a consumer who cancels on
        one ends the generation in this step."""
        active = []
        for slot in self.slots:   # a loop, not a comprehension: one frame less a step
            if slot.state is not _IDLE:
                active.append(slot)
        if not active:
            self._step_plan = None
            return
        if len(active) > 1:
            active.sort(key=_admitted)
        if self.host.tick is not None:
            self.host.tick()   # the thread count that fits the free cores (rate-limited inside)
        plan = self._step_plan = self.plan(active)
        self.run(plan)
        self.settle(plan)

    def step_end(self) -> None:
        """A step's second half: the generations that are due end (their DoneEvent to the sink),
        a slot that failed on its own gets :class:`SlotFailed`; their slots are free again."""
        plan, self._step_plan = self._step_plan, None
        if plan is None:
            return
        failed = plan.failed
        try:
            for slot in plan.active:
                if slot.index not in failed:
                    try:
                        if slot.generation.check():
                            slot.finish()
                    except Exception as exc:   # this slot's failure only (as every slot's part of a step)
                        failed.setdefault(slot.index, exc)
                if slot.index in failed:
                    self._drop(slot, failed[slot.index])
        finally:
            if not self.hold and not self.active:
                self._release()

    def plan(self, active: list[Slot]) -> StepPlan:
        """The step's plan: the generating slots' rows, each one's draft priced against the rows
        before it and the fewest the ones after it and the prompts being read need (a draft is
        priced as in a shared batch while a prompt waits, so that no long draft delays a first
        token as if its slot were alone; the batch budget is the scheduler's: it
        tells each generation what it may take; a model drafter's chain is promised its rows, to
        be drafted in :meth:`run`), and the prompts being prefilled, in order of arrival."""
        exact = active[0].generation.exact if len(active) == 1 else any(s.generation.exact for s in active)
        batch = Batch(self.host.ctx, exact=exact)
        decoding, prefills = [], []
        for slot in active:
            if slot.state is _GENERATING:
                decoding.append(slot)
            elif slot.state is _PREFILL:
                prefills.append(slot)
        plan = StepPlan(active, batch, [], [], prefills, {})
        batched = len(decoding) > 1
        waiting = len(plan.prefills)   # a prompt takes one row at least: its first token waits on this step
        # just after steps of several slots, the clients whose answers ended are sending their next
        # requests: a slot alone for a moment still prices its draft as shared, so that no deep
        # draft verified as if alone holds their first tokens (see SHARED_GRACE)
        self._shared_left = SHARED_GRACE if batched else max(self._shared_left - 1, 0)
        waiting = max(waiting, 1 if self._shared_left and not batched else 0)
        for i, slot in enumerate(decoding):
            others = len(decoding) - 1 - i + waiting   # rows the slots after this one need at least
            try:
                chain = slot.generation.plan(batch, reserve=others, batched=batched,
                                             batch_rows=batch.rows + batch.promised + others)
                if chain is not None:
                    plan.chains.append((slot, chain))
                plan.planned.append(slot)
            except Exception as exc:
                plan.failed.setdefault(slot.index, exc)
        return plan

    def run(self, plan: StepPlan) -> None:
        """The plan run: the model drafter's chains drafted together and their rows added, the
        prompts' chunks in the rows left, then ONE decode of the batch (a failure there is every
        slot's: the step raises, the worker ends them all); a batch of several slots timed once
        for the cost model."""
        batch, failed = plan.batch, plan.failed
        if plan.chains:
            for slot, draft in drive_chains(self.host.draft_steps, plan.chains, self.host.catch_ups,
                                            self.host.greedy_rounds, self.host.catch_up_rounds):
                try:
                    slot.generation.add_rows(batch, draft)
                except Exception as exc:
                    failed.setdefault(slot.index, exc)
        for slot in plan.prefills:
            if slot.index not in failed and batch.rows_left() > 0 and batch.outputs_left() > 0:
                try:
                    slot.generation.plan(batch)
                    plan.planned.append(slot)
                except Exception as exc:
                    failed.setdefault(slot.index, exc)
        batch.decode()
        if len(batch.segments) > 1:
            self.host.record_batch(batch.rows, batch.seconds)

    def settle(self, plan: StepPlan) -> None:
        """After the decode: each planned generation reads its rows, commits, and queues its
        events; each slot's events to its sink."""
        batch, failed = plan.batch, plan.failed
        shared = len(batch.segments) > 1
        for slot in plan.planned:
            if slot.index not in failed:
                try:
                    slot.generation.settle(batch, shared=shared)
                    slot.settled()
                except Exception as exc:
                    failed.setdefault(slot.index, exc)

    def _drop(self, slot: Slot, error: BaseException) -> None:
        """End ``slot``'s generation after its own failure: its state freed, its sequence emptied
        (the rows it wrote this step are not what the verifier says), :class:`SlotFailed` to its sink."""
        sink = slot.sink
        generation = slot.free()
        slot.verifier.forget()
        if generation is not None:
            generation.close()
        if sink is not None:
            sink(SlotFailed(error))

    def cancel_all(self) -> list[int]:
        """Drop every running generation without events (after a failure of the step): their
        sequences are emptied, the engine released. The indices of the slots that were running."""
        dropped = []
        for slot in self.slots:
            if slot.busy:
                slot.free().close()
                slot.verifier.forget()
                dropped.append(slot.index)
        self._release()
        return dropped

    def close(self) -> None:
        """Between steps: stop every running generation without events (their sequences keep
        what they committed, for the next prompt's prefix), and release the engine."""
        for slot in self.slots:
            if slot.busy:
                slot.free().close()
        self._release()


def _admitted(slot: Slot) -> int:
    return slot.admitted


def drive_chains(draft_steps: Callable, chains: list[tuple[Slot, DraftChain]],
                 catch_ups: Callable, greedy_rounds: Callable | None = None,
                 catch_up_rounds: Callable | None = None) -> list[tuple[Slot, Draft]]:
    """The slots' model-drafter chains drafted together: first every chain's catch-up
    (``catch_ups``: the drafter's ``catch_ups``, one encode and one decode of every slot's
    committed rows), then each round one drafter decode (``draft_steps``: the drafter's
    ``decode_steps``) of every chain's next step (each in its slot's drafter sequence, which the
    decode's time is shared among). Where every chain left is greedy (``DraftChain.finish``), its
    rounds run in one call of ``greedy_rounds`` (the drafter's: the same decodes, in C); where every
    chain is greedy from its catch-up on, the catch-ups and the rounds in one call of
    ``catch_up_rounds``."""
    done: list[tuple[Slot, Draft]] = []
    waiting: list[tuple[Slot, DraftChain, tuple]] = []

    def advance(slot: Slot, chain: DraftChain, result) -> None:
        try:
            waiting.append((slot, chain, next(chain.steps) if result is None else chain.steps.send(result)))
        except StopIteration as stop:
            done.append((slot, stop.value))

    for slot, chain in chains:
        advance(slot, chain, None)
    if (catch_up_rounds is not None and waiting and len(waiting) == len(chains)
            and all(c.finish and type(step) is CatchUp for _, c, step in waiting)):
        drafts = catch_up_rounds([(chain.drafter, step.rows, chain.pos, chain.k) for _, chain, step in waiting])
        if drafts is not None:   # each chain's Draft from all its drafts
            for (slot, chain, _), tokens in zip(waiting, drafts):
                chain.steps.close()
                done.append((slot, chain.finish(tokens)))
            return done
    while waiting:
        if greedy_rounds is not None and type(waiting[0][2]) is not CatchUp and all(c.finish for _, c, _ in waiting):
            drafts = greedy_rounds([(chain.drafter, *step[:3], chain.k) for _, chain, step in waiting])
            if drafts is not None:   # each chain's first draft, then the ones the rounds drafted
                for (slot, chain, step), more in zip(waiting, drafts):
                    chain.steps.close()
                    done.append((slot, chain.finish([step[0]] + more)))
                break
        rounds, waiting = waiting, []
        if type(rounds[0][2]) is CatchUp:   # every chain starts with its catch-up: the first round
            results = catch_ups([(chain.drafter, step.rows) for _, chain, step in rounds])
        else:
            results = draft_steps([(chain.drafter, *step) for _, chain, step in rounds])
        for (slot, chain, _), result in zip(rounds, results):
            advance(slot, chain, result)
    return done


def drive(scheduler: Scheduler, queues: list[tuple[int, list[Event]]],
          between: Callable[[], None] | None = None) -> Iterator[tuple[int, Event]]:
    """Step ``scheduler`` until its slots are idle, yielding ``(i, event)`` from each sink list
    ``queues[i]`` (what the admissions' sinks append to) as each half step ends: one step's events
    before the next step is decoded. ``between``: called after each step (admit waiting requests).
    A slot that failed on its own raises its error here. Closed early (the consumer stopped):
    the running generations end where they are, their sequences keep what they committed; a
    failure: they are dropped, their sequences emptied. The engine is released either way."""
    halves = (scheduler.step_rows, scheduler.step_end)
    try:
        while scheduler.active:
            for half in halves:
                half()
                for i, queue in queues:   # the half step's events, inline: no generator a half step
                    if queue:
                        events = queue[:]
                        queue.clear()
                        for event in events:
                            if type(event) is SlotFailed:
                                raise event.error
                            yield i, event
            if between is not None:
                between()
    except GeneratorExit:
        raise
    except BaseException:
        scheduler.cancel_all()
        raise
    finally:
        scheduler.close()
