"""The target side of a generation: its context, what its KV cache holds, the prompt's and the drafts' rows.

The committed text of a generation is ``kv_tokens`` (their KV rows are valid, positions
``0..len-1``), then ``uncached`` (committed, not in the cache: the part of a tree's accepted path
that could not keep its rows), then ``last`` at position ``n_past`` (the target's newest choice).
Each verify reads ``uncached + [last] + drafts``, decoded in one batch, accepts the longest prefix of
drafts the target agrees with (greedy: argmax; sampling: the rejection rule of
:mod:`localspec.runtime.sampling`), trims the cache to what was committed and moves on.

One verifier keeps one sequence of the target context (``seq``; a slot of
:mod:`localspec.runtime.scheduler`), within its own ``n_ctx`` positions. It decodes nothing
itself: the rows :meth:`TargetVerifier.chain_rows` (or :meth:`~TargetVerifier.prefill_chunk`,
:meth:`~TargetVerifier.tree_rows`) name go into a step's batch (:mod:`localspec.runtime.batch`),
and once it is decoded the verifier reads them where they sat (:class:`Decoded`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..core.errors import LocalspecError
from ..speculation import tree
from .prompt_cache import common_prefix
from .recurrent import exact_start
from .sampling import Sampler

EVERY = 2**62   # TargetVerifier.exact_upto: every position (none written otherwise)


@dataclass(slots=True)
class Decoded:
    """Where one sequence's rows sat in a batch decoded for several: the first row's index, and
    the decode's seconds."""

    offset: int
    seconds: float


@dataclass(frozen=True)
class TreeLayout:
    """A draft tree's rows for one decode (:meth:`TargetVerifier.tree_rows`): tokens, positions,
    each row's sequences (those of the leaves below it), each node's row counted from the first,
    and the tree's leaf sets."""

    tokens: list[int]
    positions: list[int]
    seqs: list[list[int]]
    row_of: dict[int, int]
    sets: list[list[int]]


@dataclass
class Verified:
    """One target verification: the committed tokens and where their rows were in the batch."""

    pos: int                # position of the batch's ``last`` token (the first row recorded)
    tokens: list[int]       # accepted drafts, then the target's own next token
    rows: list[int]         # batch rows of ``last`` and of each accepted draft
    drafted: int            # drafts verified (a tree: its nodes)
    batch: int              # rows in the target batch
    seconds: float          # time of the verification
    path: list[int] = field(default_factory=list)   # a tree's accepted nodes

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1

    @property
    def drafts(self) -> list[int]:
        """The accepted drafts."""
        return self.tokens[:-1]

    @property
    def correction(self) -> int:
        """The target's token after the accepted drafts."""
        return self.tokens[-1]

    @property
    def logit_rows(self) -> list[int]:
        """Rows whose logits chose each committed token (a plain step's: ``last``'s, the last row
        of its chain)."""
        return self.rows


