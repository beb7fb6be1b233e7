"""The model drafters as draft sources: the EAGLE drafter (:mod:`.eagle`), the target's MTP
heads (:mod:`.mtp`) and Gemma 4's assistant (:mod:`.assistant`), all one drafter backend
(:mod:`.drafter`) with a per-kind part.

A cycle of a model source first writes the rows committed since its last draft (the catch-up,
at most ``policy.catch_up_rows``), then drafts a tree (:mod:`.tree`, where the policy plans one,
cut to its best expected rate under the cost model) or a greedy top-1 chain that stops under
``p_min`` confidence. A chain is a generator that yields each drafter step, so that a scheduler
can run the steps of several slots in one drafter decode (:class:`~.sources.DraftChain`); a chain
alone with no confidence test and no grammar is drafted in one loop of the drafter's
(``greedy``: the same drafts, without the generator's per-step layers). Under a
grammar the chain stops at the first token it forbids and a tree loses the nodes it forbids.

Each files its cycles under its own name and statistics class (``eagle``, ``mtp``,
``assistant``: each with its own prior), end to end: the draft carries the source's name to the
policy, the stats and ``/metrics``. A step costs the calibrated drafter curve's step time
(:meth:`EagleSource.cost`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..llama import hostloop
from . import tree
from .sources import CatchUp, Chain, Draft, DraftChain, ModelSource, PlannedChain, SourceContext, run_chain

# a drafter's acceptance prior (first draft, later drafts), before it drafted on this engine
DRAFTER_PRIOR = (0.5, 0.6)
# the target's own MTP heads and Gemma 4's assistant, trained with the target's weights: no
# measurement here says they beat a trained EAGLE drafter, so the same prior until one does
MTP_PRIOR = ASSISTANT_PRIOR = DRAFTER_PRIOR
TREE = "tree"   # a model drafter's draft tree, on the surfaces


def top1_probability(logits: np.ndarray) -> tuple[int, float]:
    """The drafter's most likely token and its softmax probability: an exp over the whole row
    (numpy's: 120-200 µs of CPU for SmolLM2's 49,152 here; the C host loop's, 8-wide: see
    ``hostloop.top1``), so the chain asks for it only where a confidence test reads it."""
    if hostloop.top1 is not None:
        return hostloop.top1(logits)
    best = hostloop.argmax(logits)
    top = logits[best]
    total = float(np.exp(logits - top, dtype=np.float32).sum())
    return best, 1.0 / total


class EagleSource(ModelSource):
    """The EAGLE drafter of a generation (one sequence of the drafter's context)."""

    name = "eagle"
    classes = (("drafter", DRAFTER_PRIOR),)

    def __init__(self, drafter, policy, calibration: tree.Calibration, grammar=None) -> None:
        self.drafter, self.policy, self.calibration, self.grammar = drafter, policy, calibration, grammar

    @classmethod
    def create(cls, ctx: SourceContext) -> "EagleSource | None":
        if ctx.drafter is None:
            return None
        return cls(ctx.drafter, ctx.policy, ctx.calibration, ctx.grammar)

    def cost(self, k: int, cost_model=None) -> float:
        """``k`` drafter steps at the calibrated (live) step time."""
        step = getattr(cost_model, "drafter_step", None) or 0.0
        return k * step

    def propose(self, k: int, room: int, n_past: int, batched: bool = False) -> Draft | DraftChain:
        """Feed the drafter the rows committed since its last draft, then a tree or a chain of
        at most ``k`` tokens after the token at ``n_past`` (``room``: free cells). A chain's
        catch-up is its first step (:class:`~.sources.CatchUp`): ``batched``, the scheduler runs
        every slot's in one drafter encode and decode."""
        policy, drafter = self.policy, self.drafter
        k = min(k, drafter.max_depth or k)   # chained MTP heads: one head per draft (speculation.mtp)
        t0 = drafter.seconds
        rows = policy.catch_up_rows
        steps = drafter.pending if rows is None else min(drafter.pending, rows)
        shape = policy.tree_plan(k, room)
        if shape is not None:
            logits, state = drafter.catch_up(rows)
            draft_tree = allowed_tree(self.grammar, tree.build(drafter, logits, state, n_past, depth=k,
                                                               width=shape[0], max_nodes=shape[1]))
            if not len(draft_tree):
                return Draft(source=None, steps=steps, seconds=drafter.seconds - t0)
            if not policy.fixed:  # cut to the size with the best expected rate
                draft_tree = tree.prune(draft_tree, self.calibration, policy.cost.verify,
                                        drafter.seconds - t0 + policy.overhead)
            return Draft(source=TREE, tree=draft_tree, steps=steps, seconds=drafter.seconds - t0)
        if not batched and self.grammar is None and (policy.fixed or policy.config.p_min <= 0.0):
            # alone, no confidence test, no grammar: the same drafts without the chain's layers
            if drafter.drafter.fuses(steps, k):   # the catch-up and the chain in one C call, run with the target's decode
                return Draft([0] * k, self.name, steps=steps + k - 1,
                             planned=PlannedChain(drafter, drafter.plan_greedy(rows, n_past, k)))
            logits, state = drafter.catch_up(rows)
            tokens = drafter.greedy(logits, state, n_past, k)
            return Draft(tokens, self.name, steps=steps + max(len(tokens) - 1, 0), seconds=drafter.seconds - t0)
        chain = DraftChain(k, self._chain(k, CatchUp(rows), n_past, steps, t0), drafter, pos=n_past)
        if self.grammar is None and (policy.fixed or policy.config.p_min <= 0.0):   # the chain's tokens are argmaxes
            chain.finish = lambda tokens: Draft(tokens, self.name, steps=steps + max(len(tokens) - 1, 0),
                                                seconds=drafter.seconds - t0)
        return chain if batched else run_chain(chain)

    def _chain(self, k: int, catch_up: CatchUp, n_past: int, steps: int, t0: float) -> Chain:
        """The catch-up (the first step yielded), then greedy top-1 drafts from its logits until
        ``k``, ``p_min`` or the grammar stops them; each further drafter step is yielded to the
        driver."""
        policy, drafter = self.policy, self.drafter
        tokens: list[int] = []
        confidence: list[float] = []
        logits, state = yield catch_up
        grammar = self.grammar.clone() if self.grammar is not None else None
        try:
            sure = policy.fixed or policy.config.p_min <= 0.0   # no confidence test: no softmax
            while len(tokens) < k:
                if sure:
                    tok = hostloop.argmax(logits)
                else:
                    tok, prob = top1_probability(logits)
                    if not policy.keep_drafting(prob):
                        break
                    confidence.append(prob)
                if grammar is not None:
                    if not grammar.allowed(tok):
                        break
                    grammar.accept(tok)
                tokens.append(tok)
                if len(tokens) < k:   # the k-th draft's step feeds nothing back (last: no state)
                    logits, state = yield tok, state, n_past + len(tokens) - 1, len(tokens) == k - 1
                    steps += 1
        finally:
            if grammar is not None:
                grammar.close()
        return Draft(tokens, self.name, steps=steps, seconds=drafter.seconds - t0,
                     confidence=confidence[:len(tokens)])

    def accepted(self, draft: Draft, verified) -> None:
        """A tree's outcome trains the tree calibration (draft probability -> acceptance)."""
        if draft.tree is not None:
            self.calibration.learn(draft.tree, verified.path)

    def record(self, committed: Sequence[int], pos: int, rows: list[int]) -> None:
        """Committed tokens (the first at ``pos + 1``) whose target rows were ``rows``: their
        features are recorded, or skipped while the drafter will not draft soon (it restarts
        from later rows)."""
        if self.policy.wants_features:
            self.drafter.observe(committed, len(rows), pos, rows)
        else:
            self.drafter.drop_pending()


class MtpSource(EagleSource):
    """The target's MTP heads (:func:`~.mtp.MtpDrafter`): EAGLE's cycle, its own statistics."""

    name = "mtp"
    classes = (("drafter", MTP_PRIOR),)


class AssistantSource(EagleSource):
    """Gemma 4's assistant (:func:`~.assistant.AssistantDrafter`, a drafter file reading the
    target's KV cache): EAGLE's cycle, its own statistics."""

    name = "assistant"
    classes = (("drafter", ASSISTANT_PRIOR),)


def allowed_chain(grammar, tokens: list[int]) -> list[int]:
    """``tokens`` up to the first one ``grammar`` (a committed state, left as it is) forbids."""
    if grammar is None or not tokens:
        return tokens
    state = grammar.clone()
    try:
        for i, tok in enumerate(tokens):
            if not state.allowed(tok):
                return tokens[:i]
            state.accept(tok)
        return tokens
    finally:
        state.close()


def allowed_tree(grammar, draft_tree: tree.DraftTree) -> tree.DraftTree:
    """The nodes of ``draft_tree`` whose whole path ``grammar`` allows (parents come first)."""
    if grammar is None or not len(draft_tree):
        return draft_tree
    states: dict[int, object] = {-1: grammar}
    keep: list[int] = []
    try:
        for i, (tok, parent) in enumerate(zip(draft_tree.tokens, draft_tree.parents)):
            if parent not in states or not states[parent].allowed(tok):
                continue
            state = states[i] = states[parent].clone()
            state.accept(tok)
            keep.append(i)
    finally:
        for node, state in states.items():
            if node >= 0:
                state.close()
    return draft_tree if len(keep) == len(draft_tree) else draft_tree.subset(keep)
