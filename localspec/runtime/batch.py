"""The rows of one target decode, gathered from every slot of a scheduler step.

Each generation (:class:`~localspec.runtime.generation.GenerationLoop`) adds its rows (a prompt
chunk, a plain step's one row, or a chain to verify) to a :class:`Batch` and remembers the offset
it got; the batch is decoded once (one ``llama_decode``); then each generation reads its logits at
its own rows (:class:`~localspec.runtime.verifier.Decoded`). A batch of one sequence 0 segment is
decoded exactly as a generation alone decodes it (the same rows, the same call).
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
        self.seqs: list[int] = []
        self.outputs: list[bool] = []
        self.segments: list[tuple[int, int, int, bool]] = []   # (seq, offset, start position, all logits)
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

    def decode(self) -> None:
        """One ``llama_decode`` of every row (none: nothing to do)."""
        if not self.tokens:
            return
        t0 = time.perf_counter()
        if len(self.segments) == 1 and self.segments[0][0] == 0:
            _, _, start, all_logits = self.segments[0]
            self.ctx.decode(self.tokens, start, all_logits=all_logits)
        else:
            self.ctx.decode_batch(self.tokens, self.positions, self.seqs, self.outputs)
        self.seconds = time.perf_counter() - t0

    def at(self, offset: int) -> Decoded:
        return Decoded(offset, self.seconds)
