"""One draft per cycle, from whichever source the policy picks, and what the sources learn after it.

The sources sit behind one interface (:mod:`localspec.speculation.sources`; the built-in ones:
:mod:`localspec.speculation.registry`). Text sources (n-gram lookup, Predicted Outputs, recall
from earlier generations, any registered one) each say how long a match of the committed text
their proposal rests on and its statistics class; the longest is proposed (the earlier source
winning a tie; recall is asked only where no other source found a copy), and the policy weighs
it against the generation's model source (EAGLE, MTP heads, Gemma 4's assistant, a block drafter,
any registered one: a chain, a tree or a block, each priced by its own ``cost(k)``) and a plain
step. Every source keeps its own name: the draft carries it to the policy and the stats.
After the target verified a draft, :meth:`DraftStep.record` tells the source that drafted it
(a tree's outcome trains the tree calibration) and hands the committed tokens to every source:
the drafter records the target features of the committed rows (or skips them while it will not
draft soon), the history and its shadow score grow, the prediction moves on.

Under a grammar (the committed state: the sampler's) every source's draft stops at the first token
the grammar forbids, checked on a copy of the state advanced along the draft: a text proposal
is cut there, a model chain stops drafting there, a tree loses the nodes it forbids (and their
subtrees). The verifier would reject such a token anyway; cutting it saves the rows.
"""

from __future__ import annotations

from ..speculation import tree
from ..speculation.lookup import NgramLookup, ShadowScore
from ..speculation.model_source import allowed_chain, allowed_tree  # noqa: F401 (re-exported)
from ..speculation.policy import DraftPolicy
from ..speculation.prediction import PredictionSource
from ..speculation.recall import Recall
from ..speculation.sources import (CatchUp, Chain, Draft, DraftChain, Proposal, SourceContext, TextSource,  # noqa: F401
                                   model_source, run_chain, text_sources, wants)
from ..core.errors import LocalspecError
from .verifier import Verified


_NONE: tuple[list[int], int, str] = ([], 0, "")   # no text proposal (read only)


class DraftStep:
    """The draft sources of one generation under its policy: ``lookup`` is the generation's
    history (the prompt and the output so far; None: no text source drafts), ``drafter`` its
    model drafter, ``prediction`` and ``recall`` what the lookup source brings beside it; any
    other registered text source the policy's ``source`` wants joins them."""

    def __init__(self, policy: DraftPolicy, drafter, lookup: NgramLookup | None,
                 calibration: tree.Calibration, draft_max: int, grammar=None,
                 prediction: PredictionSource | None = None, recall: Recall | None = None) -> None:
        self.policy = policy
        self.grammar = grammar              # the committed grammar state (the sampler's), or None
        self.drafter = drafter
        self.lookup = lookup                # the history every text source reads
        self.calibration = calibration      # draft probability -> acceptance, learned across generations
        self.draft_max = draft_max
        ctx = SourceContext(policy, lookup, prediction, recall, drafter, grammar, calibration)
        chosen = policy.config.source
        self.texts: list[TextSource] = [] if lookup is None else [
            s for s in (cls.create(ctx) for cls in text_sources() if wants(chosen, cls.word())) if s is not None]
        kind = model_source(drafter.name) if drafter is not None else None
        if drafter is not None and kind is None:
            raise LocalspecError(f"internal: no model source is registered for the drafter {drafter.name!r}")
        self.model = kind.create(ctx) if kind is not None else None
        self.shadow = (ShadowScore(policy.lookup_settled, hits=policy.lookup_hits)
                       if lookup is not None and not policy.fixed else None)
        # commit() has something to tell (spec off: nothing, and a plain step skips the call)
        self.listens = self.model is not None or bool(self.texts) or lookup is not None
        # fixed with one kind of source: its draft is as deep as the room allows (a text proposal:
        # as long as it is), as policy.choose would say, without proposals built and weighed
        self._model_only = (policy.fixed and not self.texts and self.model is not None
                            and self.model.name == policy.model)
        self._texts_only = policy.fixed and self.model is None and bool(self.texts) and policy.lookup

    def draft(self, room: int, n_past: int, *, batched: bool = False) -> Draft | DraftChain:
        """This cycle's draft: at most ``room`` tokens after the token at ``n_past``. ``batched``:
        a model chain comes back undriven (:class:`DraftChain`), for a scheduler that runs the
        drafter steps of several slots in one drafter decode."""
        policy, model = self.policy, self.model
        if self._model_only:
            k = policy.depth_limit(room)
            return model.propose(k, room, n_past, batched) if k > 0 else Draft()
        if self._texts_only:
            proposal, _, origin = self._proposal(room)
            k = min(policy.depth_limit(room), len(proposal))
            return Draft(proposal[:k], origin, confidence=[1.0] * k) if k > 0 else Draft()
        proposal, cls, origin = self._proposal(room) if self.texts else _NONE
        if not proposal and self.texts and policy.rest(room):   # no text match, no probe due: nothing weighed
            return Draft()
        candidates = [Proposal(origin, cls, len(proposal))] if proposal else []
        if model is not None:
            candidates.append(model.proposal())
        chosen, k = policy.choose(room, candidates)
        if self.shadow is not None:
            self.shadow.add(proposal, cls)
        if chosen is None:
            return Draft()
        if chosen.model:
            return model.propose(k, room, n_past, batched)
        return Draft(proposal[:k], origin, confidence=[1.0] * min(k, len(proposal)))

    def rests(self) -> bool:
        """Whether this cycle is a plain step with nothing to ask, decided before its room is
        (the generation then plans spec-off's one row): no text source here and the policy rests
        (:meth:`DraftPolicy.rest`). With text sources, only a shared batch too dear for any draft
        rests here (:meth:`DraftPolicy.rest_shared`); otherwise :meth:`draft` asks them first and
        rests where none has a match (their index grows every commit: a match can come on any cycle)."""
        if self.texts:
            return self.policy.rest_shared()
        return not self._model_only and self.policy.rest()

    def _proposal(self, room: int) -> tuple[list[int], int, str]:
        """The text sources' proposal with the longest match (the earlier source's on a tie), its
        statistics class and the name it carries, only as long as the policy may draft for that
        class."""
        best = None
        for source in self.texts:
            if source.fallback and best is not None and best.copy:
                continue
            found = source.find()
            if found is not None and (best is None or found.match > best.match):
                best = found
        if best is None:
            return [], 0, ""
        tokens = best.source.propose(best, self.policy.lookup_depth(room, best.cls))
        return allowed_chain(self.grammar, tokens), best.cls, best.source.surface()

    def record(self, draft: Draft, verified: Verified) -> None:
        """After verification: the source that drafted hears the outcome, the committed tokens go
        to every source."""
        if draft.tree is not None and self.model is not None:
            self.model.accepted(draft, verified)
        if self.listens:
            self.commit(verified.tokens, verified.pos, verified.rows)

    def commit(self, committed: list[int], pos: int, rows: list[int]) -> None:
        """Committed tokens (the first at ``pos + 1``) whose target rows were ``rows`` of the last
        batch (the first that of ``pos``): the drafter records their features (or skips them
        while it will not draft soon), every text source and the history move on."""
        if self.model is not None:
            self.model.record(committed, pos, rows)
        for source in self.texts:
            source.commit(committed)
        if self.lookup is not None:
            self.lookup.extend(committed)
            if self.shadow is not None:
                self.shadow.commit(committed)
