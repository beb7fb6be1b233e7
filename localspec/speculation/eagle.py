"""The EAGLE-3 / EAGLE-3.1 drafter as a second llama.cpp context beside the target.

Convention (as in llama.cpp's ``common/speculative.cpp``): the drafter's KV cache holds at position
``P`` the pair (token at ``P+1``, ``g`` at ``P``), where ``g`` is the fc projection of the target's
three layer features at ``P`` for committed positions, or the drafter's own fed-back hidden state
for drafted ones. The output at ``P`` predicts the token at ``P+2``.

EAGLE-3.1 drafters, run exactly without patching llama.cpp:
- ``fc_norm`` (an RMSNorm with its own weight on each of the three target features): the weights
  were folded into ``fc.weight`` at conversion; here each feature block is divided by its RMS.
- ``norm_output`` (feed back the post-norm state): ``output_norm`` is applied to the pre-norm state
  that llama.cpp returns before it is fed to the next step.
"""

from __future__ import annotations

import math
import time

import llama_cpp
import numpy as np

from ..formats import gguf_consts as K
from ..llama import llama_ext
from ..core.errors import LocalspecError
from ..formats.gguf_info import GGUFInfo, read_tensor
from ..llama.process import llama_failure
from ..llama.contexts import DRAFTER_CONTEXT, DRAFTER_TREE_SEQS
from ..llama.ext_rows import ExtRows
from ..llama.llama_model import Context, Model


# Up to this many rows, a drafter batch asks for every row's output (see EagleDrafter.decode).
ALL_OUTPUT_ROWS = 16
# Sequences besides the committed one (0), for the branches of a draft tree (speculation.tree).
TREE_SEQS = DRAFTER_TREE_SEQS   # tree.MAX_WIDTH: the drafter context's settings (llama.contexts) hold them


def _rms_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True) + eps)


def _rms_normalize_rows(x: np.ndarray, eps: float) -> None:
    """:func:`_rms_normalize` of each row of ``x`` (2-D, float32), in place: no temporaries the
    size of ``x`` (the hot path: three target features of every committed row)."""
    scale = np.einsum("ij,ij->i", x, x)
    scale *= 1.0 / x.shape[-1]
    scale += eps
    np.sqrt(scale, out=scale)
    np.reciprocal(scale, out=scale)
    x *= scale[:, None]


