"""Gemma 4's assistant (a ``gemma4-assistant`` GGUF, given as the drafter file) as a draft source.

The assistant is a separate small model of NextN blocks (``src/models/gemma4-assistant.cpp``). It
embeds a token with the target's own embeddings, concatenates the target's last hidden state
(``nextn.pre_projection`` over twice the target's width), attends to the target's KV cache (it has
none of its own: llama.cpp builds its memory over the target context's, ``ctx_other``, each
sliding layer reading the target's last sliding layer's cells, each full layer the last full
layer's), and returns logits and the state to feed back at the target's width
(``nextn.post_projection``).

``common/speculative.cpp``'s ``draft-mtp`` drives it in its shared-KV mode
(``llama_get_ctx_other(ctx_dft) == ctx_tgt``), which the assistant's part of a
:class:`~.drafter.ModelDrafter` follows (:class:`AssistantKind`, its sequences
:class:`AssistantSequence`):

- no catch-up decode: the target's committed rows are already in the cache the assistant reads,
  so ``observe`` keeps only the last committed row's state ``h`` and the token after it;
- every draft step decodes at the same position ``pos0`` (the position of that token, the first
  the target has not decoded yet): the first with (token, target ``h``), each next with (drafted
  token, the assistant's own fed-back state); nothing is written to any cache, so the steps of a
  chain, of a tree's branches or of several slots are independent rows attending to their own
  sequence's committed cells;
- drafts are greedy top-1 under ``p_min`` (the model chain machinery, unchanged).

The target outputs ``h`` for every row (``llama_set_embeddings_nextn(ctx_tgt, true, false)``;
gemma4's graph exposes the state after the output norm, as the assistant was trained on). A
llama.cpp batch must continue each sequence's cells (``pos0`` = the target's last position + 1),
which holds whenever the loop drafts: after prefill or verification the target holds the
committed positions below ``pos0``.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from ..formats.gguf_info import GGUFInfo
from ..llama import llama_ext
from ..llama.contexts import DRAFTER_CONTEXT
from ..llama.llama_model import Context, Model
from .drafter import DrafterKind, ModelDrafter, checked, open_context
from .mtp import target_states

ASSISTANT = "assistant"


class AssistantKind(DrafterKind):
    """The assistant's part: the target's ``h`` as the state, no cells of its own (the target's
    cache is read), every row of a sequence's draft at that sequence's ``pos0`` (its anchor)."""

    name = ASSISTANT
    shift = 1
    cached = False

    def __init__(self, target: Context, n_embd: int) -> None:
        self.target, self.n_embd = target, n_embd
        self.anchors: dict[int, int] = {}   # each sequence's pos0: where its draft rows go
        self.sequence_class = AssistantSequence

    def features(self, d: ModelDrafter, n_rows: int, rows: list[int] | None) -> np.ndarray:
        return target_states(self.target, self.n_embd, n_rows, rows)

    def position(self, seq: int, pos: int) -> int:
        """Every row of a sequence at its ``pos0`` (draft-mtp's shared-KV mode)."""
        anchor = self.anchors.get(seq)
        return pos + self.shift if anchor is None else anchor


class AssistantSequence:
    """A sequence (a slot's) of the assistant (draft-mtp's shared-KV mode): only the last
    committed row is kept, and every row of a draft goes to ``pos0`` (the cache is the target's:
    nothing is written to it or removed from it). The public methods are a
    :class:`~.drafter.DrafterSequence`'s."""

    def __init__(self, drafter: ModelDrafter, seq: int) -> None:
        self.drafter, self.seq, self.kind = drafter, seq, drafter.kind
        self.name, self.shift, self.max_depth = drafter.name, drafter.shift, drafter.max_depth
        self.ctx, self.n_embd, self.tree_seqs = drafter.ctx, drafter.n_embd, drafter.tree_seqs
        self._last: tuple[int, np.ndarray, int] | None = None   # (token at pos0, target h before it, pos0)
        self._fresh = False        # _last came after the last catch_up
        self.seconds = 0.0

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
        """The first draft: (token, target state) at ``pos0``, no other row written (several
        slots' in one decode: :meth:`~.drafter.ModelDrafter.catch_ups`)."""
        return self.decode(*self.take(max_rows))

    def take(self, max_rows: int | None = None) -> tuple[list[int], np.ndarray, int]:
        """The catch-up's one row, (token, target state, its position less the shift), its
        sequence's draft rows anchored at ``pos0``."""
        if self._last is None:
            raise LocalspecError("internal: the assistant has no committed row to draft from")
        tok, h, pos0 = self._last
        self._fresh = False
        self.kind.anchors[self.seq] = pos0
        return [tok], h, pos0 - self.shift

    def decode(self, tokens: list[int], g: np.ndarray, start_pos: int) -> tuple[np.ndarray, np.ndarray]:
        return self.drafter.decode_rows(tokens, g, start_pos, self)

    def step(self, token: int, state: np.ndarray, pos: int, last: bool = False):
        return self.drafter.step(self, token, state, pos, last)   # its decode: the kind is not direct

    def greedy(self, logits: np.ndarray, state: np.ndarray, pos: int, k: int) -> list[int]:
        return self.drafter.greedy(self, logits, state, pos, k)

    def begin(self, prompt: list[int], keep: int) -> None:
        self.reset(keep)

    def reset(self, keep: int) -> None:
        """Nothing cached to forget; the kept row and the anchor go."""
        self._last, self._fresh = None, False
        self.kind.anchors.pop(self.seq, None)

    # -- draft trees: branches are rows of the drafting sequence (nothing is cached) ----------------
    def fork(self, src: int, dst: int) -> None:
        """Nothing to copy: every branch row reads the target's cells."""

    def forget(self, seq: int) -> None:
        """Nothing to drop."""

    def decode_branches(self, tokens: list[int], g: np.ndarray, pos: int,
                        seqs: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.drafter.decode_branches(tokens, g, pos, seqs, self)

    def close(self) -> None:
        """Nothing of its own outside Python: the drafter closes the context."""


def AssistantDrafter(info: GGUFInfo, target: Context, *, n_batch: int, n_threads: int | None = None,
                     n_gpu_layers: int = 0, slots: int = 1) -> ModelDrafter:
    """A Gemma 4 assistant over the target context's KV cache (its own model and context)."""
    llama_ext.check_available()
    model = Model(info.path, n_gpu_layers=n_gpu_layers)
    # as draft-mtp's context: the target's cache size and layout (its cells are shared), its
    # attention settings (the assistant views the target's K/V tensors as they are)
    ctx = open_context(model, target, n_ctx=target.n_ctx, n_batch=n_batch, n_threads=n_threads,
                       n_seq_max=max(DRAFTER_CONTEXT["n_seq_max"], slots), kv_unified=True)
    kind = AssistantKind(target, int(llama_cpp.llama_model_n_embd_out(model.ptr)))

    def check(d: ModelDrafter) -> None:
        n_embd_tgt = target.model.n_embd
        if kind.n_embd != n_embd_tgt:
            raise LocalspecError(f"{info.path.name}: its state is {kind.n_embd} wide, the target's {n_embd_tgt}")
        llama_ext.set_embeddings_nextn(target.ptr, True, False)   # every target row's h (unmasked)
        llama_ext.set_embeddings_nextn(d.ctx.ptr, True, True)     # the assistant's state of its output rows

    return checked(ModelDrafter(kind, model, ctx, target, own_model=True), check)
