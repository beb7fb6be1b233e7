"""Batched greedy generation: many sequences per llama.cpp decode.

One context with ``n_seq_max = B`` (one KV stream per sequence, ``kv_unified`` off so attention of
each sequence only spans its own cells), one ``llama_batch`` whose rows carry their own ``seq_id``.
Each step decodes one token for every active sequence; a finished slot (EOS or length) is cleared
and refilled with the next prompt, whose prefill rides in the same decode as the others' tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import llama_cpp
import numpy as np

from ..errors import LocalspecError
from ..llama_model import Model, _llama_failure, default_threads


@dataclass
class GenRequest:
    key: str
    tokens: list[int]


@dataclass
class GenResult:
    key: str
    prompt: list[int]
    response: list[int]
    finish: str  # "stop" or "length"


class MultiSeqContext:
    """A llama.cpp context decoding up to ``n_seq`` independent sequences, one batch per step."""

    def __init__(self, model: Model, *, n_seq: int, n_ctx_seq: int, n_batch: int = 512,
                 n_threads: int | None = None, unified: bool = False) -> None:
        self.model = model
        self.n_seq = n_seq
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_seq * n_ctx_seq
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.kv_unified = unified
        threads = n_threads or default_threads()
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self.ptr = llama_cpp.llama_init_from_model(model.ptr, params)
        if not self.ptr:
            raise _llama_failure(f"llama.cpp could not create a {n_seq}-sequence context for {model.path.name}")
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx(self.ptr)) // n_seq
        self.n_batch = n_batch
        self.memory = llama_cpp.llama_get_memory(self.ptr)
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))[:] = 1

    def decode(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """rows: (seq, token, pos, wants_logits); read a row's logits with :meth:`logits` (its batch index)."""
        n = len(rows)
        if n > self.n_batch:
            raise LocalspecError(f"internal: batch of {n} exceeds n_batch {self.n_batch}")
        for i, (seq, tok, pos, out) in enumerate(rows):
            self._tok[i] = tok
            self._pos[i] = pos
            self._out[i] = 1 if out else 0
            self._batch.seq_id[i][0] = seq
        self._batch.n_tokens = n
        rc = llama_cpp.llama_decode(self.ptr, self._batch)
        if rc != 0:
            raise _llama_failure(f"llama_decode failed (code {rc})")

    def logits(self, row: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, row)
        if not ptr:
            raise _llama_failure("llama.cpp returned no logits")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def clear_seq(self, seq: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, seq, -1, -1)

    def close(self) -> None:
        if self.ptr:
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


@dataclass
class _Slot:
    req: GenRequest
    pending: list[int]      # prompt tokens not yet decoded
    pos: int                # next position to write
    response: list[int]
    last: int = -1          # chosen token not yet decoded


def generate_batched(model: Model, requests: Iterable[GenRequest], *, n_seq: int = 8, max_new: int = 256,
                     n_ctx_seq: int = 1024, n_threads: int | None = None,
                     on_result: Callable[[GenResult], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> Iterator[GenResult]:
    """Greedy responses to ``requests``, ``n_seq`` at a time; yields results as sequences finish.

    Prompts longer than ``n_ctx_seq - 16`` are skipped (logged as finish "skipped")."""
    ctx = MultiSeqContext(model, n_seq=n_seq, n_ctx_seq=n_ctx_seq, n_batch=max(512, n_seq), n_threads=n_threads)
    it = iter(requests)
    slots: list[_Slot | None] = [None] * n_seq
    prefill_budget = ctx.n_batch - n_seq

    def refill(i: int) -> None:
        while True:
            req = next(it, None)
            if req is None:
                slots[i] = None
                return
            if len(req.tokens) + 16 > ctx.n_ctx_seq:
                yield_later.append(GenResult(req.key, req.tokens, [], "skipped"))
                continue
            ctx.clear_seq(i)
            slots[i] = _Slot(req, list(req.tokens), 0, [])
            return

    yield_later: list[GenResult] = []
    try:
        for i in range(n_seq):
            refill(i)
        while any(s is not None for s in slots):
            if should_stop is not None and should_stop():
                return
            rows: list[tuple[int, int, int, bool]] = []
            owners: list[tuple[int, int]] = []   # (batch row, slot whose next token that row's logits choose)
            budget = prefill_budget
            for i, s in enumerate(slots):
                if s is None:
                    continue
                if s.pending:
                    take = s.pending[:max(1, budget)] if budget > 0 else []
                    if not take:
                        continue
                    budget -= len(take)
                    del s.pending[:len(take)]
                    for j, tok in enumerate(take):
                        last_row = not s.pending and j == len(take) - 1
                        rows.append((i, tok, s.pos, last_row))
                        s.pos += 1
                        if last_row:
                            owners.append((len(rows) - 1, i))
                else:
                    rows.append((i, s.last, s.pos, True))
                    s.pos += 1
                    owners.append((len(rows) - 1, i))
            ctx.decode(rows)
            for row, i in owners:
                s = slots[i]
                tok = int(np.argmax(ctx.logits(row)))
                done = None
                if model.is_eog(tok):
                    done = "stop"
                else:
                    s.response.append(tok)
                    s.last = tok
                    if len(s.response) >= max_new or s.pos + 1 >= ctx.n_ctx_seq:
                        done = "length"
                if done:
                    result = GenResult(s.req.key, list(s.req.tokens), s.response, done)
                    if on_result:
                        on_result(result)
                    yield result
                    refill(i)
            while yield_later:
                yield yield_later.pop()
        while yield_later:
            yield yield_later.pop()
    finally:
        ctx.close()


def measure_throughput(model: Model, prompts: list[list[int]], *, n_seq: int, max_new: int = 64,
                       n_threads: int | None = None) -> float:
    """Generated tokens per second for these prompts at ``n_seq`` sequences per batch."""
    t0 = time.perf_counter()
    n = 0
    for r in generate_batched(model, (GenRequest(str(i), p) for i, p in enumerate(prompts)), n_seq=n_seq,
                              max_new=max_new, n_ctx_seq=512, n_threads=n_threads):
        n += len(r.response)
    return n / (time.perf_counter() - t0)
