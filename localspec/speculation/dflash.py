"""DFlash and DSpark block drafters (a ``dflash`` GGUF given as the drafter file).

A block drafter drafts a whole block of positions in one drafter decode, from the target's
inputs at several layers (``dflash.target_layers``), as the pinned llama.cpp's
``common/speculative.cpp`` (``common_speculative_impl_draft_dflash``, spec types ``draft-dflash``
and ``draft-dspark``) drives ``src/models/dflash.cpp``:

- **injection**: for every committed position ``p`` the inputs of those target layers, side by
  side, go into the drafter's context as one embedding row at ``p`` (a decode without outputs):
  the graph projects them (``fc``, ``enc.output_norm``) and writes each drafter layer's K/V there;
- **block decode**: one decode of ``[last token, MASK x n]`` at the positions after the committed
  text, attention non-causal (unless ``dflash.attention.causal``), every row's logits read at
  once; DFlash drafts from rows ``1..n``, DSpark (``dflash.sample_from_anchor``) from rows
  ``0..n-1`` of a block of ``n`` rows. DSpark's Markov head (the previous token's low-rank bias,
  chained greedily through the block) runs inside llama.cpp's graph; its confidence head comes
  back as each row's ``h_nextn`` value (a sigmoid, broadcast over the row);
- the block's cells are dropped right after (llama.cpp drops them before the next verify), so
  the drafter's cache holds only the injected context.

Drafts are each row's top token (draft-dflash's top of a top-10 sampler); a row's confidence is
the probability of that token among the row's top 10 (the sampler's), or DSpark's confidence
head where it has one. DFlash2 (a selector lattice) is refused at the pair check.

The drafter is a :class:`~.drafter.ModelDrafter` with the block drafters' part
(:class:`BlockKind`). A :class:`BlockSequence` is a slot's sequence of the drafter's context:
target rows recorded by ``observe`` (as every model drafter's), injected by ``catch_up`` (all of
them: an injection row costs a fraction of a draft, and the block attends to the whole context),
and drafted from with ``draft_block``.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from ..formats import gguf_consts as K
from ..formats.gguf_info import GGUFInfo
from ..llama import llama_ext
from ..llama.contexts import block_drafter_batch
from ..llama.llama_model import Context, Model
from .drafter import DrafterKind, DrafterSequence, ModelDrafter, assembled, open_context

DFLASH, DSPARK = "dflash", "dspark"
SAMPLER_TOP_K = 10      # draft-dflash's sampler: the top token's probability among the top 10
INJECT_EVERY = 64       # recorded rows are injected once this many wait (a bounded backlog)


class BlockSequence(DrafterSequence):
    """One sequence (a slot's) of a block drafter's context: a model drafter's sequence (the
    recorded target rows, how far they are injected: :class:`BlockKind` writes them) that also
    drafts a block from the committed token its last injection ends on (``anchor``)."""

    @property
    def confidence_head(self) -> bool:
        """DSpark's confidence head gives the drafts' confidences (else the top-10 probability)."""
        return self.kind.has_confidence

    def draft_block(self, n: int) -> tuple[list[int], list[float]]:
        """Up to ``n`` drafts after the last committed token, from one block decode: the tokens
        and each one's confidence. Nothing when no committed row was injected."""
        if self.pending:
            self.catch_up()
        if self.anchor is None or n <= 0:
            return [], []
        tok, pos0 = self.anchor
        if pos0 != self.written_until:   # the injected context must reach the block
            return [], []
        try:
            return self.kind.decode_block(self.drafter, tok, pos0, n, self)
        finally:
            self.rm(pos0)   # the block's cells: the cache keeps the injected context only

    def time_block(self, tok: int) -> None:
        """A drafting cycle on this sequence, emptied first and after (the calibration's drafter
        step): one injected row, then a full block (llama.cpp builds the block's graph again after
        an injection: most of a cycle's time on a small model)."""
        kind = self.kind
        self.reset(0)
        kind.inject(self.drafter, np.zeros((1, len(kind.layers) * kind.n_embd_tgt), dtype=np.float32), 0, self)
        kind.decode_block(self.drafter, tok, 1, kind.max_depth, self)
        self.ctx.seq_rm(0, seq=self.seq)


