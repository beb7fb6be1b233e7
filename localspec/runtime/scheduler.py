"""Several generations at once in one target context: the slots of ``localspec serve --parallel N``.

The engine's context holds N sequences (``n_seq_max = N``) in ONE unified KV cache: a shared
pool of ``N x n_ctx`` cells, each slot's sequence filling at most its own ``n_ctx`` positions, so
no slot can run another out of cells. Each slot (:class:`Slot`) keeps its verifier (the sequence's
committed tokens, which outlive a request: the next request with the same prefix reuses its KV)
and, while a request runs, a :class:`~localspec.runtime.generation.GenerationLoop` with its own
sampler and RNG, penalties, stop and UTF-8 holdback, lookup index and policy.

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
trees only in an engine of one slot (their branches are sequences of the target context).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

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


class Slot:
    """One sequence of the target context, and the request it serves (if any)."""

    def __init__(self, index: int, verifier: TargetVerifier) -> None:
        self.index = index
        self.verifier = verifier
        self.loop: GenerationLoop | None = None
        self.sink: Callable[[Event], None] | None = None
        self.admitted = 0            # admission order (FIFO prefill; least recently used first)

    def deliver(self) -> None:
        for event in self.loop.take():
            self.sink(event)


class Scheduler:
    """The slots of an engine (``Engine(parallel=N)``), driven one batch per :meth:`step`."""

    def __init__(self, engine, prompt_cache: PromptCache | None = None) -> None:
        self.engine = engine
        self.slots = [Slot(i, v) for i, v in enumerate(engine.verifiers)]
        self._admissions = 0
        self.prompt_cache = prompt_cache   # the texts of slots that moved on (runtime.prompt_cache)

    @property
    def active(self) -> int:
        return sum(1 for s in self.slots if s.loop is not None)

    @property
    def free(self) -> int:
        return len(self.slots) - self.active

    def admit(self, prompt: list[int], config: GenerationConfig, cancel: threading.Event | None,
              sink: Callable[[Event], None]) -> int:
        """Start generating ``prompt`` (checked token ids, see ``Engine.prepare``) in a free slot;
        its events go to ``sink`` from :meth:`step`. Returns the slot's index."""
        free = [s for s in self.slots if s.loop is None]
        if not free:
            raise LocalspecError("internal: no free slot")
        slot = max(free, key=lambda s: (common_prefix(s.verifier.kv_tokens, prompt), -s.admitted))
        idle = self.active == 0
        if idle:   # the engine is the scheduler's while a slot runs (generate() is refused meanwhile)
            if not self.engine.calibrator.acquire():   # a background calibration stops for it
                raise LocalspecError("the engine is already generating")
            self.engine.threads.tick(start=True)
        try:
            loop = self.engine.open_slot(slot.verifier, prompt, config, cancel)
            try:
                if self.prompt_cache is not None:   # the prompt starts at the slot's next step (GenerationLoop.plan)
                    self._swap(slot, prompt)
            except BaseException:
                loop.close()
                slot.verifier.forget()   # whatever the swap left in the sequence is not what kv_tokens says
                raise
        except BaseException:
            if idle:
                self.engine.calibrator.release()
            raise
        # the slot is taken only now, whole: a failure above leaves it free (and the engine unlocked)
        slot.loop, slot.sink = loop, sink
        self._admissions += 1
        slot.admitted = self._admissions
        return slot.index

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
            self.prompt_cache.put(Kept(list(slot.verifier.kv_tokens), target))

    def _load(self, slot: Slot, kept: Kept) -> None:
        """The kept cells into the slot's sequence. The drafter's sequence is emptied: it starts
        again from the rows after the prompt (as after plain stretches, see EagleDrafter.catch_up),
        so the drafter does not bound the prefix the prompt reuses."""
        verifier = slot.verifier
        if not self.engine.ctx.set_seq_state(verifier.seq, kept.target):
            verifier.forget()
            return
        if self.engine.drafter is not None:
            self.engine.drafters[slot.index].reset(0)
        verifier.loaded(kept.tokens, len(kept.tokens))

    def step(self) -> None:
        """One decode of every active slot's rows; then each slot's events to its sink, and the
        slots whose generation ended are free again."""
        active = sorted((s for s in self.slots if s.loop is not None), key=lambda s: s.admitted)
        if not active:
            return
        try:
            self._step(active)
        finally:
            if not self.active:
                self.engine.calibrator.release()

    def _step(self, active: list[Slot]) -> None:
        engine = self.engine
        engine.threads.tick()   # the thread count that fits the free cores (rate-limited inside)
        batch = Batch(engine.ctx)
        failed: dict[int, BaseException] = {}     # slot index -> what ended its generation this step
        decoding = [s for s in active if not s.loop.prefilling]
        planned: list[Slot] = []
        chains: dict[int, tuple[Slot, DraftChain]] = {}
        for i, slot in enumerate(decoding):
            others = len(decoding) - 1 - i           # rows the slots after this one need at least
            slot.loop.policy.batch_rows = batch.rows + batch.promised + others
            with _alone(slot, failed):
                chain = slot.loop.plan(batch, reserve=others, batched=len(decoding) > 1)
                if chain is not None:
                    chains[slot.index] = (slot, chain)
                planned.append(slot)
        for slot, draft in drive_chains(engine.drafter, list(chains.values())):
            with _alone(slot, failed):
                slot.loop.add_rows(batch, draft)
        for slot in active:
            if slot.index not in failed and slot.loop.prefilling and batch.rows_left() > 0 \
                    and batch.outputs_left() > 0:
                with _alone(slot, failed):
                    slot.loop.plan(batch)
                    planned.append(slot)
        batch.decode()   # a failure here is every slot's: the step raises (the worker ends them all)
        shared = len(batch.segments) > 1
        if shared and engine.cost is not None:   # one observation of the whole batch
            engine.cost.observe_verify(batch.rows, batch.seconds)
        for slot in planned:
            if slot.index not in failed:
                with _alone(slot, failed):
                    slot.loop.settle(batch, shared=shared)
                    slot.deliver()
        for slot in active:
            if slot.index in failed:
                self._drop(slot, failed[slot.index])
                continue
            with _alone(slot, failed):
                if slot.loop.check():
                    slot.deliver()
                    slot.loop, slot.sink = None, None
            if slot.index in failed:
                self._drop(slot, failed[slot.index])

    def _drop(self, slot: Slot, error: BaseException) -> None:
        """End ``slot``'s generation after its own failure: its state freed, its sequence emptied
        (the rows it wrote this step are not what the verifier says), :class:`SlotFailed` to its sink."""
        loop, sink = slot.loop, slot.sink
        slot.loop, slot.sink = None, None
        slot.verifier.forget()
        if loop is not None:
            loop.close()
        if sink is not None:
            sink(SlotFailed(error))

    def cancel_all(self) -> list[int]:
        """Drop every running generation without events (after a failure of the step): their
        sequences are emptied. The indices of the slots that were running."""
        dropped = []
        for slot in self.slots:
            if slot.loop is not None:
                slot.loop.close()
                slot.verifier.forget()
                slot.loop, slot.sink = None, None
                dropped.append(slot.index)
        if dropped and self.engine._lock.locked():
            self.engine.calibrator.release()
        return dropped


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
    next step (each in its slot's drafter sequence); the decode's time is shared among them."""
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
        t0 = drafter.seconds
        results = drafter.decode_steps([(chain.drafter.seq, *step) for _, chain, step in rounds])
        spent = drafter.seconds - t0
        drafter.seconds -= spent
        for _, chain, _ in rounds:
            chain.drafter.seconds += spent / len(rounds)
        for (slot, chain, _), result in zip(rounds, results):
            advance(slot, chain, result)
    return done
