"""The rows of one target decode, gathered from every slot of a scheduler step.

Each generation (:class:`~localspec.runtime.generation.Generation`) adds its rows (a prompt
chunk, a plain step's one row, a chain to verify, or a draft tree whose rows each belong to several
sequences, :meth:`Batch.add_sets`) to a :class:`Batch` and remembers the offset it got; the batch is decoded once (one ``llama_decode``); then each generation reads its logits at
its own rows (:class:`~localspec.runtime.verifier.Decoded`). A batch of one sequence 0 segment is
decoded exactly as a generation alone decodes it (the same rows, the same call).

``rows_match`` (exact mode: a generation's ``GenerationConfig.rows_match``, or the engine's
default; a batch is exact when any of its generations is): every row of the batch takes ggml-cpu's
one-row-at-a-time flash attention (``ops.cpp``, ``ggml_compute_forward_flash_attn_ext_f16_one_chunk``),
whose result for a row depends only on that row's sequence's cells, not on the other rows of the
batch nor on where the cache put other sequences' cells. Two other paths round otherwise:

- a single query row over a KV view of 512 cells or more is split across the threads, its partial
  sums reduced (``use_split_kv_path``; the view is the used cells of every sequence rounded up to 256,
  llama-kv-cache.cpp ``get_n_kv``): an exact batch of one row is decoded as two, the second a filler
  at the next position that is dropped at once (the context's ``pad_single``: the positions where
  the view may reach 512 cells);
- a batch of 64 query rows or more (every sequence's rows together: a prompt chunk, another slot's
  verify) is tiled over 64-row query blocks and KV blocks at fixed cell boundaries: an exact batch
  holds at most ``TILED_ROWS - 1`` rows (:meth:`Batch.rows_left`), so prompts go in in chunks of 63.

Rows of an exact batch then equal plain steps bit for bit. The price: on long contexts the split
path is the faster one, so a padded step costs more than a one-row step (measured:
docs/speculation.md, "Exactness").
"""

from __future__ import annotations

import time
from typing import Sequence

from ..llama.contexts import TILED_ROWS
from .verifier import Decoded


class Batch:
    def __init__(self, ctx, *, exact: bool = False) -> None:
        self.ctx = ctx
        self.exact = exact    # rows_match: every row on the one-row attention path (see above)
        self.capacity = min(ctx.n_batch, TILED_ROWS - 1) if exact else ctx.n_batch
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.seqs: list[int | list[int]] = []   # a row's sequence, or its sequences (a tree's rows)
        self.outputs: list[bool] = []
        self.logit_rows = 0   # rows with logits (outputs that are True)
        self.segments: list[tuple[int, int, int, bool]] = []   # (seq, offset, start position, all logits)
        self.sets = False     # some row belongs to several sequences (a draft tree's)
        self.promised = 0     # rows (each with logits) held for chains still being drafted
        self.chain = None     # (draft, its first draft's row, rows it fills): a planned chain drafted in decode
        self.seconds = 0.0

    @property
    def rows(self) -> int:
        return len(self.tokens)

    def rows_left(self) -> int:
        return self.capacity - len(self.tokens) - self.promised

    def outputs_left(self) -> int:
        return self.ctx.n_outputs_max - self.logit_rows - self.promised

    def add(self, seq: int, tokens: Sequence[int], start: int, *, all_logits: bool) -> int:
        """Rows ``tokens`` of sequence ``seq`` at positions ``start..``, logits for every row or
        only the last; the first row's index in the batch."""
        offset, n = len(self.tokens), len(tokens)
        self.tokens.extend(tokens)
        self.positions.extend(range(start, start + n))
        self.seqs.extend([seq] * n)
        self.outputs.extend([all_logits] * (n - 1) + [True])
        self.logit_rows += n if all_logits else 1
        self.segments.append((seq, offset, start, all_logits))
        return offset

    def add_sets(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[Sequence[int]]) -> int:
        """Rows each of several sequences (as ``llama_batch`` allows: a draft tree's rows, each in
        the sequences of the leaves below it), at their own positions, logits for every row; the
        first row's index in the batch."""
        offset = len(self.tokens)
        self.tokens.extend(tokens)
        self.positions.extend(positions)
        self.seqs.extend(list(s) for s in seqs)
        self.outputs.extend([True] * len(tokens))
        self.logit_rows += len(tokens)
        self.segments.append((seqs[0][0], offset, positions[0], True))
        self.sets = True
        return offset

    def draft_at(self, draft, row: int, n: int) -> None:
        """``draft``'s planned chain (``Draft.planned``) fills rows ``row..row + n - 1``: its
        drafts, then its last draft again (a verify's filler rows). It is drafted in :meth:`decode`,
        right before the target's decode, so that no return through the plan's frames runs between
        the drafter's decodes and the target's."""
        self.chain = (draft, row, n)

    def decode(self) -> None:
        """One ``llama_decode`` of every row (none: nothing to do), a planned chain drafted first."""
        if not self.tokens:
            return
        if self.chain is not None and self._draft_chain():
            return
        t0 = time.perf_counter()
        pad = self.ctx.pad_single
        if self.sets:
            self.ctx.decode_sets(self.tokens, self.positions, [s if isinstance(s, list) else [s] for s in self.seqs],
                                 self.outputs)
        elif self.exact and len(self.tokens) == 1 and pad is not None and self.positions[0] in pad:
            self._decode_padded()
        elif len(self.segments) == 1 and self.segments[0][0] == 0:
            _, _, start, all_logits = self.segments[0]
            self.ctx.decode(self.tokens, start, all_logits=all_logits)
        else:
            self.ctx.decode_batch(self.tokens, self.positions, self.seqs, self.outputs)
        self.seconds = time.perf_counter() - t0

    def _draft_chain(self) -> bool:
        """The planned chain drafted, its drafts into its rows; where the batch is sequence 0's
        rows alone, its decode runs in the chain's own C call, right after the drafter's last
        decode: True, the batch is decoded."""
        draft, row, n = self.chain
        seq, _, start, all_logits = self.segments[0]
        then = (self.ctx.decode_call(self.tokens, start, all_logits=all_logits)
                if len(self.segments) == 1 and seq == 0 else None)
        drafts, decoded = draft.planned.run(draft, None if then is None else (*then, row, n))
        if decoded is not None:
            self.ctx.decoded(len(self.tokens), decoded[0])
            self.seconds = decoded[1]
            return True
        k = len(drafts)
        self.tokens[row:row + k] = drafts
        self.tokens[row + k:row + n] = [drafts[-1]] * (n - k)
        return False

    def _decode_padded(self) -> None:
        """One row decoded as two (``rows_match``): a filler after it, without logits, then dropped."""
        seq, pos = self.seqs[0], self.positions[0]
        self.ctx.decode_batch(self.tokens * 2, [pos, pos + 1], [seq, seq], [True, False])
        self.ctx.seq_rm(pos + 1, seq=seq)

    def at(self, offset: int) -> Decoded:
        return Decoded(offset, self.seconds)
