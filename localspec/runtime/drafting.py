"""One draft per cycle, from whichever source the policy picks, and what the sources learn after it.

Sources: n-gram lookup (a proposal from the history, free; where the history holds no copy,
:mod:`localspec.speculation.recall` proposes from earlier generations' text), Predicted Outputs (the user's
prediction from the point the output has reached in it, :mod:`localspec.speculation.prediction`;
planned as a lookup proposal with statistics classes of its own, policy.prediction_class; whichever
of the two matches longer is proposed), the EAGLE drafter as a chain (greedy
top-1, stopping under ``p_min`` confidence) or as a tree (:mod:`localspec.speculation.tree`, cut
to its best expected rate under the cost model). After the target verified a draft,
:meth:`DraftStep.record` hands the committed tokens to the sources: the drafter records the
target features of the committed rows (or skips them while it will not draft soon), the lookup
index and its shadow score grow, and a tree's outcome trains the tree calibration.

Under a grammar (the committed state: the sampler's) every source's draft stops at the first token
the grammar forbids, checked on a copy of the state advanced along the draft: a lookup proposal
is cut there, an EAGLE chain stops drafting there, a tree loses the nodes it forbids (and their
subtrees). The verifier would reject such a token anyway; cutting it saves the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator

import numpy as np

from ..speculation import tree
from ..speculation.eagle import EagleDrafter
from ..speculation.lookup import LONG_N, NgramLookup, ShadowScore
from ..speculation.recall import Recall
from ..speculation.policy import (EAGLE, LOOKUP, PREDICTION, TREE, DraftPolicy, lookup_class, prediction_class,
                                  recall_class, top1_probability)
from ..speculation.prediction import PredictionSource
from .verifier import Verified


@dataclass
class Draft:
    """What one cycle sends to verification."""

    tokens: list[int] = field(default_factory=list)   # a chain (lookup or EAGLE); empty for a tree
    source: str | None = None        # LOOKUP, PREDICTION, EAGLE, TREE; None: a plain step
    tree: tree.DraftTree | None = None
    steps: int = 0                   # drafter decodes, catch-up rows included (tree levels are not)
    seconds: float = 0.0             # drafter time inside llama.cpp


# An EAGLE chain under way: it yields each drafter step it needs, (token, fed-back state,
# position), is sent back (logits, state), and returns its Draft (see DraftStep.draft's ``batched``)
Chain = Generator[tuple, tuple, Draft]


@dataclass
class DraftChain:
    """An EAGLE chain for its driver: at most ``k`` tokens; ``steps``: the chain itself."""

    k: int
    steps: Chain
    drafter: EagleDrafter


def run_chain(chain: DraftChain) -> Draft:
    """Drive a chain alone: each drafter step one decode of one row."""
    gen, drafter = chain.steps, chain.drafter
    try:
        tok, state, pos = next(gen)
        while True:
            tok, state, pos = gen.send(drafter.decode([tok], state[None, :], pos))
    except StopIteration as stop:
        return stop.value


class DraftStep:
    """The draft sources of one generation under its policy."""

    def __init__(self, policy: DraftPolicy, drafter: EagleDrafter | None, lookup: NgramLookup | None,
                 calibration: tree.Calibration, draft_max: int, grammar=None,
                 prediction: PredictionSource | None = None, recall: Recall | None = None) -> None:
        self.policy = policy
        # earlier generations' text: with auto's lookup only (a fixed policy's drafts depend on the
        # request alone: an experiment repeats whatever ran before)
        self.recall = recall if lookup is not None and not policy.fixed else None
        self.prediction = prediction        # Predicted Outputs (with the lookup source only)
        self.grammar = grammar              # the committed grammar state (the sampler's), or None
        self.drafter = drafter
        self.lookup = lookup
        self.shadow = (ShadowScore(policy.lookup_settled, hits=policy.lookup_hits)
                       if lookup is not None and not policy.fixed else None)
        self.calibration = calibration      # draft probability -> acceptance, learned across generations
        self.draft_max = draft_max

    def draft(self, room: int, n_past: int, *, batched: bool = False) -> Draft | DraftChain:
        """This cycle's draft: at most ``room`` tokens after the token at ``n_past``. ``batched``:
        an EAGLE chain comes back undriven (:class:`DraftChain`), for a scheduler that runs the
        drafter steps of several slots in one drafter decode."""
        policy, drafter = self.policy, self.drafter
        proposal, cls, origin = self._proposal(room)
        source, k = policy.plan(room, len(proposal), cls, drafter.pending if drafter is not None else 0)
        if self.shadow is not None:
            self.shadow.add(proposal, cls)
        if source == LOOKUP:
            return Draft(proposal[:k], origin)
        if source == EAGLE:
            return self._eagle(k, room, n_past, batched)
        return Draft(source=source)

    def _proposal(self, room: int) -> tuple[list[int], int, str]:
        """The proposal of the lookup source or of the prediction (the longer match), its
        statistics class (policy.lookup_class) and its source, only as long as the policy may
        draft for that class."""
        lookup, prediction = self.lookup, self.prediction
        if lookup is None:
            return [], 0, LOOKUP
        start, match = lookup.find()
        run = prediction.propose(1)[1] if prediction is not None else 0
        if run and run >= match:
            cls = prediction_class(run)
            tokens, _ = prediction.propose(self.policy.lookup_depth(room, cls))
            return allowed_chain(self.grammar, tokens), cls, PREDICTION
        if match < LONG_N and self.recall is not None:   # no copy in this text: one from an earlier text?
            at, recalled = self.recall.find(lookup.tokens)
            if recalled:
                cls = recall_class()
                tokens = self.recall.continuation(at, self.policy.lookup_depth(room, cls))
                return allowed_chain(self.grammar, tokens), cls, LOOKUP
        if not match:
            return [], 0, LOOKUP
        cls = lookup_class(match, len(lookup) - start)
        return (allowed_chain(self.grammar, lookup.continuation(start, self.policy.lookup_depth(room, cls))),
                cls, LOOKUP)

    def _eagle(self, k: int, room: int, n_past: int, batched: bool = False) -> Draft | DraftChain:
        """Feed the drafter the rows committed since its last draft, then a tree or a chain."""
        policy, drafter = self.policy, self.drafter
        k = min(k, drafter.max_depth or k)   # chained MTP heads: one head per draft (speculation.mtp)
        t0 = drafter.seconds
        rows = policy.catch_up_rows
        steps = drafter.pending if rows is None else min(drafter.pending, rows)
        logits, state = drafter.catch_up(rows)
        shape = policy.tree_plan(k, room)
        if shape is not None:
            draft_tree = allowed_tree(self.grammar, tree.build(drafter, logits, state, n_past, depth=k,
                                                               width=shape[0], max_nodes=shape[1]))
            if not len(draft_tree):
                return Draft(source=None, steps=steps, seconds=drafter.seconds - t0)
            if not policy.fixed:  # cut to the size with the best expected rate
                draft_tree = tree.prune(draft_tree, self.calibration, policy.cost.verify,
                                        drafter.seconds - t0 + policy.overhead)
            return Draft(source=TREE, tree=draft_tree, steps=steps, seconds=drafter.seconds - t0)
        if batched:   # other slots' drafter decodes come before this chain's first draft: keep a copy
            logits = np.array(logits)
        chain = DraftChain(k, self._chain(k, logits, state, n_past, steps, t0), drafter)
        return chain if batched else run_chain(chain)

    def _chain(self, k: int, logits, state, n_past: int, steps: int, t0: float) -> Chain:
        """Greedy top-1 drafts from the catch-up's logits until ``k``, ``p_min`` or the grammar
        stops them; each further drafter step is yielded to the driver."""
        policy, drafter = self.policy, self.drafter
        tokens: list[int] = []
        grammar = self.grammar.clone() if self.grammar is not None else None
        try:
            sure = policy.fixed or policy.config.p_min <= 0.0   # no confidence test: no softmax
            while len(tokens) < k:
                if sure:
                    tok = int(logits.argmax())
                else:
                    tok, prob = top1_probability(logits)
                    if not policy.keep_drafting(prob):
                        break
                if grammar is not None:
                    if not grammar.allowed(tok):
                        break
                    grammar.accept(tok)
                tokens.append(tok)
                if len(tokens) < k:
                    logits, state = yield tok, state, n_past + len(tokens) - 1
                    steps += 1
        finally:
            if grammar is not None:
                grammar.close()
        return Draft(tokens, EAGLE, steps=steps, seconds=drafter.seconds - t0)

    def record(self, draft: Draft, verified: Verified) -> None:
        """After verification: the committed tokens go to every source."""
        if draft.tree is not None:
            self.calibration.learn(draft.tree, verified.path)
        self.commit(verified.tokens, verified.pos, verified.rows)

    def commit(self, committed: list[int], pos: int, rows: list[int]) -> None:
        """Committed tokens (the first at ``pos + 1``) whose target rows were ``rows`` of the last
        batch (the first that of ``pos``): the drafter records their features (or skips them
        while it will not draft soon), the lookup index and its shadow score grow."""
        if self.drafter is not None:
            if self.policy.wants_features:
                self.drafter.observe(committed, len(rows), pos, rows)
            else:  # the drafter will not draft soon: skip the copy (it restarts from later rows)
                self.drafter.drop_pending()
        if self.prediction is not None:
            self.prediction.extend(committed)
        if self.lookup is not None:
            self.lookup.extend(committed)
            if self.shadow is not None:
                self.shadow.commit(committed)


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
