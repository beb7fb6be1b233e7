"""Several generations at once in one target context: the slots of ``localspec serve --parallel N``.

The engine's context holds N sequences (``n_seq_max = N``) in ONE unified KV cache: a shared
pool of ``N x n_ctx`` cells, each slot's sequence filling at most its own ``n_ctx`` positions, so
no slot can run another out of cells. Each slot (:class:`Slot`) keeps its verifier (the sequence's
committed tokens, which outlive a request: the next request with the same prefix reuses its KV)
and its drafter sequence, and, while a request runs, a
:class:`~localspec.runtime.generation.GenerationLoop` with its own sampler and RNG, penalties, stop
and UTF-8 holdback, lookup index and policy; its state (:class:`SlotState`: idle, prefill,
generating, finished) is what the scheduler reads. The scheduler is the one driver of every
generation: ``Engine.generate`` is a scheduler of one slot, ``Engine.batch_generate`` and ``serve``
one of every slot.

Every :meth:`Scheduler.step` is ONE ``llama_decode`` of every active slot's rows
(:class:`~localspec.runtime.batch.Batch`): first the slots that generate (one row each, plus a
draft where it pays against the whole batch: the policy prices k more rows as V(R + k) - V(R)
on a batch of R rows), then the prompts being prefilled, in order of arrival, in chunks as large
as the batch has room for (a long prompt never holds the streaming slots back for more than one
batch). Each slot's events go to its own sink as they come.

A request goes to the free slot whose cached tokens share the longest prefix with its prompt
(ties: the least recently used). Each slot drafts with its own sequence of the EAGLE drafter's
context (its own pending target features) and its own lookup index; the slots' EAGLE chains are
drafted together, one drafter decode per depth for all of them (:func:`drive_chains`); draft
trees only in an engine of one slot (their branches are sequences of the target context), their
rows in the step's batch as a chain's are (each row in the sequences of the leaves below it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterator

from ..core.errors import LocalspecError
from ..core.events import Event
from .batch import Batch
from .drafting import Draft, DraftChain
from .config import GenerationConfig
from .generation import GenerationLoop
from .prompt_cache import MIN_TOKENS, Kept, PromptCache, common_prefix
from .verifier import TargetVerifier


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


class Slot:
    """One sequence of the target context: its verifier (the sequence's committed tokens, which
    outlive a request), its drafter sequence (None: the engine drafts with no model), and the
    generation it serves with the sink of that generation's events, in an explicit state."""

    def __init__(self, index: int, verifier: TargetVerifier, drafter=None) -> None:
        self.index = index
        self.verifier = verifier
        self.drafter = drafter
        self.state = SlotState.IDLE
        self.generation: GenerationLoop | None = None
        self.sink: Callable[[Event], None] | None = None
        self.admitted = 0            # admission order (FIFO prefill; least recently used first)

    @property
    def busy(self) -> bool:
        return self.state is not SlotState.IDLE

    def start(self, generation: GenerationLoop, sink: Callable[[Event], None], admitted: int) -> None:
        self.generation, self.sink, self.admitted = generation, sink, admitted
        self.state = SlotState.PREFILL

    def settled(self) -> None:
        """After the step's rows were read: its events to the sink; a prompt whose last chunk
        was in chose the first token, and the slot generates from the next step on."""
        if self.state is SlotState.PREFILL and not self.generation.prefilling:
            self.state = SlotState.GENERATING
        self.deliver()

    def finish(self) -> None:
        """The generation ended (its DoneEvent queued): deliver it, then the slot is free."""
        self.state = SlotState.FINISHED
        self.deliver()
        self.free()

    def free(self) -> GenerationLoop | None:
        """The slot is idle again; the generation it served (not closed here), if any."""
        generation = self.generation
        self.generation, self.sink, self.state = None, None, SlotState.IDLE
        return generation

    def deliver(self) -> None:
        for event in self.generation.take():
            self.sink(event)


