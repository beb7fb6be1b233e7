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

That is the model drafters' convention (:mod:`.drafter`: the pair of position ``P`` holds the
token at ``P+1`` and the target's state at ``P``) shifted by one position, with the target's ``h``
instead of three layer features and no ``fc``. So the heads are a :class:`~.drafter.ModelDrafter`
over another context with MTP's part (:class:`MtpKind`: the shift, the first token's pair, the
chained heads), and everything built for model chains works with it unchanged: the policy prices
its step with the calibrated drafter curve, chains are batched across slots, trees grow in its
sequences.

Drafts are greedy top-1 (``draft-mtp`` takes the first of its top-10 candidates too). Several
heads that are not memory-shared are chained as ``draft-mtp`` chains them (step35): the committed
rows are written once per head (``llama_set_nextn_layer_offset``; each pass drops the cells and
writes them again, so the cells keep every head's layer), draft ``k`` comes from head ``k``
decoding the whole draft prefix again (``[id_last, d1..dk]`` after dropping the draft region),
and a chain is at most as deep as there are heads (no trees). Shared-KV heads (Gemma 4's
assistant) are a separate model (see docs/speculation.md).
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from ..formats.gguf_info import mtp_heads  # noqa: F401 (re-exported: the source's recognition)
from ..llama import llama_ext
from ..llama.contexts import mtp_context_settings
from ..llama.llama_model import Context
from .drafter import DrafterKind, DrafterSequence, ModelDrafter

MTP = "mtp"


def mtp_context(target: Context, *, n_ctx: int, n_batch: int, n_threads: int | None = None, slots: int = 1) -> Context:
    """The MTP heads' context beside ``target`` (on its model, loaded with ``load_mtp``), as
    draft-mtp's (common_speculative_init_result): the default cache type (F16) and attention, the
    target as ctx_other; a sequence per slot, plus the tree branches. The memory probe opens the
    same (localspec.memory.probe)."""
    return Context(target.model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, ctx_other=target,
                   **mtp_context_settings(slots))


def target_states(target: Context, n_embd: int, n_rows: int, rows: list[int] | None) -> np.ndarray:
    """The target's ``h`` of the first ``n_rows`` rows of its last batch (or of rows ``rows``):
    what MTP heads and Gemma 4's assistant read (``llama_set_embeddings_nextn`` on the target)."""
    n_rows, rows = target.token_rows(n_rows, rows)   # where the batch went in re-ordered (llama.stream_rows)
    n_batch = n_rows if rows is None else max(rows) + 1
    ptr = llama_ext.get_embeddings_nextn(target.ptr)
    if not ptr:
        raise LocalspecError("llama.cpp returned no hidden states of the target for its drafter")
    src = np.ctypeslib.as_array(ptr, shape=(n_batch, n_embd))
    return np.array(src if rows is None else src[rows], dtype=np.float32)


class MtpKind(DrafterKind):
    """MTP's part: the target's ``h`` as the state (no fc), the pairs one position later, the
    prompt's first token paired with a zero state, and chained heads (the committed rows under
    every head, a draft step ``k`` under head ``k`` over the whole draft prefix; per sequence,
    its draft prefix is ``who.chain``)."""

    name = MTP
    shift = 1   # the pair of position P (token P+1, h_P) sits at P+1, where draft-mtp puts it
    first_pair = True

    def __init__(self, target: Context, heads: int) -> None:
        self.target, self.heads = target, heads
        self.max_depth = heads if heads > 1 else None
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(target.model.ptr))

    def features(self, d: ModelDrafter, n_rows: int, rows: list[int] | None) -> np.ndarray:
        return target_states(self.target, self.n_embd, n_rows, rows)

    @property
    def shares_catch_up(self) -> bool:
        """One head: its slots' catch-ups in one decode (a plain write of their rows). Chained
        heads: each slot's alone (its rows written under every head, its draft prefix kept)."""
        return self.heads == 1

    def begin_sequence(self, who: DrafterSequence) -> None:
        who.chain = None   # chained heads: (draft prefix tokens, their states, its first position)

    def forgot(self, who: DrafterSequence, keep: int) -> None:
        who.chain = None

    def write(self, who: DrafterSequence, tokens: list[int], g: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """One head: as every drafter. Chained heads: the committed rows under every head, the
        first last (its output drafts the first token)."""
        if self.heads == 1:
            return who.decode(tokens, g, start)
        d = who.drafter
        for head in reversed(range(self.heads)):
            llama_ext.set_nextn_layer_offset(d.ctx.ptr, head)
            if head != self.heads - 1:
                who.rm(start)
            out = d.decode_rows(tokens, g, start, who)
        who.chain = ([tokens[-1]], [np.array(g[-1], dtype=np.float32)], start + len(tokens) - 1)
        return out

    def decode(self, who: DrafterSequence, tokens: list[int], g: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """One head: as every drafter. Chained heads: a chain step ``k`` under head ``k`` over the
        whole draft prefix."""
        d, chain = who.drafter, who.chain
        if self.heads == 1:
            return d.decode_rows(tokens, g, start, who)
        step = start - chain[2] if chain is not None else -1
        if chain is None or step != len(chain[0]) or step >= self.heads or len(tokens) != 1:
            who.chain = None   # not a chain step (calibration's timing): the first head
            return d.decode_rows(tokens, g, start, who)
        chain[0].append(tokens[0])
        chain[1].append(np.array(g[0], dtype=np.float32))
        llama_ext.set_nextn_layer_offset(d.ctx.ptr, step)
        try:
            who.rm(chain[2])
            return d.decode_rows(chain[0], np.stack(chain[1]), chain[2], who)
        finally:
            llama_ext.set_nextn_layer_offset(d.ctx.ptr, 0)

    def decode_steps(self, d: ModelDrafter, rows: list[tuple]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Chained heads: each sequence's step alone (its prefix under its own head)."""
        if self.heads == 1:
            return d.batched_steps(rows)
        out = []
        for who, tok, state, pos, _last in rows:
            logits, nxt = who.decode([tok], np.asarray(state, dtype=np.float32)[None, :], pos)
            out.append((np.array(logits), nxt))
        return out


def MtpDrafter(target: Context, heads: int, *, n_ctx: int, n_batch: int, n_threads: int | None = None,
               slots: int = 1) -> ModelDrafter:
    """The target's MTP head(s) in a context of their own beside the target's (same model, which
    must be loaded with ``load_mtp``; the engine closes it)."""
    llama_ext.check_available()
    if not getattr(target.model, "load_mtp", False):
        raise LocalspecError("internal: the target was loaded without its MTP heads")
    ctx = mtp_context(target, n_ctx=n_ctx * slots, n_batch=n_batch, n_threads=n_threads, slots=slots)
    llama_ext.set_embeddings_nextn(target.ptr, True, False)   # every target row's h (unmasked)
    llama_ext.set_embeddings_nextn(ctx.ptr, True, True)       # the head's state of its output rows
    llama_ext.set_nextn_layer_offset(ctx.ptr, 0)              # the first head drafts every step
    return ModelDrafter(MtpKind(target, heads), target.model, ctx, target, own_model=False)