class BlockKind(DrafterKind):
    """The block drafters' part: the target layers' inputs side by side as features, injected as
    they are (no encode decode: ``catch_up`` writes them with :meth:`inject`, every recorded row,
    and returns nothing), and the block decode (:meth:`decode_block`)."""

    block = True   # the policy prices one decode per draft, whatever its length (its source's cost)
    sequence_class = BlockSequence

    def __init__(self, info: GGUFInfo, model: Model, target: Context) -> None:
        self.info, self.target = info, target
        self.kind = info.block_kind or DFLASH
        self.name = DSPARK if self.kind == DSPARK else DFLASH
        meta = info.metadata
        self.block_size = int(meta.get(K.key(K.KEY_BLOCK_SIZE, K.DFLASH_ARCH)))
        self.from_anchor = self.kind == DSPARK and bool(meta.get(K.key(K.KEY_SAMPLE_FROM_ANCHOR, K.DFLASH_ARCH), True))
        self.has_confidence = self.kind == DSPARK and K.T_CONF_PROJ in info.tensors
        # the longest draft: DFlash's block is [anchor, masks] (block_size - 1 drafts), DSpark's anchor-first block_size
        self.max_depth = self.block_size if self.from_anchor else self.block_size - 1
        self.mask = int(info.mask_token)
        self.layers = llama_ext.model_target_layer_ids(model.ptr)
        self.n_embd, self.n_embd_tgt = model.n_embd, target.model.n_embd
        self._pos = ctypes.c_int32(0)

    def check(self, d: ModelDrafter) -> None:
        """The target layers llama.cpp reads are the metadata's; they, the drafter's confidences
        and its attention are set."""
        info = self.info
        if tuple(self.layers) != tuple(info.target_layers or ()):
            raise LocalspecError(f"{info.path.name}: llama.cpp reads target layers {self.layers}, metadata says {info.target_layers}")
        for lid in self.layers:
            llama_ext.set_embeddings_layer_inp(self.target.ptr, lid, True)
        llama_ext.set_embeddings_nextn(d.ctx.ptr, True, True)   # DSpark's confidences, as draft-dflash asks
        causal = bool(info.metadata.get(K.key(K.KEY_CAUSAL, K.DFLASH_ARCH), False))
        llama_cpp.llama_set_causal_attn(d.ctx.ptr, causal)

    # -- target side -------------------------------------------------------------------------
    def layer_inputs(self) -> tuple[tuple[int, ...], int, float | None]:
        """The target layers' inputs in ``target_layers`` order (:meth:`features`): one injection row each."""
        return self.layers, self.n_embd_tgt, None

    def begin_sequence(self, who: DrafterSequence) -> None:
        who.anchor = None   # (last committed token, its position pos0)

    def observed(self, who: DrafterSequence) -> None:
        """A long backlog is injected at once."""
        if who.pending >= INJECT_EVERY:
            who.catch_up()

    def forgot(self, who: DrafterSequence, keep: int) -> None:
        if who.anchor is not None and who.anchor[1] > keep:
            who.anchor = None

    def write(self, who: DrafterSequence, tokens: list[int], g: np.ndarray, start: int) -> None:
        """Inject every recorded row at its position; the next block starts after the last."""
        self.inject(who.drafter, g, start, who)
        who.anchor = (int(tokens[-1]), start + len(tokens))

    # -- drafter graphs ------------------------------------------------------------------------
    def inject(self, d: ModelDrafter, features: np.ndarray, start: int, who: DrafterSequence) -> None:
        """Feature rows at positions ``start..`` of sequence ``who``: the graph writes each drafter
        layer's K/V of them (no outputs), in decodes of the context's batch."""
        step = d.ctx.n_batch
        for first in range(0, features.shape[0], step):
            chunk = np.ascontiguousarray(features[first:first + step], dtype=np.float32)
            batch = d.clear().batch
            for j in range(chunk.shape[0]):
                row = chunk[j]
                embd = llama_cpp.llama_embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.shape[0])
                idx = llama_cpp.llama_batch_ext_add_embd(batch, who.seq, embd)
                if idx < 0:
                    raise LocalspecError(f"internal: the block drafter's injection batch rejected a row ({idx})")
                self._pos.value = start + first + j
                llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(self._pos))
                llama_cpp.llama_batch_ext_set_output_logits(batch, idx, False)
            d.process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, who)

    def decode_block(self, d: ModelDrafter, anchor: int, pos0: int, n: int, who: DrafterSequence) -> tuple[list[int], list[float]]:
        """One decode of the block after ``anchor`` (at ``pos0``) in sequence ``who``: ``n`` drafts
        (at most :attr:`max_depth`) and their confidences."""
        n = min(n, self.max_depth)
        rows = n if self.from_anchor else n + 1
        batch = d.clear().batch
        for i in range(rows):
            idx = llama_cpp.llama_batch_ext_add_token(batch, who.seq, anchor if i == 0 else self.mask)
            if idx < 0:
                raise LocalspecError(f"internal: the block drafter's batch rejected a token ({idx})")
            self._pos.value = pos0 + i
            llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(self._pos))
            llama_cpp.llama_batch_ext_set_output_logits(batch, idx, True)
        d.process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, who)
        first = 0 if self.from_anchor else 1
        conf = self._confidences(d, rows) if self.has_confidence else None
        tokens, sure = [], []
        for i in range(first, rows):
            tok, p = top_of_top_k(d.ctx.logits(i))
            tokens.append(tok)
            sure.append(float(conf[i]) if conf is not None else p)
        return tokens, sure

    def _confidences(self, d: ModelDrafter, rows: int) -> np.ndarray:
        """DSpark's confidence of each output row (its h_nextn row, the value broadcast over it)."""
        ptr = llama_ext.get_embeddings_nextn(d.ctx.ptr)
        if not ptr:
            raise LocalspecError("the DSpark drafter returned no confidences")
        return np.array(np.ctypeslib.as_array(ptr, shape=(rows, self.n_embd))[:, 0])