class TargetVerifier:
    """Owns the target context's KV bookkeeping across generations (prompt prefix reuse)."""

    def __init__(self, model, ctx, *, seq: int = 0, n_ctx: int | None = None) -> None:
        self.model, self.ctx = model, ctx
        self.seq = seq                  # this verifier's sequence in the target context
        self.n_ctx = n_ctx or ctx.n_ctx  # positions this sequence may fill
        self.kv_tokens: list[int] = []  # tokens whose target KV rows are valid, positions 0..len-1
        self.drafter_pairs = 0          # drafter pairs for positions 0..n-1 are written or recorded
        # positions 0..exact_upto-1 were written by rows of an exact generation (``rows_match``: every
        # row on one attention path), which an exact generation may reuse; beyond, it decodes again
        self.exact_upto = EVERY
        # the generation under way
        self.n_past = 0                 # position of ``last``
        self.last = -1                  # the newest committed token, not yet in the KV cache
        self.uncached: list[int] = []   # committed tokens before ``last``, not in the KV cache either
        self._drafter = None            # the drafter recording this generation's rows, if any
        self._prompt: list[int] | None = None   # a prompt being prefilled (chunk by chunk)
        self._fill = 0                  # its next position to decode
        # a prompt is under way (begin), its first token not chosen yet: an attribute, read every step
        self.prefilling = False

    def room(self) -> int:
        """Most drafts the next batch can hold: free context, and rows with logits in one batch."""
        room = min(self.n_ctx - 1 - self.n_past, self.ctx.n_outputs_max - 1 - len(self.uncached))
        return room if self.ctx.rollback is None else min(room, self.ctx.rollback)   # a recurrent state

    # -- prompt ----------------------------------------------------------------------------------
    def begin(self, prompt: list[int], drafter=None, *, exact: bool = False) -> None:
        """Start a generation from ``prompt``: keep the cached prefix, drop the rest of the
        sequence; :meth:`prefill_chunk` and :meth:`prefill_done` then decode the rest. ``exact``
        (``rows_match``): keep only a prefix that exact rows wrote."""
        n = len(prompt)
        common = common_prefix(self.kv_tokens, prompt)
        if exact:
            common = min(common, self.exact_upto)
        # Keep at least one prompt token to decode: its logits choose the first token.
        start = keep = min(common, n - 1)
        self.drafter_pairs = min(self.drafter_pairs, max(0, start - 1))
        if drafter is not None:
            # The drafter's pair at P holds the token at P+1, so its last cached pair is only
            # valid below the first differing token; and it may lag (a run with spec off).
            start = max(0, min(start, common - 1, self.drafter_pairs))
        start, restart = exact_start(self.ctx, self.seq, start, keep)   # a recurrent state (runtime.recurrent)
        if restart or start == 0:
            self.drafter_pairs = start
        if drafter is not None:
            drafter.begin(prompt, 0 if restart else start)
        self.ctx.seq_rm(start, seq=self.seq)
        self.kv_tokens = prompt[:start]
        self.exact_upto = EVERY if exact else min(self.exact_upto, start)
        self._drafter = drafter
        self._prompt, self._fill = prompt, start
        self.prefilling = True

    def prefill_chunk(self, budget: int) -> tuple[list[int], int]:
        """The prompt's next rows to decode (at most ``budget``) and the first one's position; only
        the prompt's last row needs logits."""
        return self._prompt[self._fill: self._fill + budget], self._fill

    def prefill_done(self, n_rows: int, sampler: Sampler, offset: int = 0) -> int:
        """After the decode of the :meth:`prefill_chunk` rows (the first at batch row ``offset``):
        the first generated token once the whole prompt is in, else -1."""
        prompt, pos = self._prompt, self._fill
        n, end = len(prompt), pos + n_rows
        self.kv_tokens = prompt[:end]
        first = sampler.choose_at(self.ctx, offset + n_rows - 1) if end == n else -1
        drafter = self._drafter
        if drafter is not None:
            nxt = prompt[pos + 1: end + 1] if end < n else prompt[pos + 1: n] + [first]
            drafter.observe(nxt, n_rows, pos, list(range(offset, offset + n_rows)) if offset else None)
            self.drafter_pairs = end
        self._fill = end
        if end == n:
            self._prompt = None
            self.prefilling = False
            self.n_past, self.last, self.uncached = n, first, []
        return first

    # -- verification ----------------------------------------------------------------------------
    def chain_rows(self, drafts: list[int], rows: int = 0) -> tuple[list[int], int]:
        """The rows that verify ``drafts``: ``uncached + [last] + drafts`` and filler rows up to
        ``rows`` (where the cost model finds that size cheaper, as far as the context and the logit
        rows allow), and the first one's position. Every row wants logits when
        there are drafts, else only the last."""
        base, n_past = len(self.uncached), self.n_past
        chain = [self.last] + drafts
        room = min(self.n_ctx - 1 - n_past - len(drafts), self.ctx.n_outputs_max - base - len(chain))
        pad = max(0, min(rows - len(chain), room)) if drafts else 0
        return self.uncached + chain + [chain[-1]] * pad, n_past - base

    def verify(self, drafts: list[int], sampler: Sampler, decoded: Decoded, n_rows: int) -> Verified:
        """After the decode of the ``n_rows`` rows :meth:`chain_rows` gave for ``drafts`` (the first
        at batch row ``decoded.offset``): accept the drafts the target agrees with (none: a plain
        decoding step with something uncached); filler rows' cells go with the rejected ones'."""
        ctx = self.ctx
        base, n_past = len(self.uncached), self.n_past
        t0, at = time.perf_counter() - decoded.seconds, decoded.offset
        accepted, correction = 0, -1
        padded = n_rows > base + 1 + len(drafts)
        if drafts and sampler.plain_greedy:   # the rows' argmaxes up to the first disagreement, the rest dropped: one call
            best = ctx.argmax_rows(at + base, len(drafts) + 1, drafts, trim=(self.seq, n_past + 1, padded))
            accepted, correction = len(best) - 1, best[-1]
        else:
            for i, d in enumerate(drafts):
                ok, tok = sampler.verify_at(ctx, at + base + i, d, drafts[:i])
                if not ok:
                    correction = tok
                    break
                accepted += 1
            if correction < 0:
                correction = sampler.choose_at(ctx, at + base + len(drafts) if drafts else at + n_rows - 1, drafts)
            if accepted < len(drafts) or padded:
                ctx.seq_rm(n_past + accepted + 1, seq=self.seq)
        seconds = time.perf_counter() - t0
        result = Verified(n_past, drafts[:accepted] + [correction], list(range(at + base, at + base + accepted + 1)),
                          len(drafts), n_rows, seconds)
        self._advance(result, kept=accepted)
        return result

    def step(self, sampler: Sampler, offset: int, decoded_seconds: float) -> tuple[int, float]:
        """A plain decoding step, ``verify([])`` with nothing uncached, without the bookkeeping of
        drafts (the hot path where nothing is drafted): after the decode of ``last`` (at batch row
        ``offset``, ``decoded_seconds`` the decode's), choose the token after it; (that token, seconds)."""
        t0 = time.perf_counter() - decoded_seconds
        tok = self.ctx.argmax(offset) if sampler.plain_greedy else sampler.choose_at(self.ctx, offset)
        seconds = time.perf_counter() - t0
        self.kv_tokens.append(self.last)
        self.n_past += 1
        self.last = tok
        if self._drafter is not None:
            self.drafter_pairs = self.n_past
        return tok, seconds

    def tree_rows(self, draft_tree: tree.DraftTree) -> "TreeLayout":
        """The rows that verify ``uncached + [last]`` and the tree (depth-first, most probable
        chain first) in one target decode, each in the sequences of the leaves below it; every
        leaf's sequence is made to see the committed prefix first. :meth:`settle_tree` follows
        the target's choices down the tree once they are decoded.

        Only an accepted path that fills the rows right after ``last`` keeps its KV rows in place:
        the cells of rejected rows before an accepted one would be refilled later by later
        positions, and attention over cells out of position order sums in another order (on
        SmolLM2 that alone moves logits by up to ~0.8). The rest of the path goes back into the
        next batch (``uncached``), so the cache always reads as plain decoding wrote it."""
        ctx = self.ctx
        if self.seq != 0:
            raise LocalspecError("internal: draft trees are verified on sequence 0 only")
        base, n_past = len(self.uncached), self.n_past
        sets = draft_tree.leaf_sets()
        order = draft_tree.preorder()
        n_leaves = len(sets[0])
        for s in range(1, n_leaves + 1):  # every leaf's sequence sees the committed prefix (only it)
            ctx.seq_rm(-1, -1, seq=s)
            ctx.seq_cp(0, s)
        head = [1 + x for x in sets[0]]
        return TreeLayout(
            self.uncached + [self.last] + [draft_tree.tokens[i] for i in order],
            list(range(n_past - base, n_past + 1)) + [n_past + draft_tree.depths[i] for i in order],
            [head] * (base + 1) + [[1 + x for x in sets[i + 1]] for i in order],
            {node: base + 1 + r for r, node in enumerate(order)}, sets)

    def settle_tree(self, draft_tree: tree.DraftTree, layout: "TreeLayout", sampler: Sampler,
                    decoded: Decoded) -> Verified:
        """After the decode of :meth:`tree_rows` (the first at batch row ``decoded.offset``):
        follow the target's choices down the tree, keep the accepted path's rows that may stay,
        free the leaves' sequences."""
        ctx = self.ctx
        base, n_past, sets = len(self.uncached), self.n_past, layout.sets
        t0 = time.perf_counter() - decoded.seconds
        row_of = {node: decoded.offset + row for node, row in layout.row_of.items()}
        try:
            path, correction = tree.walk(draft_tree, self._tree_chooser(draft_tree, row_of, sampler, decoded.offset))
            kept = 0
            while kept < len(path) and row_of[path[kept]] == decoded.offset + base + 1 + kept:
                kept += 1
            leaf = 1 + sets[path[-1] + 1 if path else 0][0]  # its sequence holds the whole path
            ctx.seq_cp(leaf, 0, n_past - base, n_past + kept + 1)
        finally:
            for s in range(1, len(sets[0]) + 1):  # frees the other rows' cells
                ctx.seq_rm(-1, -1, seq=s)
        seconds = time.perf_counter() - t0
        result = Verified(n_past, [draft_tree.tokens[i] for i in path] + [correction],
                          [decoded.offset + base] + [row_of[i] for i in path], len(draft_tree),
                          base + len(draft_tree) + 1, seconds, path)
        self._advance(result, kept=kept)
        return result

    def _tree_chooser(self, draft_tree: tree.DraftTree, row_of: dict[int, int], sampler: Sampler, offset: int):
        base = offset + len(self.uncached)
        tokens = draft_tree.tokens

        def choose(node: int) -> int:  # the target's token after ``node``, its path before it
            after = [tokens[i] for i in draft_tree.path_to(node)] if sampler.needs_context else ()
            return sampler.choose_at(self.ctx, base if node < 0 else row_of[node], after)
        return choose

    def _advance(self, v: Verified, *, kept: int) -> None:
        """The batch's first ``kept`` accepted drafts keep their KV rows; the rest of the
        accepted ones become ``uncached``; the target's own token becomes ``last``."""
        base = len(self.uncached)
        del self.kv_tokens[v.pos - base:]
        self.kv_tokens.extend(self.uncached + [self.last] + v.drafts[:kept])
        self.uncached = v.drafts[kept:]
        self.n_past += v.accepted + 1
        self.last = v.correction
        if self._drafter is not None:
            self.drafter_pairs = self.n_past

    # -- cache -----------------------------------------------------------------------------------
    def loaded(self, tokens: list[int], drafter_pairs: int, exact_upto: int = 0) -> None:
        """The sequence's cells were loaded with ``tokens``' rows (positions 0..); the drafter
        counts its pairs below ``drafter_pairs`` as written or skipped (see runtime.prompt_cache);
        ``exact_upto``: of them, the rows exact rows wrote."""
        self.kv_tokens = list(tokens)
        self.drafter_pairs = drafter_pairs
        self.exact_upto = exact_upto

    def forget(self) -> None:
        """Empty the target KV cache (the drafter's pairs count as gone too)."""
        self.ctx.seq_rm(0, seq=self.seq)
        self.kv_tokens = []
        self.drafter_pairs = 0
        self.exact_upto = EVERY
