"""Rows into the drafters' batches with the least Python per row: :class:`DirectRows`, a plain
``llama_batch`` over numpy buffers that llama.cpp converts to the same extended batch (one C call a
batch: the EAGLE kind's), and :class:`ExtRows`, the ``llama_batch_ext`` filled row by row (the
other kinds', whose rows may differ from a plain batch's).

The extended batch is an opaque C++ object: a row takes its C calls (add, embedding, position,
output). ``llama_decode`` / ``llama_encode`` build one from a plain batch (``llama_batch_compat``,
llama-batch.cpp: token and embedding row together, rows ``n_embd_inp`` or, encoding,
``n_embd_inp_enc`` wide) and run the same ``decode`` / ``encode`` on it, so where a kind's rows
have those widths a numpy-filled plain batch replaces the per-row calls. What a row need not cost is the Python around those calls: a ``llama_embd`` struct and a ctypes
pointer built per row (``ndarray.ctypes.data_as``: tens of µs on a loaded 2-core machine). Here one
struct per row width is kept and its data pointer rewritten in place (the row's address: the
array's base plus the row's offset), the position goes through one ``c_int32`` passed by a kept
reference, and each batch's rows are added in one loop with the C functions bound to locals.
llama.cpp copies a row's embedding into the batch when it is set, so the source array may change
or go after :meth:`ExtRows.tokens` / :meth:`ExtRows.embeddings` return.
"""

from __future__ import annotations

import ctypes
from typing import Sequence

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from . import hostloop


class ExtRows:
    """Fills ``batch`` (a ``llama_batch_ext *``) from 2-D arrays of embedding rows."""

    def __init__(self, batch) -> None:
        self.batch = batch
        self._pos = ctypes.c_int32(0)
        self._pos_ref = ctypes.byref(self._pos)
        self._embd: dict[int, tuple] = {}   # row width -> struct, its pointer cell, staging rows, address, stride

    def _staged(self, embd: np.ndarray) -> tuple[llama_cpp.llama_embd, ctypes.c_size_t, int, int]:
        """``embd``'s rows copied into the kept staging array of their width (its address is known
        once: no address lookup per batch), with that width's ``llama_embd`` and the cell aliasing
        its data pointer; (struct, pointer cell, first row's address, row stride)."""
        n, width = embd.shape
        kept = self._embd.get(width)
        if kept is None or kept[2].shape[0] < n:
            struct = kept[0] if kept is not None else llama_cpp.llama_embd(None, 1, width)
            stage = np.empty((max(n, 64), width), dtype=np.float32)
            kept = self._embd[width] = (struct, ctypes.c_size_t.from_address(ctypes.addressof(struct)), stage,
                                        stage.ctypes.data, stage.strides[0])
        kept[2][:n] = embd
        return kept[0], kept[1], kept[3], kept[4]

    def tokens(self, seqs: Sequence[int], tokens: Sequence[int], embd: np.ndarray, positions: Sequence[int],
               output: bool) -> int:
        """Row ``i``: token ``tokens[i]`` with embedding row ``embd[i]``, in sequence ``seqs[i]`` at
        ``positions[i]``, with its logits and state when ``output``. The last row's index."""
        batch, pos, pos_ref = self.batch, self._pos, self._pos_ref
        struct, address, base, stride = self._staged(embd)
        add, set_embd = llama_cpp.llama_batch_ext_add_token, llama_cpp.llama_batch_ext_set_embd_token
        set_pos, set_out = llama_cpp.llama_batch_ext_set_pos, llama_cpp.llama_batch_ext_set_output_logits
        idx = -1
        for i, tok in enumerate(tokens):
            idx = add(batch, seqs[i], tok)
            if idx < 0:
                raise LocalspecError(f"internal: drafter batch rejected a token ({idx})")
            address.value = base + i * stride
            if not set_embd(batch, idx, struct):
                raise LocalspecError("internal: drafter batch rejected an embedding row")
            pos.value = positions[i]
            set_pos(batch, idx, pos_ref)
            if output:
                set_out(batch, idx, True)
        return idx

    def embeddings(self, seqs: Sequence[int], embd: np.ndarray, positions: Sequence[int]) -> None:
        """Row ``i``: embedding row ``embd[i]`` alone (the encoder's input), in sequence ``seqs[i]``
        at ``positions[i]``, with its output."""
        batch, pos, pos_ref = self.batch, self._pos, self._pos_ref
        struct, address, base, stride = self._staged(embd)
        add, set_pos = llama_cpp.llama_batch_ext_add_embd, llama_cpp.llama_batch_ext_set_pos
        set_out = llama_cpp.llama_batch_ext_set_output_embd
        for i in range(embd.shape[0]):
            address.value = base + i * stride
            idx = add(batch, int(seqs[i]), struct)
            if idx < 0:
                raise LocalspecError(f"internal: drafter encode batch rejected a row ({idx})")
            pos.value = int(positions[i])
            set_pos(batch, idx, pos_ref)
            set_out(batch, idx, True)


