"""MTP (NextN) heads inside the target GGUF as a draft source: no drafter file.

Models such as Qwen3.5/3.6, GLM-4.5+, DeepSeek V3.2/V4, Step-3.5 and MiMo ship trained
multi-token-prediction blocks past their trunk (``{arch}.nextn_predict_layers``, tensors
``blk.{n}.nextn.eh_proj`` ...). llama.cpp loads them with ``llama_model_params.load_mtp`` and runs
them in a second context of the same model whose graph is the head (``LLAMA_CONTEXT_TYPE_MTP``,
its KV cache holding the head's layers only); ``common/speculative.cpp``'s ``draft-mtp`` drives it.
This module drives it the same way, through llama-cpp-python's ``llama_batch_ext`` bindings and
the staging symbols of :mod:`localspec.llama.llama_ext`:

- the target context outputs ``h``, its last hidden state before the output norm, for every row
  of every batch (``llama_set_embeddings_nextn(ctx_tgt, true, masked=false)``);
- the head's cache holds at position ``p`` the pair (token ``x_p``, target ``h_{p-1}``), the
  first token paired with a zero state, exactly as ``draft-mtp`` keeps it; its output at ``p``
  predicts ``x_{p+1}`` and comes with the head's own pre-norm state, which is fed back with the
  drafted token for the next step (``llama_get_embeddings_nextn_ith(ctx_dft, i)``).

That is an EAGLE drafter's convention (:mod:`.eagle`: the pair of position ``P`` holds the token
at ``P+1`` and the target's state at ``P``) shifted by one position, with the target's ``h``
instead of three layer features and no ``fc``. So :class:`MtpDrafter` is an
:class:`~.eagle.EagleDrafter` over another context, and everything built for EAGLE chains works
with it unchanged: the policy prices its step with the calibrated drafter curve, chains are
batched across slots (each slot's sequence an :class:`MtpSequence`), trees grow in its sequences.

Drafts are greedy top-1 (``draft-mtp`` takes the first of its top-10 candidates too). Several
heads that are not memory-shared are chained as ``draft-mtp`` chains them (step35): the committed
rows are written once per head (``llama_set_nextn_layer_offset``; each pass drops the cells and
writes them again, so the cells keep every head's layer), draft ``k`` comes from head ``k``
decoding the whole draft prefix again (``[id_last, d1..dk]`` after dropping the draft region),
and a chain is at most as deep as there are heads (no trees). Shared-KV heads (Gemma 4's
assistant) are a separate model (see docs/speculation.md).
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from ..formats.gguf_info import mtp_heads  # noqa: F401 (re-exported: the source's recognition)
from ..llama import llama_ext
from ..llama.llama_model import Context
from ..llama.contexts import mtp_context_settings
from .eagle import TREE_SEQS, DrafterSequence, EagleDrafter

MTP = "mtp"


def mtp_context(target: Context, *, n_ctx: int, n_batch: int, n_threads: int | None = None, slots: int = 1) -> Context:
    """The MTP heads' context beside ``target`` (on its model, loaded with ``load_mtp``), as
    draft-mtp's (common_speculative_init_result): the default cache type (F16) and attention, the
    target as ctx_other; a sequence per slot, plus the tree branches. The memory probe opens the
    same (localspec.memory.probe)."""
    return Context(target.model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, ctx_other=target,
                   **mtp_context_settings(slots))


class _Heads:
    """What a sequence of the MTP heads' context does beyond an EAGLE drafter's: the prompt's
    first token paired with a zero state, and chained heads (the committed rows under every head,
    a draft step ``k`` under head ``k`` over the whole draft prefix). The drafter (sequence 0)
    and its other sequences (:class:`MtpSequence`) share it."""

    def _start_sequence(self, drafter, seq: int) -> None:
        super()._start_sequence(drafter, seq)
        self._first: int | None = None   # the prompt's first token: its pair has no target state
        self._every_head = False           # catch_up under way: committed rows go to every head
        self._chain: tuple[list[int], list[np.ndarray], int] | None = None   # chained heads: the draft prefix

    def catch_up(self, max_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        self._every_head = self.heads > 1
        try:
            return super().catch_up(max_rows)
        finally:
            self._every_head = False

    def decode(self, tokens: list[int], g: np.ndarray, start_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """One head: EAGLE's decode. Chained heads: committed rows (catch_up) under every head,
        the first last (its output drafts the first token); a chain step ``k`` under head ``k``
        over the whole draft prefix."""
        if self.heads == 1:
            return super().decode(tokens, g, start_pos)
        if self._every_head:
            for head in reversed(range(self.heads)):
                llama_ext.set_nextn_layer_offset(self.ctx.ptr, head)
                if head != self.heads - 1:
                    self._rm(start_pos)
                out = super().decode(tokens, g, start_pos)
            self._chain = ([tokens[-1]], [np.array(g[-1], dtype=np.float32)], start_pos + len(tokens) - 1)
            return out
        chain = self._chain
        step = start_pos - chain[2] if chain is not None else -1
        if chain is None or step != len(chain[0]) or step >= self.heads or len(tokens) != 1:
            self._chain = None   # not a chain step (calibration's timing): the first head
            return super().decode(tokens, g, start_pos)
        chain[0].append(tokens[0])
        chain[1].append(np.array(g[0], dtype=np.float32))
        llama_ext.set_nextn_layer_offset(self.ctx.ptr, step)
        try:
            self._rm(chain[2])
            return super().decode(chain[0], np.stack(chain[1]), chain[2])
        finally:
            llama_ext.set_nextn_layer_offset(self.ctx.ptr, 0)

    def begin(self, prompt: list[int], keep: int) -> None:
        self._first = int(prompt[0]) if len(prompt) else None
        self.reset(keep)

    def observe(self, tokens_next: list[int], n_rows: int, start_pos: int, rows: list[int] | None = None) -> None:
        if start_pos == 0 and self._pending_start is None and self._first is not None:
            # the first token's pair, (x_0, a zero state) at position 0, as draft-mtp writes it
            self._pending_start = -1
            self._pending_tokens.append(self._first)
            self._pending_feats.append(np.zeros((1, self.drafter.n_embd), dtype=np.float32))
        super().observe(tokens_next, n_rows, start_pos, rows)

    def reset(self, keep: int) -> None:
        if keep <= 0:   # the first token's pair goes too (the next prompt may start otherwise)
            self.drop_pending()
            self._rm(0)
            self._written_until = 0
            return
        super().reset(keep)


class MtpSequence(_Heads, DrafterSequence):
    """Another sequence (a slot's) of the MTP heads' context."""

    def __init__(self, drafter: "MtpDrafter", seq: int) -> None:
        self.heads = drafter.heads
        super().__init__(drafter, seq)


class MtpDrafter(_Heads, EagleDrafter):
    """The target's MTP head(s) in a context of their own beside the target's (same model, which
    must be loaded with ``load_mtp``)."""

    name = MTP
    sequence_class = MtpSequence
    shift = 1   # the pair of position P (token P+1, h_P) sits at P+1, where draft-mtp puts it

    def __init__(self, target: Context, heads: int, *, n_ctx: int, n_batch: int,
                 n_threads: int | None = None, slots: int = 1) -> None:
        llama_ext.check_available()
        if not getattr(target.model, "load_mtp", False):
            raise LocalspecError("internal: the target was loaded without its MTP heads")
        self.info, self.target, self.model = None, target, target.model
        self.heads = heads
        self.ctx = mtp_context(target, n_ctx=n_ctx * slots, n_batch=n_batch, n_threads=n_threads, slots=slots)
        self.tree_seqs = TREE_SEQS
        self.layers: list[int] = []
        llama_ext.set_embeddings_nextn(target.ptr, True, False)   # every target row's h (unmasked)
        llama_ext.set_embeddings_nextn(self.ctx.ptr, True, True)  # the head's state of its output rows
        llama_ext.set_nextn_layer_offset(self.ctx.ptr, 0)          # the first head drafts every step
        self.n_embd = self.n_embd_tgt = int(llama_cpp.llama_model_n_embd_out(self.model.ptr))
        self.out_norm = None
        self._batch = llama_cpp.llama_batch_ext_init(self.ctx.ptr)
        self._pos = ctypes.c_int32(0)
        self._views: dict = {}
        self.max_depth = heads if heads > 1 else None
        self._start_sequence(self, 0)

    def features(self, n_rows: int, rows: list[int] | None = None) -> np.ndarray:
        """The target's ``h`` of the first ``n_rows`` rows of its last batch (or of rows ``rows``)."""
        n_rows, rows = self.target.token_rows(n_rows, rows)
        n_batch = n_rows if rows is None else max(rows) + 1
        ptr = llama_ext.get_embeddings_nextn(self.target.ptr)
        if not ptr:
            raise LocalspecError("llama.cpp returned no hidden states of the target for its MTP head")
        src = np.ctypeslib.as_array(ptr, shape=(n_batch, self.n_embd))
        return np.array(src if rows is None else src[rows], dtype=np.float32)

    def decode_steps(self, rows: list[tuple[DrafterSequence, int, np.ndarray, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Chained heads: each sequence's step alone (its prefix under its own head)."""
        if self.heads == 1:
            return super().decode_steps(rows)
        out = []
        for who, tok, state, pos in rows:
            logits, nxt = who.decode([tok], np.asarray(state, dtype=np.float32)[None, :], pos)
            out.append((np.array(logits), nxt))
        return out

    def encode(self, features: np.ndarray, who: DrafterSequence | None = None) -> np.ndarray:
        """The head takes the target's state as it is (no fc)."""
        return np.ascontiguousarray(features, dtype=np.float32)

    def close(self) -> None:
        batch, self._batch = self._batch, None
        if batch:
            llama_cpp.llama_batch_ext_free(batch)
        self.ctx.close()   # the model is the target's: the engine closes it
