"""Measure the costs the auto policy plans with: target verify time by batch size, drafter step time.

:func:`calibrate` is what :func:`localspec.speculation.costmodel.load_or_calibrate` runs when this
machine, these files and these settings have no cached calibration yet.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..speculation import cost_measure, tree
from ..speculation.drafter import ModelDrafter
from .verifier import TargetVerifier

WARM_STEPS = 4   # one-token decodes before timing: the filler's prefill leaves the next ones ~30% slower


def calibrate(verifier: TargetVerifier, drafter: ModelDrafter | None,
              cancel=None) -> tuple[dict[int, float], float | None, float | None, bool]:
    """Time target decodes of each batch size (logits for every row) after a short context, one
    drafter step and one step of ``tree.WIDTH`` branches: (seconds by batch size, drafter step,
    branch step / drafter step, complete). Complete: every run planned was taken on a machine
    that kept still (:func:`cost_measure.trusted`), the figures worth caching. Leaves both caches
    empty. ``cancel`` (``is_set()``: a ``threading.Event``, or the background calibration's
    stop) ends it at the next decode."""
    deadline = time.perf_counter() + cost_measure.BUDGET_SECONDS

    def stop() -> bool:  # an oversubscribed machine can make decodes 100x slower: keep what we have
        return time.perf_counter() > deadline or (cancel is not None and cancel.is_set())
    verify_costs, complete, tok = _time_verify(verifier, stop)
    drafter_step = drafter_width = None
    if drafter is not None:
        if cancel is not None and cancel.is_set():
            complete = False
        else:
            drafter_step, drafter_width = _time_drafter(drafter, tok)
    return verify_costs, drafter_step, drafter_width, complete


def _time_verify(verifier: TargetVerifier, stop) -> tuple[dict[int, float], bool, int]:
    """Seconds of a target decode by batch size, whether every size was timed, the filler token."""
    ctx, model = verifier.ctx, verifier.model
    n_ctx_room = ctx.n_ctx - 1
    base = min(128, n_ctx_room // 2, ctx.n_batch)   # one decode (a small --ctx gives a small n_batch)
    limit = min(ctx.n_outputs_max, ctx.n_batch, n_ctx_room - base)
    if ctx.rollback is not None:   # a recurrent state: no verify is larger than it rolls back (runtime.recurrent)
        limit = min(limit, ctx.rollback)
    sizes = [b for b in list(range(1, cost_measure.CALIBRATE_MAX + 1)) + list(cost_measure.EXTRA_SIZES) if b <= limit]
    filler = [model.bos if model.bos >= 0 else 0] + [(i * 7919) % model.n_vocab for i in range(1, base)]
    verifier.forget()
    if stop():
        return {}, False, 0
    if base:
        ctx.decode(filler, 0, all_logits=False)
    tok = filler[-1] if filler else 0

    def verify(b: int) -> None:
        ctx.decode([tok] * b, base, all_logits=True)
        ctx.seq_rm(base)

    for _ in range(WARM_STEPS):  # the first single steps after a large batch run slow (cold caches)
        verify(1)
    runs = cost_measure.measure_runs(verify, sizes, stop=stop, settle=lambda: verify(1))
    ctx.seq_rm(0)
    return cost_measure.curve(runs), cost_measure.trusted(runs, sizes) is None, tok


def _time_drafter(d: ModelDrafter, tok: int) -> tuple[float, float]:
    """Seconds of one drafter step, and a step of ``tree.WIDTH`` branches relative to it. The
    sequences it decodes on are emptied first: in an engine of several slots they are the slots'
    drafter sequences, which may hold an earlier request's pairs (the scheduler counts them gone).
    A block drafter (speculation.dflash): one full block decode, no trees."""
    first = d.for_sequence(0)
    if d.block:
        return cost_measure.measure(lambda _b: first.time_block(tok), [1])[1], None
    g = np.zeros((1, d.n_embd), dtype=np.float32)
    seqs = list(range(1, tree.WIDTH + 1))
    d.reset(0)
    for s in seqs:
        d.forget(s)

    def step(_b: int) -> None:
        first.decode([tok], g, 0)
        d.ctx.seq_rm(0)

    drafter_step = cost_measure.measure(step, [1])[1]
    d.reset(0)
    gw = np.zeros((tree.WIDTH, d.n_embd), dtype=np.float32)

    def branches(_b: int) -> None:
        d.decode_branches([tok] * tree.WIDTH, gw, 0, seqs)
        for s in seqs:
            d.forget(s)

    return drafter_step, cost_measure.measure(branches, [1])[1] / drafter_step