def BlockDrafter(info: GGUFInfo, target: Context, *, n_ctx: int, n_threads: int | None = None,
                 n_gpu_layers: int = 0, slots: int = 1) -> ModelDrafter:
    """A DFlash or DSpark drafter: its own model and context beside the target's (``ctx_other``:
    it borrows the target's token embeddings and lm_head), the target's layer inputs turned on."""
    llama_ext.check_available()
    model = Model(info.path, n_gpu_layers=n_gpu_layers)
    block_size = int(info.metadata.get(K.key(K.KEY_BLOCK_SIZE, K.DFLASH_ARCH)))
    # as EAGLE's drafter context (F32 cache, exact attention: what the memory plan counts),
    # its batch sized to the block
    ctx = open_context(model, target, n_ctx=n_ctx * slots, n_batch=block_drafter_batch(block_size),
                       n_threads=n_threads, n_seq_max=max(1, slots), kv_unified=True, precise_attention=True)
    return assembled(model, ctx, target, lambda: BlockKind(info, model, target))


def top_of_top_k(logits: np.ndarray, k: int = SAMPLER_TOP_K) -> tuple[int, float]:
    """The row's top token and its probability among the row's top ``k`` (draft-dflash's top-k
    sampler; a tie goes to the lower id, as a stable sort of the row would have it). The top ``k``
    are found among the logits at or above the least of ``k`` slices' maxima (each slice's maximum
    is a distinct logit, so at least ``k`` pass and the top ``k`` all do), in half the time of a
    partition of the whole row (10 argmaxes: 1.4 of a 4.3 ms block on the tiny fixtures)."""
    best = int(np.argmax(logits))
    top_logit, n = logits[best], len(logits)
    if n > 4 * k:
        near = logits[logits >= logits[:n - n % k].reshape(k, -1).max(axis=1).min()]
        logits = near if len(near) >= k else logits   # (fewer: a NaN in the row)
    top = np.partition(logits, len(logits) - k)[-k:] if len(logits) > k else logits
    total = float(np.exp(top - top_logit, dtype=np.float32).sum())
    return best, 1.0 / total
