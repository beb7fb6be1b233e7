"""The rows of one target decode, gathered from every slot of a scheduler step.

Each generation (:class:`~localspec.runtime.generation.GenerationLoop`) adds its rows (a prompt
chunk, a plain step's one row, a chain to verify, or a draft tree whose rows each belong to several
sequences, :meth:`Batch.add_sets`) to a :class:`Batch` and remembers the offset it got; the batch is decoded once (one ``llama_decode``); then each generation reads its logits at
its own rows (:class:`~localspec.runtime.verifier.Decoded`). A batch of one sequence 0 segment is
decoded exactly as a generation alone decodes it (the same rows, the same call).

``rows_match`` (:class:`~localspec.runtime.engine.Engine`; the context's ``pad_single``: the
positions where it applies): a batch of one row is decoded as two, the second a filler at the next
position that is dropped at once. llama.cpp's CPU attention takes another path for a single query
row once the KV view reaches 512 cells (ggml-cpu ``ops.cpp``, ``use_split_kv_path``: the cells
split across threads, their partial sums reduced; the view is the used cells rounded up to 256,
llama-kv-cache.cpp ``get_n_kv``), so plain steps
round differently from the rows of a verify batch; two rows keep every step on the path verify
rows take. Measured on SmolLM2 Q4_0, a ~970-token context, 2 threads: rows of 2-32-row verifies
then equal plain steps bit for bit (max logit difference 0, against 0.7-0.9 and argmax flips
without). The price: on long contexts the split path is the faster one, and a padded step there
cost ~1.46 one-row steps (docs/speculation.md#exactness).
"""

from __future__ import annotations

import time
from typing import Sequence

from .verifier import Decoded


class Batch:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.seqs: list[int | list[int]] = []   # a row's sequence, or its sequences (a tree's rows)
        self.outputs: list[bool] = []
        self.segments: list[tuple[int, int, int, bool]] = []   # (seq, offset, start position, all logits)
        self.sets = False     # some row belongs to several sequences (a draft tree's)
        self.promised = 0     # rows (each with logits) held for chains still being drafted
        self.seconds = 0.0

    @property
    def rows(self) -> int:
        return len(self.tokens)

    @property
    def logit_rows(self) -> int:
        return sum(self.outputs)

    def rows_left(self) -> int:
        return self.ctx.n_batch - len(self.tokens) - self.promised

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
        self.segments.append((seqs[0][0], offset, positions[0], True))
        self.sets = True
        return offset

    def decode(self) -> None:
        """One ``llama_decode`` of every row (none: nothing to do)."""
        if not self.tokens:
            return
        t0 = time.perf_counter()
        pad = self.ctx.pad_single
        if self.sets:
            self.ctx.decode_sets(self.tokens, self.positions, [s if isinstance(s, list) else [s] for s in self.seqs],
                                 self.outputs)
        elif len(self.tokens) == 1 and pad is not None and self.positions[0] in pad:
            self._decode_padded()
        elif len(self.segments) == 1 and self.segments[0][0] == 0:
            _, _, start, all_logits = self.segments[0]
            self.ctx.decode(self.tokens, start, all_logits=all_logits)
        else:
            self.ctx.decode_batch(self.tokens, self.positions, self.seqs, self.outputs)
        self.seconds = time.perf_counter() - t0

    def _decode_padded(self) -> None:
        """One row decoded as two (``rows_match``): a filler after it, without logits, then dropped."""
        seq, pos = self.seqs[0], self.positions[0]
        self.ctx.decode_batch(self.tokens * 2, [pos, pos + 1], [seq, seq], [True, False])
        self.ctx.seq_rm(pos + 1, seq=seq)

    def at(self, offset: int) -> Decoded:
        return Decoded(offset, self.seconds)