class DrafterSequence:
    """One sequence of a drafter's context (a slot's, in an engine of several): the target rows
    recorded for it and not yet written, how far its pairs are written, its own clock. The model,
    the context and the graphs are the drafter's (``drafter``), which it drafts through on its own
    sequence ``seq``. A drafter is its own sequence 0 (:class:`EagleDrafter` is one);
    :meth:`EagleDrafter.for_sequence` makes the others. Its public methods are the ones a
    generation uses: ``observe``, ``drop_pending``, ``pending``, ``catch_up``, ``decode``,
    ``begin``, ``reset`` (no draft trees: their branches use sequences 1..TREE_SEQS)."""

    def __init__(self, drafter: "EagleDrafter", seq: int) -> None:
        self.name, self.shift, self.max_depth, self.ctx = drafter.name, drafter.shift, drafter.max_depth, drafter.ctx
        self._start_sequence(drafter, seq)

    def _start_sequence(self, drafter: "EagleDrafter", seq: int) -> None:
        """This sequence's own state, empty."""
        self.drafter = drafter
        self.seq = seq
        self._pending_feats: list[np.ndarray] = []   # recorded, not yet written (see observe)
        self._pending_tokens: list[int] = []
        self._pending_start: int | None = None
        self._written_until = 0   # committed pairs are written below this position; drafts above
        self.seconds = 0.0        # time inside llama.cpp calls for this sequence, read by the engine

    def decode(self, tokens: list[int], g: np.ndarray, start_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Write pairs (tokens[i], g[i]) at positions start_pos+i of this sequence; the last row's
        logits and fed-back state (:meth:`EagleDrafter.decode_rows`)."""
        return self.drafter.decode_rows(tokens, g, start_pos, self)

    def close(self) -> None:
        """Nothing of its own outside Python: the drafter closes the context."""

    def _rm(self, p: int) -> None:
        """Forget this sequence's pairs at positions >= ``p`` (0 or below: all of them)."""
        self.ctx.seq_rm(p + self.shift if p > 0 else 0, seq=self.seq)

    # -- cycle-level API used by the engine ----------------------------------------------------
    # The target's features must be read right after each target decode, but feeding them to the
    # drafter can wait until the next draft: while the policy decodes plain, committed rows only
    # accumulate here (a copy of 3 x n_embd floats per token), and one catch-up writes them all.

    def observe(self, tokens_next: list[int], n_rows: int, start_pos: int, rows: list[int] | None = None) -> None:
        """Record the committed rows of the target's last batch: ``n_rows`` positions from
        ``start_pos`` (the batch's first rows, or its rows ``rows``); ``tokens_next[i]`` is the
        token at ``start_pos + i + 1``."""
        if self._pending_start is None:
            self._pending_start = start_pos
        elif start_pos != self._pending_start + len(self._pending_tokens):
            raise LocalspecError("internal: drafter rows recorded out of order")
        self._pending_feats.append(self.drafter.features(n_rows, rows))
        self._pending_tokens.extend(tokens_next[:n_rows])

    def drop_pending(self) -> None:
        """Forget the recorded rows (the next ``observe`` may start at any later position; the
        drafter's cache then restarts from there, see catch_up)."""
        self._pending_feats, self._pending_tokens, self._pending_start = [], [], None

    @property
    def pending(self) -> int:
        return len(self._pending_tokens)

    def catch_up(self, max_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Write the recorded pairs (dropping the speculative entries after them) and return the
        logits and fed-back state for the first draft of the next cycle.

        Every drafter row costs about one drafting step (llama.cpp's eagle3 graph computes the
        vocabulary logits of every row), so after a long stretch of plain decoding ``max_rows``
        writes only the most recent rows, and the drafter forgets the older ones (it attends to what
        is there; drafts only get a little worse, never the output)."""
        if self._pending_start is None:
            raise LocalspecError("internal: the drafter has no committed rows to draft from")
        feats = np.concatenate(self._pending_feats) if len(self._pending_feats) > 1 else self._pending_feats[0]
        start, tokens = self._pending_start, self._pending_tokens
        self._pending_feats, self._pending_tokens, self._pending_start = [], [], None
        if max_rows is not None and len(tokens) > max_rows:
            cut = len(tokens) - max_rows
            feats, tokens, start = feats[cut:], tokens[cut:], start + cut
        # drop speculative pairs of earlier drafts; llama.cpp takes a sequence's positions only
        # consecutively, so rows after a gap (drop_pending, or the cut above) start afresh: the
        # drafter then attends to the recent rows only
        self._rm(start if start <= self._written_until else 0)
        g = self.drafter.encode(feats, self)
        self._written_until = start + len(tokens)
        return self.decode(tokens, g, start)

    def begin(self, prompt: list[int], keep: int) -> None:
        """A generation of ``prompt`` starts, its pairs below ``keep`` kept from the last one."""
        self.reset(keep)

    def reset(self, keep: int) -> None:
        """Forget drafter pairs (written or recorded) at positions >= keep."""
        self._rm(keep)
        self._written_until = min(self._written_until, keep)
        if self._pending_start is not None:
            n = max(0, keep - self._pending_start)
            if n == 0:
                self._pending_feats, self._pending_tokens, self._pending_start = [], [], None
            elif n < len(self._pending_tokens):
                self._pending_feats = [np.concatenate(self._pending_feats)[:n]]
                self._pending_tokens = self._pending_tokens[:n]


class EagleDrafter(DrafterSequence):
    """Owns the drafter model/context and turns target features into draft tokens.

    ``name``: the draft source it is on every surface (stats, metrics, ``--source``); ``shift``:
    where the pair of position ``P`` sits in its context (``P + shift``; an MTP head's cache
    holds it one later, :mod:`.mtp`).

    It is the sequence 0 of its context (a :class:`DrafterSequence`); :meth:`for_sequence` gives
    another sequence of the same context and model (a slot of a parallel engine), with its own
    pending rows and clock, as a :class:`DrafterSequence` (its ``sequence_class``). ``slots``: sequences the context holds (each up to ``n_ctx``
    positions, in one unified pool)."""

    name = "eagle"
    shift = 0
    max_depth: int | None = None   # the longest chain it can draft (None: as long as asked)
    sequence_class = DrafterSequence   # its other sequences (for_sequence)

    def __init__(self, info: GGUFInfo, target: Context, *, n_ctx: int, n_batch: int,
                 n_threads: int | None = None, n_gpu_layers: int = 0, slots: int = 1) -> None:
        llama_ext.check_available()
        self.info = info
        self.target = target
        self._start_sequence(self, 0)
        self.model = Model(info.path, n_gpu_layers=n_gpu_layers)
        settings = dict(DRAFTER_CONTEXT, n_seq_max=max(DRAFTER_CONTEXT["n_seq_max"], slots))
        # llama.cpp gives an eagle3 context (an "encoder" model to it: llama_model_has_encoder) n_batch
        # logit rows whatever n_outputs_max asks, and reserves a row per sequence at creation:
        # GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max) aborted serve --parallel 65..256. A
        # batch as large as the slots holds them (the rows' buffer grows by a vocabulary row per slot).
        self.ctx = Context(self.model, n_ctx=n_ctx * slots, n_batch=max(n_batch, settings["n_seq_max"]),
                           n_threads=n_threads, ctx_other=target, **settings)
        self.tree_seqs = TREE_SEQS
        self.layers = llama_ext.model_target_layer_ids(self.model.ptr)
        if tuple(self.layers) != tuple(info.target_layers or ()):
            raise LocalspecError(f"{info.path.name}: llama.cpp reads target layers {self.layers}, metadata says {info.target_layers}")
        for lid in self.layers:
            llama_ext.set_embeddings_layer_inp(target.ptr, lid, True)
        llama_ext.set_embeddings_nextn(self.ctx.ptr, True, True)
        self.n_embd = self.model.n_embd
        self.n_embd_tgt = target.model.n_embd
        rms_eps = float(info.metadata.get(K.key(K.KEY_RMS_EPS, K.EAGLE3_ARCH), 1e-6))
        self.fc_norm_eps = float(info.fc_norm_eps) if info.fc_norm_eps is not None else rms_eps
        self.out_norm_eps = rms_eps
        self.out_norm = read_tensor(info, K.T_OUTPUT_NORM).astype(np.float32) if info.norm_output else None
        self._batch = llama_cpp.llama_batch_ext_init(self.ctx.ptr)
        self._views: dict = {}    # numpy views of llama.cpp's output buffers, by (address, shape)

    def for_sequence(self, seq: int) -> DrafterSequence:
        """Sequence ``seq`` of this context, with its own recorded rows and clock (itself for its
        own sequence)."""
        return self if seq == self.seq else self.sequence_class(self, seq)

    # -- target side -------------------------------------------------------------------------
    def features(self, n_rows: int, rows: list[int] | None = None) -> np.ndarray:
        """The three target layer inputs of the first ``n_rows`` rows of the target's last batch
        (or of its batch rows ``rows``, in that order: the accepted path of a draft tree)."""
        out = llama_ext.layer_inputs(self.target.ptr, self.layers, self.n_embd_tgt, *self.target.token_rows(n_rows, rows),
                                     self._views)
        if self.info.fc_norm:   # each of the three blocks of every row, in place
            _rms_normalize_rows(out.reshape(len(out) * 3, self.n_embd_tgt), self.fc_norm_eps)
        return out

    # -- drafter graphs ------------------------------------------------------------------------
    def _process(self, kind: int, who: DrafterSequence | list[DrafterSequence] | None = None) -> None:
        """Run the batch; its seconds go to the sequence ``who`` (None: this drafter's own; a list:
        shared among them)."""
        t0 = time.perf_counter()
        rc = llama_cpp.llama_process(self.ctx.ptr, kind, self._batch)
        spent = time.perf_counter() - t0
        if isinstance(who, list):
            for each in who:
                each.seconds += spent / len(who)
        else:
            (who or self).seconds += spent
        if rc != 0:
            raise llama_failure(f"the drafter failed (llama_process code {rc})")

    def encode(self, features: np.ndarray, who: DrafterSequence | None = None) -> np.ndarray:
        """fc over target features: one ``g`` row per feature row, after the pairs of sequence
        ``who`` (None: this drafter's own)."""
        who = who or self
        n = features.shape[0]
        out = np.empty((n, self.n_embd), dtype=np.float32)
        step = self.ctx.n_batch
        rows = self._rows()
        for start in range(0, n, step):
            chunk = np.ascontiguousarray(features[start:start + step], dtype=np.float32)
            m = chunk.shape[0]
            llama_cpp.llama_batch_ext_clear(self._batch)
            rows.embeddings(who.seq, chunk, self.ctx.pos_max(who.seq) + 1)
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, who)
            address = llama_ext.nextn_address(self.ctx.ptr)
            if not address:
                raise LocalspecError("the drafter encoder produced no output")
            out[start:start + m] = llama_ext.float_view(address, (m, self.n_embd), self._views)
        return out

    def _decode_rows(self, tokens: list[int], g: np.ndarray, start_pos: int, output: bool,
                     seqs: list[int] | None = None, who: DrafterSequence | None = None) -> int:
        """Rows at consecutive positions from ``start_pos`` in the sequence ``who`` (None: this
        drafter's own), or (``seqs``) each in its own sequence, all at ``start_pos``."""
        who = who or self
        llama_cpp.llama_batch_ext_clear(self._batch)
        n = len(tokens)
        if seqs is None:
            seqs, positions = [who.seq] * n, [self._position(who.seq, start_pos + i) for i in range(n)]
        else:
            positions = [self._position(s, start_pos) for s in seqs]
        idx = self._rows().tokens(seqs, tokens, g, positions, output)
        self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, who)
        return idx

    def _position(self, seq: int, pos: int) -> int:
        """Where the pair of position ``pos`` of sequence ``seq`` goes in the drafter's context."""
        return pos + self.shift

    def _rows(self) -> ExtRows:
        """The row filler of this drafter's batch (made at first use: each drafter kind opens its
        own batch)."""
        rows = self.__dict__.get("_ext_rows")
        if rows is None or rows.batch is not self._batch:
            rows = self._ext_rows = ExtRows(self._batch)
        return rows

    def decode_steps(self, rows: list[tuple[DrafterSequence, int, np.ndarray, int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The next chain step of several sequences (slots) in one drafter decode per
        ``ALL_OUTPUT_ROWS`` rows: (sequence, token, fed-back state, position) each; per row its
        logits (a view: read them before the next drafter decode) and its next state. Each decode's seconds are shared among its sequences."""
        out = []
        for start in range(0, len(rows), ALL_OUTPUT_ROWS):
            part = rows[start:start + ALL_OUTPUT_ROWS]
            llama_cpp.llama_batch_ext_clear(self._batch)
            states = np.stack([row[2] for row in part]).astype(np.float32, copy=False)
            self._rows().tokens([row[0].seq for row in part], [row[1] for row in part], states,
                                [self._position(row[0].seq, row[3]) for row in part], True)
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, [row[0] for row in part])
            # views: each chain reads its row before the next drafter decode (scheduler.drive_chains)
            out.extend((self.ctx.logits(j), self._state(j)) for j in range(len(part)))
        return out

    def decode_rows(self, tokens: list[int], g: np.ndarray, start_pos: int,
                    who: DrafterSequence) -> tuple[np.ndarray, np.ndarray]:
        """Write pairs (tokens[i], g[i]) at positions start_pos+i of sequence ``who``; return the
        last row's logits (over the target vocabulary) and the state to feed back to the next step.

        llama.cpp's eagle3 DECODE graph does not select output rows: with only the last row
        marked, it hands back row 0's logits and state. So short batches mark every row (a few
        extra rows of logits), and long ones (prompt chunks) write all but the last row without
        outputs, then the last row alone, as llama.cpp's own loop does.
        """
        n = len(tokens)
        g = np.ascontiguousarray(g, dtype=np.float32)
        if n > ALL_OUTPUT_ROWS:
            step = self.ctx.n_batch
            for i in range(0, n - 1, step):
                j = min(i + step, n - 1)
                self._decode_rows(tokens[i:j], g[i:j], start_pos + i, output=False, who=who)
            tokens, g, start_pos = tokens[-1:], g[-1:], start_pos + n - 1
        idx = self._decode_rows(tokens, g, start_pos, output=True, who=who)
        return self.ctx.logits(idx), self._state(idx)

    def _state(self, idx: int) -> np.ndarray:
        address = llama_ext.nextn_ith_address(self.ctx.ptr, idx)
        if not address:
            raise LocalspecError("the drafter returned no hidden state")
        src = llama_ext.float_view(address, (self.n_embd,), self._views)
        if self.out_norm is None:
            return src.copy()
        x = float(np.dot(src, src))
        state = np.multiply(src, self.out_norm)
        state *= 1.0 / math.sqrt(x / self.n_embd + self.out_norm_eps)   # a Python float: no numpy scalars
        return state

    # -- draft trees (speculation.tree) --------------------------------------------------------
    def fork(self, src: int, dst: int) -> None:
        """Sequence ``dst`` sees what ``src`` sees (sequence 0: the committed pairs)."""
        self.ctx.seq_cp(src, dst)

    def forget(self, seq: int) -> None:
        """Drop a branch sequence (cells no other sequence holds are freed)."""
        self.ctx.seq_rm(-1, -1, seq=seq)

    def decode_branches(self, tokens: list[int], g: np.ndarray, pos: int,
                        seqs: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        """One decode of several tree branches, all at ``pos``, row ``i`` in sequence ``seqs[i]``:
        per row a copy of its logits and its fed-back state."""
        if len(tokens) > ALL_OUTPUT_ROWS:
            raise LocalspecError(f"internal: {len(tokens)} branches exceed {ALL_OUTPUT_ROWS} rows")
        self._decode_rows(tokens, np.ascontiguousarray(g, dtype=np.float32), pos, True, seqs)
        return [(np.array(self.ctx.logits(i)), self._state(i)) for i in range(len(tokens))]

    def close(self) -> None:
        batch, self._batch = self._batch, None   # dropped before freed (see llama_model.Model.close)
        if batch:
            llama_cpp.llama_batch_ext_free(batch)
        self.ctx.close()
        self.model.close()
