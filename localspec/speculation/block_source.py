"""The block drafters as draft sources: DFlash (``--source dflash``) and DSpark (``--source
dspark``), drafting a whole block in one drafter decode (:mod:`.dflash`).

A cycle injects the rows committed since the last one, decodes one block and proposes its
drafts, cut to the ``k`` the policy asked for, at the first row under ``p_min`` confidence
(draft-dflash's rule: the row's top-10 probability; DSpark's confidence head where it has one),
and at the first token a grammar forbids. The auto policy prices the cycle as one drafter decode
whatever its length (``DraftPolicy.block``), and with DSpark's confidence head verifies only the
prefix whose expected accepted tokens pay for its rows (:meth:`DraftPolicy.worthwhile_prefix`).

Each files its cycles under its own name and statistics class (``dflash``, ``dspark``), as every
model source does.
"""

from __future__ import annotations

from .model_source import DRAFTER_PRIOR, EagleSource, allowed_chain
from .sources import Draft, DraftChain, SourceContext


class DFlashSource(EagleSource):
    """A DFlash drafter's blocks (:class:`~.dflash.BlockDrafter`)."""

    name = "dflash"
    classes = (("drafter", DRAFTER_PRIOR),)

    @classmethod
    def create(cls, ctx: SourceContext) -> "DFlashSource | None":
        if ctx.drafter is None or not getattr(ctx.drafter, "block", False):
            return None
        return cls(ctx.drafter, ctx.policy, ctx.calibration, ctx.grammar)

    def cost(self, k: int, cost_model=None) -> float:
        """One block decode, whatever ``k`` (the calibrated drafter step is a block's)."""
        return getattr(cost_model, "drafter_step", None) or 0.0

    def propose(self, k: int, room: int, n_past: int, batched: bool = False) -> Draft | DraftChain:
        """Inject the committed rows, decode one block, propose its drafts up to ``k``: a full
        block under auto (the drafter was trained on it), ``k`` rows under ``fixed`` (as
        draft-dflash's ``--draft-max``)."""
        policy, drafter = self.policy, self.drafter
        t0 = drafter.seconds
        depth = min(k, room, drafter.max_depth)
        tokens, confidence = drafter.draft_block(depth if policy.fixed else drafter.max_depth)
        tokens, confidence = tokens[:depth], confidence[:depth]
        keep = len(tokens)
        if not policy.fixed:
            keep = next((i for i, p in enumerate(confidence) if not policy.keep_drafting(p)), keep)
            if drafter.confidence_head:
                keep = min(keep, policy.worthwhile_prefix(confidence[:keep]))
        tokens = allowed_chain(self.grammar, tokens[:keep])
        return Draft(tokens, self.name, steps=1, seconds=drafter.seconds - t0,
                     confidence=confidence[:len(tokens)])


class DSparkSource(DFlashSource):
    """A DSpark drafter's blocks: DFlash's, with the Markov head inside llama.cpp's graph and the
    confidence head's values as the drafts' confidences."""

    name = "dspark"
    classes = (("drafter", DRAFTER_PRIOR),)