class Scheduler:
    """Slots of an engine (``Engine(parallel=N)``), driven one batch per :meth:`step`: every
    generation runs here (``Engine.generate``: a scheduler of one slot; ``batch_generate`` and
    ``serve``: of every slot). ``slots``: the engine's first that many slots (None: all).
    ``hold``: keep the engine from the first admission until :meth:`close`, rather than only
    while a slot is busy (a caller that admits more between steps: nothing may take the engine
    in between)."""

    def __init__(self, engine, prompt_cache: PromptCache | None = None, *, slots: int | None = None,
                 hold: bool = False) -> None:
        self.engine = engine
        n = len(engine.verifiers) if slots is None else slots
        drafters = engine.drafters or [None] * n
        self.slots = [Slot(i, engine.verifiers[i], drafters[i]) for i in range(n)]
        self._admissions = 0
        self.prompt_cache = prompt_cache   # the texts of slots that moved on (runtime.prompt_cache)
        self.hold = hold
        self._holding = False              # this scheduler holds the engine (its calibrator's claim)
        self._active: list[Slot] = []      # the slots of the step under way (step_rows -> step_end)
        self._failed: dict[int, BaseException] = {}

    @property
    def active(self) -> int:
        return sum(1 for s in self.slots if s.busy)

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
                                        -s.index if self.engine.ctx.streams else -s.admitted))
        took = self._take()
        try:
            generation = self.engine.open_slot(slot.verifier, prompt, config, cancel, drafter=slot.drafter,
                                               observers=observers)
            try:
                if self.prompt_cache is not None:   # the prompt starts at the slot's next step (GenerationLoop.plan)
                    self._swap(slot, prompt)
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
        if not self.engine.calibrator.acquire():
            raise LocalspecError("the engine is already generating")
        self._holding = True
        self.engine.threads.tick(start=True)
        return True

    def _release(self) -> None:
        if self._holding:
            self._holding = False
            self.engine.calibrator.release()

    def _swap(self, slot: Slot, prompt: list[int]) -> None:
        """Before ``slot`` takes ``prompt``: keep its text in the prompt cache if the prompt would
        drop MIN_TOKENS of it or more, and load a kept text sharing MIN_TOKENS more with the prompt."""
        verifier, cache = slot.verifier, self.prompt_cache
        have = common_prefix(verifier.kv_tokens, prompt)
        kept, length = cache.best(prompt)
        load = kept is not None and length >= have + MIN_TOKENS
        if load:   # out of the cache before the slot's own text goes in (which may evict it): the slot holds it now
            cache.take(kept)
        if len(verifier.kv_tokens) - have >= MIN_TOKENS:
            self._keep(slot)
        if load:
            self._load(slot, kept)

    def _keep(self, slot: Slot) -> None:
        target = self.engine.ctx.seq_state(slot.verifier.seq)
        if target is not None:
            tokens = list(slot.verifier.kv_tokens)
            self.prompt_cache.put(Kept(tokens, target, min(slot.verifier.exact_upto, len(tokens))))

    def _load(self, slot: Slot, kept: Kept) -> None:
        """The kept cells into the slot's sequence. The drafter's sequence is emptied: it starts
        again from the rows after the prompt (as after plain stretches, see EagleDrafter.catch_up),
        so the drafter does not bound the prefix the prompt reuses."""
        verifier = slot.verifier
        if not self.engine.ctx.set_seq_state(verifier.seq, kept.target):
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
        """A step's first half: one decode of every busy slot's rows, and each slot's events to
        its sink. A driver that hands the events on itself (``Engine.generate``) does so before
        :meth:`step_end`, so that a consumer who cancels on one ends the generation in this step."""
        active = sorted((s for s in self.slots if s.busy), key=lambda s: s.admitted)
        self._active, self._failed = active, {}
        if active:
            self._step(active, self._failed)

    def step_end(self) -> None:
        """A step's second half: the generations that are due end (their DoneEvent to the sink),
        a slot that failed on its own gets :class:`SlotFailed`; their slots are free again."""
        active, failed, self._active = self._active, self._failed, []
        if not active:
            return
        try:
            for slot in active:
                if slot.index not in failed:
                    with _alone(slot, failed):
                        if slot.generation.check():
                            slot.finish()
                if slot.index in failed:
                    self._drop(slot, failed[slot.index])
        finally:
            if not self.hold and not self.active:
                self._release()

    def _step(self, active: list[Slot], failed: dict[int, BaseException]) -> None:
        engine = self.engine
        engine.threads.tick()   # the thread count that fits the free cores (rate-limited inside)
        batch = Batch(engine.ctx, exact=any(s.generation.exact for s in active))
        planned = self._plan(batch, [s for s in active if s.state is SlotState.GENERATING], failed)
        for slot in active:
            if slot.index not in failed and slot.state is SlotState.PREFILL and batch.rows_left() > 0 \
                    and batch.outputs_left() > 0:
                with _alone(slot, failed):
                    slot.generation.plan(batch)
                    planned.append(slot)
        batch.decode()   # a failure here is every slot's: the step raises (the worker ends them all)
        shared = len(batch.segments) > 1
        if shared and engine.cost is not None:   # one observation of the whole batch
            engine.cost.observe_verify(batch.rows, batch.seconds)
        for slot in planned:
            if slot.index not in failed:
                with _alone(slot, failed):
                    slot.generation.settle(batch, shared=shared)
                    slot.settled()

    def _plan(self, batch: Batch, decoding: list[Slot], failed: dict[int, BaseException]) -> list[Slot]:
        """The generating slots' rows: each one's draft priced against the rows before it and the
        fewest the ones after it need (the batch budget is the scheduler's: it tells each plan
        what it may take); the slots' EAGLE chains drafted together. The slots planned."""
        planned: list[Slot] = []
        chains: list[tuple[Slot, DraftChain]] = []
        for i, slot in enumerate(decoding):
            others = len(decoding) - 1 - i           # rows the slots after this one need at least
            with _alone(slot, failed):
                chain = slot.generation.plan(batch, reserve=others, batched=len(decoding) > 1,
                                             batch_rows=batch.rows + batch.promised + others)
                if chain is not None:
                    chains.append((slot, chain))
                planned.append(slot)
        if chains:
            for slot, draft in drive_chains(self.engine.drafter, chains):
                with _alone(slot, failed):
                    slot.generation.add_rows(batch, draft)
        return planned

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


