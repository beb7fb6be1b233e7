"""Batched greedy generation: many sequences per llama.cpp decode.

One :class:`~localspec.llama.llama_model.Context` with ``n_seq_max = B`` (one KV stream per sequence,
``kv_unified`` off, so each sequence attends only to its own cells); each batch row carries its own
``seq_id``.
Each step decodes one token for every active sequence; a finished slot (EOS or length) is cleared
and refilled with the next prompt, whose prefill rides in the same decode as the others' tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from ..llama.llama_model import Context, Model


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


@dataclass
class _Slot:
    req: GenRequest
    pending: list[int]      # prompt tokens not yet decoded
    pos: int                # next position to write
    response: list[int]
    last: int = -1          # chosen token not yet decoded


def _batch_rows(slots: list[_Slot | None], prefill_budget: int):
    """One decode batch over the slots: each generating slot's last token, and up to
    ``prefill_budget`` prompt tokens of prefilling ones. (rows as (seq, token, pos, output), owners
    as (batch row, slot whose next token that row's logits choose)); advances the slots' positions."""
    rows: list[tuple[int, int, int, bool]] = []
    owners: list[tuple[int, int]] = []
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
    return rows, owners


def generate_batched(model: Model, requests: Iterable[GenRequest], *, n_seq: int = 8, max_new: int = 256,
                     n_ctx_seq: int = 1024, n_threads: int | None = None,
                     on_result: Callable[[GenResult], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> Iterator[GenResult]:
    """Greedy responses to ``requests``, ``n_seq`` at a time; yields results as sequences finish.

    Prompts longer than ``n_ctx_seq - 16`` are skipped (logged as finish "skipped")."""
    # one KV stream per sequence (kv_unified off): each sequence attends only to its own cells
    ctx = Context(model, n_ctx=n_seq * n_ctx_seq, n_batch=max(512, n_seq), n_threads=n_threads, n_seq_max=n_seq)
    n_ctx_seq = ctx.n_ctx // n_seq
    it = iter(requests)
    slots: list[_Slot | None] = [None] * n_seq
    prefill_budget = ctx.n_batch - n_seq

    def refill(i: int) -> None:
        while True:
            req = next(it, None)
            if req is None:
                slots[i] = None
                return
            if len(req.tokens) + 16 > n_ctx_seq:
                yield_later.append(GenResult(req.key, req.tokens, [], "skipped"))
                continue
            ctx.seq_rm(-1, -1, seq=i)
            slots[i] = _Slot(req, list(req.tokens), 0, [])
            return

    yield_later: list[GenResult] = []
    try:
        for i in range(n_seq):
            refill(i)
        while any(s is not None for s in slots):
            if should_stop is not None and should_stop():
                return
            rows, owners = _batch_rows(slots, prefill_budget)
            ctx.decode_rows(rows)
            for row, i in owners:
                s = slots[i]
                tok = int(np.argmax(ctx.logits(row)))
                done = None
                if model.is_eog(tok):
                    done = "stop"
                else:
                    s.response.append(tok)
                    s.last = tok
                    if len(s.response) >= max_new or s.pos + 1 >= n_ctx_seq:
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
