"""Speculation on a target with a recurrent state (Mamba, RWKV; hybrid: Qwen3.5/3.6's gated delta
nets, Qwen3-Next, Nemotron-H, LFM2 ...).

A KV cache drops rejected draft rows by position; a recurrent state has no history to drop them
from. The pinned llama.cpp keeps ``n_rs_seq`` snapshots of each sequence's state, the states after
each of the last rows of a decode, and rolls a sequence back to one of them
(``llama-memory-recurrent.cpp``), for the architectures ``llm_arch_supports_rs_rollback`` names
(qwen35, qwen35moe, qwen4exp, deepseek4, glm5-next, nemotron-h(-moe), lfm2(-moe), bailingmoe3,
kimi-k3). So on such a target:

- the context keeps :data:`~localspec.llama.contexts.RS_ROLLBACK` snapshots, and every verify
  rejects at most that many rows: :func:`bounded_policy` caps the policy's drafts (drafter chains,
  lookup, padding) and turns draft trees off (their branches would be sequences of a state each);
- prefix reuse keeps a cached prompt only where :meth:`~localspec.llama.llama_model.Context.can_seq_rm`
  says the cut is exact (:func:`exact_start`: a drafter that would need one more row cut restarts
  its own cache instead); elsewhere the prompt is prefilled whole (``TargetVerifier.begin``);
- a recurrent target llama.cpp cannot roll back (qwen3next, mamba, rwkv ...) decodes plainly:
  :func:`cannot_draft_note` says why, once.

The MTP context of a hybrid Qwen model is a plain KV cache of its head's layer (``llama-model.cpp``
``mtp_on_hybrid_qwen``), so the MTP drafter needs nothing of this.
"""

from __future__ import annotations

from dataclasses import replace

from ..speculation.policy import PolicyConfig


def cannot_draft_note(model, ctx) -> str | None:
    """Why no draft can be verified on ``ctx`` (a recurrent state llama.cpp cannot roll back: a
    rejected draft would stay in it); None where drafting is exact."""
    if ctx.rollback != 0:
        return None
    return f"{model.path.name}: llama.cpp cannot roll back this model's recurrent state to a draft's position"


def bounded_policy(pcfg: PolicyConfig, ctx) -> PolicyConfig:
    """``pcfg`` with no verify deeper than ``ctx`` rolls back (``n_rs_seq`` rows; padding included,
    which stays within ``1 + max(draft_max, lookup_max)`` rows), and chains only."""
    n = ctx.rollback
    if not n:
        return pcfg
    return replace(pcfg, draft_max=min(pcfg.draft_max, n), lookup_max=min(pcfg.lookup_max, n), tree="off")


def exact_start(ctx, seq: int, start: int, keep: int) -> tuple[int, bool]:
    """Where a generation on sequence ``seq`` starts decoding its prompt: ``start`` (the cached
    prefix a drafter can use; ``keep`` >= it: the prefix the target alone could keep) where the
    cut there is exact (:meth:`~localspec.llama.llama_model.Context.can_seq_rm`). Else, on a
    recurrent state, ``keep`` with the drafter restarting from it (True: its earlier pairs go, as
    after a prompt-cache load; it drafts from the rows after, losing no exactness), or 0."""
    if ctx.can_seq_rm(start, seq):
        return start, False
    if keep > start and ctx.can_seq_rm(keep, seq):
        return keep, True
    return 0, False