class _alone:
    """Run one slot's part of a step; an exception there is that slot's failure only (recorded in
    ``failed``), never the other slots'. A class rather than a generator context manager: it is
    entered three times a slot a step (contextlib's: 2.5 µs an entry here, this one 0.7)."""

    __slots__ = ("slot", "failed")

    def __init__(self, slot: Slot, failed: dict[int, BaseException]) -> None:
        self.slot, self.failed = slot, failed

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is not None and isinstance(exc, Exception):
            self.failed.setdefault(self.slot.index, exc)
            return True
        return False


def drive_chains(drafter, chains: list[tuple[Slot, DraftChain]]) -> list[tuple[Slot, Draft]]:
    """The slots' EAGLE chains drafted together: each round, one drafter decode of every chain's
    next step (each in its slot's drafter sequence, which the decode's time is shared among)."""
    done: list[tuple[Slot, Draft]] = []
    waiting: list[tuple[Slot, DraftChain, tuple]] = []

    def advance(slot: Slot, chain: DraftChain, result) -> None:
        try:
            waiting.append((slot, chain, next(chain.steps) if result is None else chain.steps.send(result)))
        except StopIteration as stop:
            done.append((slot, stop.value))

    for slot, chain in chains:
        advance(slot, chain, None)
    while waiting:
        rounds, waiting = waiting, []
        results = drafter.decode_steps([(chain.drafter, *step) for _, chain, step in rounds])
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
    try:
        while scheduler.active:
            scheduler.step_rows()
            yield from _handed(queues)
            scheduler.step_end()
            yield from _handed(queues)
            if between is not None:
                between()
    except GeneratorExit:
        raise
    except BaseException:
        scheduler.cancel_all()
        raise
    finally:
        scheduler.close()


def _handed(queues: list[tuple[int, list[Event]]]) -> Iterator[tuple[int, Event]]:
    for i, queue in queues:
        if queue:
            events = queue[:]
            queue.clear()
            for event in events:
                if isinstance(event, SlotFailed):
                    raise event.error
                yield i, event