class DirectRows:
    """Rows of a drafter batch in a plain ``llama_batch`` whose arrays are numpy buffers, filled by
    slice assignment and run by ONE C call (``llama_decode``, or ``llama_encode`` for embedding
    rows alone) instead of four per row: llama.cpp turns such a batch into the same extended batch
    (``llama_batch_compat``: a token id and an embedding row per row, its position, its sequence,
    its output flag) and runs the same ``decode`` / ``encode`` on it. Rows must be ``width`` wide:
    the context's ``n_embd_inp`` (token rows) or ``n_embd_inp_enc`` (embedding rows alone), which
    is what the kind using it checks (:attr:`~localspec.speculation.drafter.DrafterKind.direct`)."""

    def __init__(self, n_max: int, width: int, *, tokens: bool, ctx_ptr=None) -> None:
        self.n_max, self.width = n_max, width
        self.n = 0   # the rows filled, which :meth:`run` runs
        self.token = np.zeros(n_max, dtype=np.int32)
        self.embd = np.zeros((n_max, width), dtype=np.float32)
        self.pos = np.zeros(n_max, dtype=np.int32)
        self.n_seq = np.ones(n_max, dtype=np.int32)
        self.seq = np.zeros(n_max, dtype=np.int32)
        self.out = np.zeros(n_max, dtype=np.int8)
        seq_p = ctypes.POINTER(llama_cpp.llama_seq_id)
        base = self.seq.ctypes.data
        self._seq_ids = (seq_p * n_max)(*[ctypes.cast(base + 4 * i, seq_p) for i in range(n_max)])

        def ptr(a: np.ndarray, t):
            return ctypes.cast(a.ctypes.data, ctypes.POINTER(t))
        self.batch = llama_cpp.llama_batch(0, ptr(self.token, llama_cpp.llama_token) if tokens else None,
                                           ptr(self.embd, ctypes.c_float), ptr(self.pos, llama_cpp.llama_pos),
                                           ptr(self.n_seq, ctypes.c_int32),
                                           ctypes.cast(self._seq_ids, ctypes.POINTER(seq_p)),
                                           ptr(self.out, ctypes.c_int8))
        self.address = ctypes.addressof(self.batch)   # the batch as C code is handed it (llama.hostloop)
        # token rows are decoded, embedding rows alone encoded (the encoder's input), in the context ctx_ptr
        self._run = hostloop.batch_runner(ctx_ptr, self.batch, encode=not tokens) if ctx_ptr is not None else None

    def run(self) -> int:
        """``llama_decode`` of the filled rows (``llama_encode`` of embedding rows alone) in the
        context given at construction, in one C call where built; llama.cpp's return code."""
        if self._run is None:
            raise LocalspecError("internal: direct rows with no context to run in")
        return self._run(self.n)

    def rows(self, n: int) -> int:
        """``n`` rows are what the next call reads (filled through the arrays); the last row's index."""
        if not 0 < n <= self.n_max:
            raise LocalspecError(f"internal: {n} drafter rows for a batch of {self.n_max}")
        self.n = self.batch.n_tokens = n
        return n - 1

    def fill(self, seqs: Sequence[int], tokens: Sequence[int], embd: np.ndarray, positions: Sequence[int],
             output: bool) -> int:
        """Row ``i``: token ``tokens[i]`` with embedding row ``embd[i]``, in sequence ``seqs[i]`` at
        ``positions[i]``, with its logits and state when ``output``. The last row's index."""
        n = len(tokens)
        idx = self.rows(n)
        if embd.shape != (n, self.width):
            raise LocalspecError(f"internal: drafter rows of shape {embd.shape}, expected ({n}, {self.width})")
        self.token[:n], self.seq[:n], self.pos[:n] = tokens, seqs, positions
        self.embd[:n] = embd
        self.out[:n] = output
        return idx

    def fill_one(self, seq: int, token: int, embd: np.ndarray, position: int) -> int:
        """:meth:`fill` of one row with its output (a chain step); ``embd``: that row, 1-D or (1, width)."""
        if embd.size != self.width:
            raise LocalspecError(f"internal: a drafter row of shape {embd.shape}, expected {self.width} wide")
        self.n = self.batch.n_tokens = 1
        self.token[0], self.seq[0], self.pos[0], self.out[0] = token, seq, position, 1
        self.embd[0] = embd.reshape(self.width)
        return 0

    def refill_one(self, token: int, position: int) -> None:
        """After :meth:`fill_one`: the same row with another token and position (its embedding
        row, ``embd[0]``, rewritten in place by the caller)."""
        self.token[0], self.pos[0] = token, position

    def fill_embeddings(self, seqs: Sequence[int], embd: np.ndarray, positions: Sequence[int]) -> None:
        """Row ``i``: embedding row ``embd[i]`` alone (the encoder's input), in sequence
        ``seqs[i]`` at ``positions[i]``, with its output."""
        n = embd.shape[0]
        self.rows(n)
        self.embd[:n] = embd
        self.pos[:n] = positions
        self.seq[:n] = seqs
        self.out[:n] = 1
