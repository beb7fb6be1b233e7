"""Gemma 4's assistant (a ``gemma4-assistant`` GGUF, given as the drafter file) as a draft source.

The assistant is a separate small model of NextN blocks (``src/models/gemma4-assistant.cpp``). It
embeds a token with the target's own embeddings, concatenates the target's last hidden state
(``nextn.pre_projection`` over twice the target's width), attends to the target's KV cache (it has
none of its own: llama.cpp builds its memory over the target context's, ``ctx_other``, each
sliding layer reading the target's last sliding layer's cells, each full layer the last full
layer's), and returns logits and the state to feed back at the target's width
(``nextn.post_projection``).

``common/speculative.cpp``'s ``draft-mtp`` drives it in its shared-KV mode
(``llama_get_ctx_other(ctx_dft) == ctx_tgt``), which :class:`AssistantDrafter` follows:

- no catch-up decode: the target's committed rows are already in the cache the assistant reads,
  so ``observe`` keeps only the last committed row's state ``h`` and the token after it;
- every draft step decodes at the same position ``pos0`` (the position of that token, the first
  the target has not decoded yet): the first with (token, target ``h``), each next with (drafted
  token, the assistant's own fed-back state); nothing is written to any cache, so the steps of a
  chain, of a tree's branches or of several slots are independent rows attending to their own
  sequence's committed cells;
- drafts are greedy top-1 under ``p_min`` (the EAGLE chain machinery, unchanged).

The target outputs ``h`` for every row (``llama_set_embeddings_nextn(ctx_tgt, true, false)``;
gemma4's graph exposes the state after the output norm, as the assistant was trained on). A
llama.cpp batch must continue each sequence's cells (``pos0`` = the target's last position + 1),
which holds whenever the loop drafts: after prefill or verification the target holds the
committed positions below ``pos0``.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from ..formats.gguf_info import GGUFInfo
from ..llama import llama_ext
from ..llama.llama_model import Context, Model
from .eagle import DRAFTER_CONTEXT, TREE_SEQS
from .mtp import MtpDrafter, MtpSequence

ASSISTANT = "assistant"


class _SharedKV:
    """What a sequence of the assistant does beyond an MTP head's (draft-mtp's shared-KV mode):
    only the last committed row is kept, and every row of a draft goes to ``pos0`` (the cache is
    the target's: nothing is written to it or removed from it). The drafter (sequence 0) and its
    other sequences (:class:`AssistantSequence`) share it."""

    def _start_sequence(self, drafter, seq: int) -> None:
        super()._start_sequence(drafter, seq)
        self._last: tuple[int, np.ndarray, int] | None = None   # (token at pos0, target h before it, pos0)
        self._fresh = False        # _last came after the last catch_up

    def observe(self, tokens_next: list[int], n_rows: int, start_pos: int, rows: list[int] | None = None) -> None:
        """Keep the last of the committed rows: its target state and the token after it, which
        sits at ``start_pos + n_rows`` (the next draft's ``pos0``)."""
        if n_rows <= 0:
            return
        last = n_rows - 1 if rows is None else rows[n_rows - 1]
        h = self.drafter.features(1, [last])
        self._last = (int(tokens_next[n_rows - 1]), h, start_pos + n_rows)
        self._fresh = True

    @property
    def pending(self) -> int:
        """Rows the next catch-up decodes: one (the last committed row), never a backlog."""
        return 1 if self._fresh else 0

    def drop_pending(self) -> None:
        self._last, self._fresh = None, False

    def catch_up(self, max_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The first draft: (token, target state) at ``pos0``, no other row written."""
        if self._last is None:
            raise LocalspecError("internal: the assistant has no committed row to draft from")
        tok, h, pos0 = self._last
        self._fresh = False
        self.drafter.anchor(self.seq, pos0)
        return self.decode([tok], h, pos0 - self.shift)

    def _rm(self, p: int) -> None:
        """Nothing to forget: the cache is the target's (llama.cpp ignores removals there too)."""

    def begin(self, prompt: list[int], keep: int) -> None:
        self.reset(keep)

    def reset(self, keep: int) -> None:
        self._last, self._fresh = None, False
        self.drafter.anchor(self.seq, None)


class AssistantSequence(_SharedKV, MtpSequence):
    """Another sequence (a slot's) of the assistant's context."""


class AssistantDrafter(_SharedKV, MtpDrafter):
    """A Gemma 4 assistant over the target context's KV cache (its own model and context)."""

    name = ASSISTANT
    sequence_class = AssistantSequence

    def __init__(self, info: GGUFInfo, target: Context, *, n_batch: int, n_threads: int | None = None,
                 n_gpu_layers: int = 0, slots: int = 1) -> None:
        llama_ext.check_available()
        self.info, self.target = info, target
        self.model = Model(info.path, n_gpu_layers=n_gpu_layers)
        try:
            # as draft-mtp's context: the target's cache size and layout (its cells are shared),
            # its attention settings (the assistant views the target's K/V tensors as they are)
            self.ctx = Context(self.model, n_ctx=target.n_ctx, n_batch=n_batch, n_threads=n_threads,
                               ctx_other=target, n_seq_max=max(DRAFTER_CONTEXT["n_seq_max"], slots),
                               kv_unified=True)
        except BaseException:
            self.model.close()
            raise
        self.heads, self.max_depth, self.layers, self.out_norm = 1, None, [], None
        self.tree_seqs = TREE_SEQS
        llama_ext.set_embeddings_nextn(target.ptr, True, False)   # every target row's h (unmasked)
        llama_ext.set_embeddings_nextn(self.ctx.ptr, True, True)  # the assistant's state of its output rows
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(self.model.ptr))
        self.n_embd_tgt = target.model.n_embd
        if self.n_embd != self.n_embd_tgt:
            self.close()
            raise LocalspecError(f"{info.path.name}: its state is {self.n_embd} wide, the target's {self.n_embd_tgt}")
        self._batch = llama_cpp.llama_batch_ext_init(self.ctx.ptr)
        self._pos = ctypes.c_int32(0)
        self._views: dict = {}
        self._anchors: dict[int, int] = {}   # each sequence's pos0: where its draft rows go
        self._start_sequence(self, 0)

    def anchor(self, seq: int, pos0: int | None) -> None:
        """Sequence ``seq``'s draft rows go to ``pos0`` from now on (None: it drafts nothing now)."""
        if pos0 is None:
            self._anchors.pop(seq, None)
        else:
            self._anchors[seq] = pos0

    def _position(self, seq: int, pos: int) -> int:
        """Every row of a sequence at its ``pos0`` (draft-mtp's shared-KV mode)."""
        anchor = self._anchors.get(seq)
        return pos + self.shift if anchor is None else anchor

    # -- draft trees: branches are rows of the drafting sequence (nothing is cached) ----------------
    def fork(self, src: int, dst: int) -> None:
        pass

    def forget(self, seq: int) -> None:
        pass

    def decode_branches(self, tokens: list[int], g: np.ndarray, pos: int,
                        seqs: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        return super().decode_branches(tokens, g, pos, [self.seq] * len(tokens))

    def close(self) -> None:
        batch, self._batch = getattr(self, "_batch", None), None
        if batch:
            llama_cpp.llama_batch_ext_free(batch)
        self.ctx.close()   # before the target's context, whose cache it views (the engine closes it after)
        self.model.close()
