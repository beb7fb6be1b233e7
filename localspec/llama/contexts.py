"""The shapes of the llama.cpp contexts localspec creates, shared by the engine (which creates them)
and the memory planner (which reserves the same ones to measure them). A low module: it imports
only ``localspec.core``, so both sides can use it without importing each other.

- KV cache types by name: the ggml type id llama.cpp takes and the bytes per element.
- The target context: its prompt batch (n_batch = n_ubatch), its sequences (one per draft-tree
  leaf when a drafter is loaded) and the most logit rows one verify batch asks for.
- The drafter context's batch (its graph computes logits for every row of a batch), and the
  settings of the drafter's and the MTP heads' contexts.
"""

from __future__ import annotations

from ..core import options

# KV cache types: name -> (ggml type id, bytes per element)
KV_TYPES: dict[str, tuple[int, float]] = {
    "f16": (1, 2.0),
    "q8_0": (8, 34 / 32),
    "q4_0": (2, 18 / 32),
    "f32": (0, 4.0),
}

# ggml-cpu's flash attention tiles batches of this many query rows or more (GGML_FA_TILE_Q), which
# rounds otherwise than fewer rows do (Engine's rows_match keeps every verify under it)
TILED_ROWS = 64
# ... and attends a single query row over a KV view of this many cells or more by another path (split
# across the threads); the view is the used cells rounded up to 256 (llama-kv-cache.cpp get_n_kv)
SPLIT_KV_CELLS = 512
PROMPT_BATCH = 512          # the target context's n_batch = n_ubatch
# the target context's n_outputs_max: the largest verify batch, a chain (draft-max + 1, or auto's
# lookup draft on a long match, lookup-max + 1) or a tree (its nodes + the root), 129
VERIFY_OUTPUTS_MAX = 1 + max(options.DRAFT_MAX, options.LOOKUP_MAX, options.TREE_MAX_NODES)
# The drafter context's n_batch: llama.cpp sizes its output buffer (full-vocabulary logits) by it,
# and prompt chunks are written to the drafter without outputs in pieces of this size.
DRAFTER_BATCH = 64
# Sequences of a drafter context besides the committed one (0), for the branches of a draft tree
# (speculation.tree).
DRAFTER_TREE_SEQS = options.TREE_MAX_WIDTH
# An EAGLE drafter's context (speculation.eagle; memory.probe reserves the same). One layer of
# attention: exact arithmetic costs little and keeps the drafter within 1e-6 of its torch reference
# (flash attention on CPU rounds Q to F16: 1e-4 off); tree branches are sequences of one unified cache.
DRAFTER_CONTEXT = dict(precise_attention=True, n_seq_max=1 + DRAFTER_TREE_SEQS, kv_unified=True)


def mtp_context_settings(slots: int = 1) -> dict:
    """The MTP heads' context beside the target (speculation.mtp opens it, memory.probe reserves
    it), as draft-mtp's (common_speculative_init_result): the default cache type (F16) and
    attention, a sequence per slot plus the tree branches; the target is its ctx_other."""
    return dict(mtp=True, n_seq_max=max(DRAFTER_CONTEXT["n_seq_max"], slots), kv_unified=True)


# A recurrent target (Qwen3.5's gated delta nets ...): llama.cpp keeps this many snapshots of each
# sequence's state for rollback (n_rs_seq), so a verify rejects at most this many rows; the policy
# drafts no deeper (Engine.open_generation). Each snapshot is a whole state per sequence: 4 L H d^2 bytes
# for L delta-net layers of H value heads of d x d f32 (144 MiB for 48 layers of 48 heads of 128).
RS_ROLLBACK = 8


def target_context(with_drafter: bool, slots: int = 1, *, recurrent: bool = False, streams: bool = False) -> dict:
    """Sequence settings of the target context: with a drafter, draft trees are verified in one batch,
    each leaf a sequence of one unified cache (the tree's rows share the prefix cells; see
    speculation.tree). With ``slots`` > 1 (parallel requests, :mod:`localspec.runtime.scheduler`)
    each slot is one sequence of one unified cache: a shared pool of cells (the engine sizes it
    ``slots`` times the per-request context, so every slot can fill its own context). A
    ``recurrent`` target (a state per sequence, and ``1 + RS_ROLLBACK`` of it with a drafter or
    lookup: every state is kept for rollback) drafts chains only: a sequence per slot. ``streams``
    (several slots): one KV stream per slot instead of the shared pool (runtime.kv_layout)."""
    if recurrent:
        return dict(n_seq_max=slots, kv_unified=slots > 1, n_rs_seq=RS_ROLLBACK)
    if slots > 1 and streams:
        return dict(n_seq_max=slots, kv_unified=False)
    if slots > 1:
        return dict(n_seq_max=max(slots, 1 + options.TREE_MAX_NODES if with_drafter else 0), kv_unified=True)
    return dict(n_seq_max=1 + options.TREE_MAX_NODES, kv_unified=True) if with_drafter else {}


def block_drafter_batch(block_size: int) -> int:
    """A block drafter's (DFlash, DSpark) context batch: its largest decode, a block of the anchor
    and ``block_size`` rows at most (injection rows go in chunks of it). Its compute buffer and
    logit rows are sized by it, not by the target's prompt batch (llama.cpp's draft context
    inherits the target's: gigabytes on large vocabularies, llama.cpp issue #27569)."""
    return block_size + 1


