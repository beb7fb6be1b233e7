"""One model drafter: a llama.cpp context beside the target's, its batch, its decodes and its
sequences (:class:`ModelDrafter`), composed with a per-kind part (:class:`DrafterKind`) that says
only what its kind does differently.

The kinds (each a :class:`DrafterKind` of its own, none extending another): EAGLE-3/3.1's
target features and fc encode (:mod:`.eagle`), the MTP heads' position shift and chained heads
(:mod:`.mtp`), Gemma 4's assistant over the target's KV cache (:mod:`.assistant`).

Convention (as in llama.cpp's ``common/speculative.cpp``): the drafter's cache holds at position
``P + shift`` the pair (token at ``P+1``, ``g`` at ``P``), where ``g`` is what the kind makes of
the target's state at ``P`` for committed positions (:meth:`DrafterKind.encode`), or the drafter's
own fed-back state for drafted ones. The output at ``P`` predicts the token at ``P+2``.

A generation drafts through one :class:`DrafterSequence` (a slot's sequence of the context,
:meth:`ModelDrafter.for_sequence`): the target rows recorded for it and not yet written, how far
its pairs are written, its own clock. Draft trees use sequences ``1..TREE_SEQS`` as branches.
"""

from __future__ import annotations

import time

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from ..llama import hostloop, llama_ext
from ..llama.contexts import DRAFTER_TREE_SEQS
from ..llama.ext_rows import DirectRows, ExtRows
from ..llama.llama_model import Context, Model
from ..llama.process import llama_failure

# Up to this many rows, a drafter batch asks for every row's output (see ModelDrafter.decode_groups).
ALL_OUTPUT_ROWS = 16
# A sequence's buffer of recorded feature rows holds this many (more only while a prompt's are recorded).
KEPT_ROWS = 64
# Sequences besides the committed one (0), for the branches of a draft tree (speculation.tree).
TREE_SEQS = DRAFTER_TREE_SEQS   # tree.MAX_WIDTH: the drafter context's settings (llama.contexts) hold them


class DrafterKind:
    """What a kind of model drafter does differently; the defaults are the common case (a state
    taken as it is, pairs at ``P + shift``, the chain steps of several sequences in one decode).
    ``name``: the draft source it is on every surface; ``max_depth``: the longest chain it
    drafts (None: as long as asked); ``n_embd``: the width of its fed-back state; ``cached``:
    it writes pairs to cells of its own (the assistant reads the target's); ``first_pair``: a
    sequence starting at 0 pairs the prompt's first token with a zero state (MTP)."""

    name = ""
    shift = 0
    max_depth: int | None = None
    cached = True
    first_pair = False
    block = False          # a block drafter: a draft of any depth is one decode (speculation.dflash)
    # its rows (``n_embd`` wide, the context's n_embd_inp; encode rows n_embd_inp_enc) go in a plain
    # llama_batch, one C call a decode (llama.ext_rows.DirectRows), not the extended batch's four a row
    direct = False
    # (output_norm's address or None, its eps): how a direct kind's state is fed back, which lets
    # a greedy chain run in one C call (llama.hostloop.greedy_chain); None: no such chain
    state_norm: tuple[int | None, float] | None = None
    n_embd = 0
    sequence_class: type | None = None   # None: DrafterSequence

    def features(self, d: "ModelDrafter", n_rows: int, rows: list[int] | None) -> np.ndarray:
        """What the drafter reads of the first ``n_rows`` rows of the target's last batch (or of
        its rows ``rows``, in that order: a draft tree's accepted path), one row each: the target's
        layer inputs where :meth:`layer_inputs` names them, side by side, each block RMS-scaled
        where it gives an eps. A kind that reads something else overrides this."""
        spec = self.layer_inputs()
        if spec is None:
            raise NotImplementedError
        layers, width, eps = spec
        return llama_ext.layer_inputs(d.target, layers, width, *d.target.token_rows(n_rows, rows), d.views, eps)

    def layer_inputs(self) -> tuple[tuple[int, ...], int, float | None] | None:
        """Where :meth:`features` are the target's layer inputs: (layers, each one's width, the
        eps of each block's RMS scaling or None), which a sequence then gathers straight into its
        recorded rows (:meth:`DrafterSequence.observe`); None: :meth:`features` reads them."""
        return None

    def encode(self, d: "ModelDrafter", features: np.ndarray, who: "DrafterSequence") -> np.ndarray:
        """The ``g`` rows paired with the committed tokens: the features as they are."""
        return np.ascontiguousarray(features, dtype=np.float32)

    def encode_groups(self, d: "ModelDrafter", groups: list[tuple["DrafterSequence", np.ndarray]]) -> list[np.ndarray]:
        """:meth:`encode` of several sequences' features (a kind with an encode graph runs them
        all in one)."""
        return [self.encode(d, features, who) for who, features in groups]

    @property
    def shares_catch_up(self) -> bool:
        """Whether several sequences' catch-ups may share one encode and one decode
        (:meth:`ModelDrafter.catch_ups`): where a catch-up is a plain :meth:`write` of its rows."""
        return type(self).write is DrafterKind.write and type(self).decode is DrafterKind.decode

    def position(self, seq: int, pos: int) -> int:
        """Where the pair of position ``pos`` of sequence ``seq`` goes in the drafter's context."""
        return pos + self.shift

    def state(self, src: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The state to feed back, from the view of the one llama.cpp returned (into ``out``
        where given)."""
        return src.copy() if out is None else np.copyto(out, src) or out

    def write(self, who: "DrafterSequence", tokens: list[int], g: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """A catch-up's committed pairs from ``start``: the last row's logits and state."""
        return who.decode(tokens, g, start)

    def decode(self, who: "DrafterSequence", tokens: list[int], g: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """Pairs (tokens[i], g[i]) at start+i of ``who``: the last row's logits and state."""
        return who.drafter.decode_rows(tokens, g, start, who)

    def decode_steps(self, d: "ModelDrafter", rows: list[tuple]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The next chain step of several sequences (see :meth:`ModelDrafter.decode_steps`)."""
        return d.batched_steps(rows)

    def begin_sequence(self, who: "DrafterSequence") -> None:
        """A sequence of the drafter is made (a kind's own per-sequence state goes on it here)."""

    def observed(self, who: "DrafterSequence") -> None:
        """Rows were recorded for ``who`` (a kind may write a long backlog at once)."""

    def forgot(self, who: "DrafterSequence", keep: int) -> None:
        """``who`` forgot its pairs at positions >= ``keep`` (-1: its recorded rows were dropped):
        a kind's per-sequence state goes with them."""

    def close(self) -> None:
        """What the kind holds outside Python (nothing by default)."""


class ModelDrafter:
    """A model drafter: its model (its own, or the target's for MTP heads), its context beside the
    target's, one batch, and its sequences; ``kind`` says what its kind does differently.
    ``slots``: sequences the context holds for generations (each up to ``n_ctx`` positions)."""

    def __init__(self, kind: DrafterKind, model: Model, ctx: Context, target: Context, *, own_model: bool) -> None:
        self.kind, self.model, self.ctx, self.target = kind, model, ctx, target
        self.name, self.shift, self.max_depth = kind.name, kind.shift, kind.max_depth
        self.n_embd, self.block = kind.n_embd, kind.block
        self.tree_seqs = TREE_SEQS
        self.seconds = 0.0        # llama.cpp time outside any sequence's clock (the calibration's)
        self._own_model = own_model
        self._batch = llama_cpp.llama_batch_ext_init(ctx.ptr)
        self._rows = ExtRows(self._batch)
        self.direct = kind.direct   # rows through DirectRows (False: the extended batch, as other kinds)
        # a chain step is one row of decode_rows (no decode of the kind's own): step takes it directly
        self._plain_decode = type(kind).decode is DrafterKind.decode and kind.sequence_class is None
        self._shifts = type(kind).position is DrafterKind.position   # every pair at P + shift (see positions)
        self._direct = DirectRows(ctx.n_batch, kind.n_embd, tokens=True, ctx_ptr=ctx.ptr) if kind.direct else None
        self._direct_enc: DirectRows | None = None   # made at the first encode (its width: the features')
        self.views: dict = {}    # numpy views of llama.cpp's output buffers, by (address, shape)
        self._nextn_ith = llama_ext.nextn_ith_getter()   # a state's address, read every step
        self._nextn_at = hostloop.address(self._nextn_ith)
        # a lone catch-up's encode and decode in one C call (write_direct): EAGLE's kind, whose
        # catch-up is its fc encode then a decode of the pairs (past one decode's outputs, in chunks)
        self._c_catch_up = (hostloop.catch_up is not None and kind.direct and self._plain_decode
                            and kind.state_norm is not None and type(kind).write is DrafterKind.write
                            and ctx.n_batch >= ALL_OUTPUT_ROWS)
        self._c_catch_up_rows = min(ALL_OUTPUT_ROWS, ctx.n_batch, ctx.n_outputs_max)   # the slots' fused catch-ups
        self._nextn_all_at = hostloop.address(llama_ext.nextn_getter()) if self._c_catch_up else 0
        self._sequences: dict[int, object] = {}

    def for_sequence(self, seq: int):
        """Sequence ``seq`` of this context (the same object each time it is asked)."""
        got = self._sequences.get(seq)
        if got is None:
            got = self._sequences[seq] = (self.kind.sequence_class or DrafterSequence)(self, seq)
        return got

    def reset(self, keep: int) -> None:
        """Every sequence forgets its pairs at positions >= ``keep`` (the calibration's reset)."""
        for who in self._sequences.values():
            who.reset(keep)

    # -- the kind's parts ----------------------------------------------------------------------
    def features(self, n_rows: int, rows: list[int] | None = None) -> np.ndarray:
        return self.kind.features(self, n_rows, rows)

    def encode(self, features: np.ndarray, who: "DrafterSequence") -> np.ndarray:
        return self.kind.encode(self, features, who)

    # -- decodes -------------------------------------------------------------------------------
    def process(self, kind: int, who=None) -> None:
        """Run the batch; its seconds go to the sequence ``who`` (None: the drafter's own; a list:
        shared among them)."""
        t0 = time.perf_counter()
        rc = llama_cpp.llama_process(self.ctx.ptr, kind, self._batch)
        self._spent(time.perf_counter() - t0, who, rc)

    def _run_direct(self, rows: DirectRows, who) -> None:
        """:meth:`process` of the rows filled in ``rows`` (llama_decode / llama_encode: the same
        decode / encode of the same rows, see :class:`~localspec.llama.ext_rows.DirectRows`)."""
        t0 = time.perf_counter()
        rc = rows.run()
        self._spent(time.perf_counter() - t0, who, rc)

    def _spent(self, spent: float, who, rc: int) -> None:
        if isinstance(who, list):
            for each in who:
                each.seconds += spent / len(who)
        else:
            (who or self).seconds += spent
        if rc != 0:
            raise llama_failure(f"the drafter failed (llama_process code {rc})")

    def _run_rows(self, seqs: list[int], tokens: list[int], g: np.ndarray, positions: list[int], output: bool,
                  who) -> int:
        """One decode of token rows (row ``i``: ``tokens[i]`` with ``g[i]``, in ``seqs[i]`` at
        ``positions[i]``); the last row's index."""
        direct = self._direct
        if not self.direct or direct is None:
            idx = self.clear().tokens(seqs, tokens, g, positions, output)
            self.process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, who)
            return idx
        idx = direct.fill(seqs, tokens, g, positions, output)
        self._run_direct(direct, who)
        return idx

    def write_direct(self, who, tokens: list[int], feats: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray] | None:
        """A lone catch-up (:meth:`DrafterSequence.catch_up`) in one C call
        (:func:`llama.hostloop.catch_up`): the encode of ``feats`` and the decode of the pairs
        (tokens[i], g[i]) from ``start``, as ``kind.write(who, tokens, encode(feats), start)`` runs
        them (a prompt's rows too, in the same chunks); the last row's logits (a view) and state.
        None where that call does not apply (not built, another kind): the caller takes the kind's path."""
        args = self._catch_up_args(who, tokens, feats, start)
        if args is None:
            return None
        state = np.empty(self.n_embd, dtype=np.float32)
        try:
            logits_at, seconds = hostloop.catch_up(*args, state)
        except RuntimeError as e:
            raise llama_failure(str(e)) from None
        who.seconds += seconds
        return llama_ext.float_view(logits_at, (self.model.n_vocab,), self.views), state

    def fuses(self, n: int, k: int) -> bool:
        """Whether a catch-up of ``n`` rows and a greedy chain of ``k`` after it run as one C call
        (:meth:`chain_args`)."""
        return self._c_catch_up and hostloop.catch_up_chain is not None and n > 0 and k >= 1

    def chain_args(self, who, tokens: list[int], feats: np.ndarray, start: int, pos: int, k: int) -> tuple:
        """A catch-up (:meth:`write_direct`'s) and :meth:`greedy`'s chain of ``k`` drafts from its
        last row (the pair of the token at ``pos``) as one C call (:func:`llama.hostloop.catch_up_chain`),
        planned: its arguments, for :meth:`run_chain` in the step's run phase
        (:class:`.sources.PlannedChain`). Only where :meth:`fuses` says so."""
        args = self._catch_up_args(who, tokens, feats, start)
        if args is None:
            raise LocalspecError("internal: a fused catch-up where the C host loop does not apply")
        return (*args, self.model.n_vocab, self.positions(who.seq, pos, k - 1), self._trim((who,)))

    def run_chain(self, who, args: tuple, then: tuple | None = None) -> tuple[list[int], float, tuple | None]:
        """The C call :meth:`chain_args` planned, with the target decode ``then`` after it (see
        :func:`llama.hostloop.catch_up_chain`): (its drafts, its seconds inside llama.cpp, None
        or (the target decode's code, its seconds))."""
        try:
            if then is None:
                (drafts, seconds), decoded = hostloop.catch_up_chain(*args), None
            else:
                drafts, seconds, *decoded = hostloop.catch_up_chain(*args, then)
        except RuntimeError as e:
            raise llama_failure(str(e)) from None
        who.seconds += seconds
        if args[-1] is not None:   # chain_args' last: the trim, which the C call did
            who.trimmed()
        return drafts, seconds, decoded

    def _trim(self, sequences) -> tuple | None:
        """A C chain's ``trim`` argument: the sequences' drafted pairs dropped as it ends (None: a
        recurrent state, trimmed through :meth:`~.llama_model.Context.seq_rm` only)."""
        at = self.ctx.trim_address
        return None if at is None else (at, tuple([who.drafted_from() for who in sequences]))

    def positions(self, seq: int, pos: int, n: int) -> tuple[int, ...]:
        """Where the pairs of positions ``pos..pos + n - 1`` of sequence ``seq`` go in the drafter's
        context (:meth:`DrafterKind.position`): a chain's steps, as the C calls take them; a range
        where the kind shifts every pair alike (no Python call a step, right after a decode)."""
        if self._shifts:
            return tuple(range(pos + self.shift, pos + self.shift + n))
        position = self.kind.position
        return tuple([position(seq, pos + i) for i in range(n)])

    def _catch_up_args(self, who, tokens: list[int], feats: np.ndarray, start: int) -> tuple | None:
        """The C catch-up's arguments (see :func:`llama.hostloop.catch_up`), or None where it does not apply."""
        n = len(tokens)
        if not self._c_catch_up or hostloop.catch_up is None or n == 0 or feats.shape[0] != n:
            return None
        enc = self._direct_enc
        if enc is None or enc.width != feats.shape[1]:
            enc = self._direct_enc = DirectRows(self.ctx.n_batch, feats.shape[1], tokens=False, ctx_ptr=self.ctx.ptr)
        seq, (norm, eps) = who.seq, self.kind.state_norm
        return (self.ctx.address, enc.address, self._direct.address, self._nextn_all_at, self._nextn_at, norm,
                self.n_embd, eps, feats, feats.shape[1], tuple(tokens), self.ctx.pos_max(seq) + 1,
                self.kind.position(seq, start), seq, self.ctx.n_batch)

    def encode_rows(self, seqs: np.ndarray, embd: np.ndarray, positions: np.ndarray, who) -> None:
        """One encode of embedding rows alone (row ``i`` in sequence ``seqs[i]`` at
        ``positions[i]``, each with its output); its seconds to ``who`` (see :meth:`process`)."""
        if not self.direct:
            self.clear().embeddings(seqs, embd, positions)
            self.process(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, who)
            return
        direct = self._direct_enc
        if direct is None or direct.width != embd.shape[1]:
            direct = self._direct_enc = DirectRows(self.ctx.n_batch, embd.shape[1], tokens=False, ctx_ptr=self.ctx.ptr)
        direct.fill_embeddings(seqs, embd, positions)
        self._run_direct(direct, who)

    def clear(self) -> ExtRows:
        """The batch, emptied, and its row filler."""
        llama_cpp.llama_batch_ext_clear(self._batch)
        return self._rows

    def decode_rows(self, tokens: list[int], g: np.ndarray, start_pos: int, who) -> tuple[np.ndarray, np.ndarray]:
        """Write pairs (tokens[i], g[i]) at positions start_pos+i of sequence ``who``; return the
        last row's logits (over the target vocabulary) and the state to feed back to the next step
        (:meth:`decode_groups` of one sequence)."""
        if len(tokens) == 1 and self.direct:   # one row, one C call (a chain step's own path: step)
            return self._direct_step(who, tokens[0], g, start_pos, False)
        return self.decode_groups([(who, tokens, g, start_pos)])[0]

    def decode_groups(self, groups: list[tuple], lasts: list[bool] | None = None) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """Pairs of several sequences in as few drafter decodes as llama.cpp's outputs allow: a
        group is (sequence, tokens, g rows, start), the pair (tokens[j], g[j]) at start + j of
        that sequence; per group its last row's logits (a view, valid until the next drafter
        decode) and fed-back state (None where ``lasts[i]``: a chain's last step, see :meth:`step`).

        llama.cpp's eagle3 DECODE graph does not select output rows: with only the last row
        marked, it hands back row 0's logits and state. So a group of up to ALL_OUTPUT_ROWS rows
        has every row marked (a few extra rows of logits); a longer one (a prompt, a backlog)
        writes all but its last row without outputs, ``n_batch`` rows a decode, as llama.cpp's
        own loop does. Whole groups (a long one's last row) share decodes of every row marked,
        as many rows as one decode outputs, in order: each row lands in the cells it takes
        alone (a row's cell changes the rounding of its attention), and a group of several rows
        comes out bit for bit as it does alone; a one-row group alone goes through ggml's
        one-row product (another summation order: ~1e-5 apart, as a batched chain step is). A
        decode's seconds go to its group's sequence, or are shared among its groups'."""
        limit, out, part, rows = self.ctx.n_outputs_max, [], [], 0
        for group in groups:   # in order: each row lands in the cells it takes alone
            n = len(group[1])
            if part and (n > ALL_OUTPUT_ROWS or rows + n > limit):
                self._outputs(part, lasts, out, copy=True)
                part, rows = [], 0
            if n > ALL_OUTPUT_ROWS:
                group, n = self._lead(group), 1
            part.append(group)
            rows += n
        self._outputs(part, lasts, out, copy=False)
        return out

    def _outputs(self, part: list[tuple], lasts: list[bool] | None, out: list, *, copy: bool) -> None:
        """One decode of whole groups, every row marked; each group's last row's logits (a copy
        where ``copy``: a later decode reuses the output rows) and state appended to ``out``."""
        seqs, tokens, g, positions, ends = self._lined_up(part)
        self._run_rows(seqs, tokens, g, positions, True, part[0][0] if len(part) == 1 else [p[0] for p in part])
        at = len(out)
        wants = [lasts is None or not lasts[at + i] for i in range(len(ends))]
        logits, states = self._rows_read(len(tokens), ends, wants)
        for i, j in enumerate(ends):
            out.append((np.array(logits[j]) if copy else logits[j],
                        self.kind.state(states[j]) if wants[i] else None))

    def _rows_read(self, n_rows: int, ends: list[int], wants: list[bool]) -> tuple:
        """The logits and the pre-norm states of a decode whose ``n_rows`` rows were all outputs,
        indexable by row: for several groups one ``(n_rows, width)`` view of each (two C calls
        in all, llama.cpp keeps output rows contiguous in batch order), for one its row's alone."""
        ctx = self.ctx
        block = ctx.logits_block(n_rows) if len(ends) > 1 else None
        if block is None:
            return ({j: ctx.logits(j) for j in ends},
                    {j: self._state_view(j) for j, w in zip(ends, wants) if w})
        if not any(wants):
            return block, None
        address = llama_ext.nextn_address(ctx.ptr)
        if not address:
            raise LocalspecError("the drafter returned no hidden state")
        return block, llama_ext.float_view(address, (n_rows, self.n_embd), self.views)

    def _lead(self, group: tuple) -> tuple:
        """A long group's rows but its last, without outputs, ``n_batch`` rows a decode; the
        group of its last row (:meth:`decode_groups`)."""
        who, tokens, g, start = group
        n, step, position, seq = len(tokens), self.ctx.n_batch, self.kind.position, who.seq
        g = np.ascontiguousarray(g, dtype=np.float32)
        for i in range(0, n - 1, step):
            j = min(i + step, n - 1)
            self._run_rows([seq] * (j - i), tokens[i:j], g[i:j], [position(seq, start + p) for p in range(i, j)],
                           False, who)
        return who, tokens[-1:], g[-1:], start + n - 1

    def _lined_up(self, groups: list[tuple]) -> tuple[list[int], list[int], np.ndarray, list[int], list[int]]:
        """The groups' rows side by side: sequences, tokens, g rows, positions in the drafter's
        context, and each group's last row's index."""
        position = self.kind.position
        seqs: list[int] = []
        tokens: list[int] = []
        positions: list[int] = []
        ends: list[int] = []
        for who, toks, _, start in groups:
            seq = who.seq
            if len(toks) == 1:   # a chain step's row (the most frequent)
                seqs.append(seq)
                tokens.append(toks[0])
                positions.append(position(seq, start))
            else:
                seqs += [seq] * len(toks)
                tokens += toks
                positions += [position(seq, start + i) for i in range(len(toks))]
            ends.append(len(tokens) - 1)
        g = groups[0][2] if len(groups) == 1 else np.concatenate([group[2] for group in groups])
        return seqs, tokens, np.ascontiguousarray(g, dtype=np.float32), positions, ends

    def catch_ups(self, asks: list[tuple]) -> list[tuple[np.ndarray, np.ndarray]]:
        """The catch-ups of several sequences (``(sequence, max_rows)`` each, see
        :meth:`DrafterSequence.catch_up`): where the kind allows (:attr:`DrafterKind.shares_catch_up`),
        ONE encode of every sequence's committed rows and ONE decode of their pairs, each row in
        its own sequence at its own position (:meth:`decode_groups`), else one after another.
        Per sequence its last row's logits (a view, valid until the next drafter decode) and state."""
        if len(asks) == 1:   # alone: its own catch-up, the same decodes
            who, rows = asks[0]
            return [who.catch_up(rows)]
        if not self.kind.shares_catch_up:   # each its own decodes: the earlier ones' logits copied
            out = []
            for i, (who, rows) in enumerate(asks):
                logits, state = who.catch_up(rows)
                out.append((np.array(logits) if i < len(asks) - 1 else logits, state))
            return out
        taken = [who.take(rows) for who, rows in asks]
        encoded = self.kind.encode_groups(self, [(who, feats) for (who, _), (_, feats, _) in zip(asks, taken)])
        return self.decode_groups([(who, tokens, g, start)
                                   for (who, _), (tokens, _, start), g in zip(asks, taken, encoded)])

    def step(self, who, token: int, state: np.ndarray, pos: int, last: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """One chain step of the sequence ``who``: the pair (``token``, ``state``) at ``pos``; its
        logits (a view, valid until the next drafter decode) and the state to feed back, None where
        ``last`` (the chain's last step: that state is never read, and computing it is the largest
        piece of a step's Python). Kinds with a decode of their own (MTP's chained heads) go
        through it, their state computed."""
        if self.direct and self._plain_decode:
            return self._direct_step(who, token, state, pos, last)
        return who.decode([token], state[None, :], pos)

    def _direct_step(self, who, token: int, g: np.ndarray, pos: int, last: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """One row through :class:`DirectRows` and one ``llama_decode``, timed to ``who``."""
        direct = self._direct
        idx = direct.fill_one(who.seq, token, g, self.kind.position(who.seq, pos))
        t0 = time.perf_counter()
        rc = direct.run()
        who.seconds += time.perf_counter() - t0
        if rc != 0:
            raise llama_failure(f"the drafter failed (llama_decode code {rc})")
        return self.ctx.logits(idx), None if last else self.state(idx)

    def greedy(self, who, logits: np.ndarray, state: np.ndarray, pos: int, k: int) -> list[int]:
        """A greedy chain of ``k`` drafts of the sequence ``who`` alone, no confidence test, no
        grammar: the first from ``logits`` (with ``state``, the pair of the token at ``pos``), each
        next one from a :meth:`step` on the last: the drafts of the general chain
        (:meth:`~.model_source.EagleSource._chain` driven by ``run_chain``), without its per-step
        layers; a direct kind's steps run in one loop that writes each fed-back state straight
        into the next step's batch row."""
        if k < 1:
            return []
        tokens = [hostloop.argmax(logits)]
        if k == 1:
            return tokens
        if self.direct and self._plain_decode:
            if hostloop.greedy_chain is not None and self.kind.state_norm is not None:
                return self._greedy_in_c(who, tokens, state, pos, k)
            return self._greedy_direct(who, tokens, state, pos, k)
        while len(tokens) < k:
            n = len(tokens)
            logits, state = self.step(who, tokens[-1], state, pos + n - 1, n == k - 1)
            tokens.append(hostloop.argmax(logits))
        return tokens

    def _greedy_in_c(self, who, tokens: list[int], state: np.ndarray, pos: int, k: int) -> list[int]:
        """:meth:`_greedy_direct` in one C call (:func:`llama.hostloop.greedy_chain`): the same
        decodes, argmaxes and fed-back states, none of them run through Python."""
        direct, position, seq = self._direct, self.kind.position, who.seq
        direct.fill_one(seq, tokens[0], state, position(seq, pos))
        norm, eps = self.kind.state_norm
        try:
            more, seconds = hostloop.greedy_chain(self.ctx.address, direct.address, self._nextn_at, norm, self.n_embd,
                                                  eps, self.model.n_vocab, self.positions(seq, pos + 1, k - 2))
        except RuntimeError as e:
            raise llama_failure(str(e)) from None
        who.seconds += seconds
        return tokens + more

    def greedy_rounds(self, rows: list[tuple]) -> list[list[int]] | None:
        """Several sequences' greedy chains after their first drafts ((sequence, first draft, its
        state, its position, k) each), their steps decoded together in one C call
        (:func:`llama.hostloop.greedy_rounds`: a decode a round of every chain with a step left,
        the rows :meth:`decode_steps` would decode). Per chain its drafts after the first; None
        where the C loop does not apply (the driver runs the rounds itself)."""
        if (hostloop.greedy_rounds is None or not (self.direct and self._plain_decode)
                or self.kind.state_norm is None or not 0 < len(rows) <= self._c_catch_up_rows):
            return None
        direct, position = self._direct, self.kind.position
        seqs = tuple(who.seq for who, *_ in rows)
        direct.fill(seqs, [row[1] for row in rows], np.stack([row[2] for row in rows]),
                    [position(seq, row[3]) for seq, row in zip(seqs, rows)], True)
        norm, eps = self.kind.state_norm
        later = tuple([self.positions(seq, row[3] + 1, row[4] - 2) for seq, row in zip(seqs, rows)])
        trim = self._trim([who for who, *_ in rows])
        try:
            drafts, seconds = hostloop.greedy_rounds(self.ctx.address, direct.address, self._nextn_at, norm,
                                                     self.n_embd, eps, self.model.n_vocab, seqs, later, trim)
        except RuntimeError as e:
            raise llama_failure(str(e)) from None
        for (who, *_), spent in zip(rows, seconds):
            who.seconds += spent
            if trim is not None:
                who.trimmed()
        return drafts

    def catch_up_rounds(self, asks: list[tuple]) -> list[list[int]] | None:
        """Several sequences' catch-ups and greedy chains in one C call
        (:func:`llama.hostloop.catch_up_rounds`): ((sequence, max_rows, pos, k) each, ``pos`` the
        position of the token its first draft follows) the rows :meth:`catch_ups`, then
        :meth:`greedy_rounds`, decode, their drafts' pairs dropped as it ends. Per chain its ``k``
        drafts; None where the call does not apply (not built, another kind, more rows than one
        decode outputs): the driver takes the general path, nothing taken yet."""
        if (hostloop.catch_up_rounds is None or not self._c_catch_up or not self.kind.shares_catch_up
                or self.ctx.trim_address is None):
            return None
        rows = 0
        for who, max_rows, _, k in asks:
            n = who.pending if max_rows is None else min(who.pending, max_rows)
            if k < 1 or n < 1:
                return None
            rows += n
        if rows > self._c_catch_up_rows:
            return None
        position, groups = self.kind.position, []
        for who, max_rows, pos, k in asks:
            tokens, feats, start = who.take(max_rows)
            seq = who.seq
            groups.append((seq, tuple(tokens), np.ascontiguousarray(feats, dtype=np.float32), position(seq, start),
                           self.positions(seq, pos, k - 1)))
        width = groups[0][2].shape[1]
        enc = self._direct_enc
        if enc is None or enc.width != width:
            enc = self._direct_enc = DirectRows(self.ctx.n_batch, width, tokens=False, ctx_ptr=self.ctx.ptr)
        norm, eps = self.kind.state_norm
        whos = [who for who, *_ in asks]
        trim = self._trim(whos)
        try:
            drafts, seconds = hostloop.catch_up_rounds(self.ctx.address, enc.address, self._direct.address,
                                                       self._nextn_all_at, self._nextn_at, norm, self.n_embd, eps,
                                                       self.model.n_vocab, width, self.ctx.trim_address,
                                                       self._c_catch_up_rows, tuple(groups), trim)
        except RuntimeError as e:
            raise llama_failure(str(e)) from None
        for who, spent in zip(whos, seconds):
            who.seconds += spent
            if trim is not None:
                who.trimmed()
        return drafts

    def _greedy_direct(self, who, tokens: list[int], state: np.ndarray, pos: int, k: int) -> list[int]:
        """:meth:`greedy`'s steps through :class:`DirectRows`: one row, refilled in place (token,
        position; the state written into it by the kind), one ``llama_decode`` each."""
        direct, position, seq = self._direct, self.kind.position, who.seq
        row, decode, clock, logits_of = direct.embd[0], direct.run, time.perf_counter, self.ctx.logits
        direct.fill_one(seq, tokens[0], state, position(seq, pos))
        while len(tokens) < k:
            t0 = clock()
            rc = decode()
            who.seconds += clock() - t0
            if rc != 0:
                raise llama_failure(f"the drafter failed (llama_decode code {rc})")
            logits = logits_of(0)
            if len(tokens) < k - 1:   # the next step's state, straight into its row
                self.state(0, row)
            tokens.append(hostloop.argmax(logits))
            if len(tokens) < k:
                direct.refill_one(tokens[-1], position(seq, pos + len(tokens) - 1))
        return tokens

    def decode_steps(self, rows: list[tuple]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """The next chain step of several sequences (slots): (sequence, token, fed-back state,
        position, last) each; per row its logits (a view: read them before the next drafter
        decode) and its next state (None for a chain's ``last`` step, see :meth:`step`)."""
        return self.kind.decode_steps(self, rows)

    def batched_steps(self, rows: list[tuple]) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """:meth:`decode_steps` as :meth:`decode_groups` of one row each: one drafter decode per
        ``ALL_OUTPUT_ROWS`` rows, its seconds shared among its sequences; each chain reads its
        logits before the next drafter decode (scheduler.drive_chains)."""
        return self.decode_groups([(who, [tok], state[None], pos) for who, tok, state, pos, _ in rows],
                                  [row[4] for row in rows])

    def state(self, idx: int, out: np.ndarray | None = None) -> np.ndarray:
        """The fed-back state of output row ``idx`` of the last decode (into ``out`` where given)."""
        return self.kind.state(self._state_view(idx), out)

    def _state_view(self, idx: int) -> np.ndarray:
        """Output row ``idx``'s pre-norm state as llama.cpp left it (a view, until the next decode)."""
        address = self._nextn_ith(self.ctx.ptr, idx)
        if not address:
            raise LocalspecError("the drafter returned no hidden state")
        return llama_ext.float_view(address, (self.n_embd,), self.views)

    # -- draft trees (speculation.tree) --------------------------------------------------------
    def fork(self, src: int, dst: int) -> None:
        """Sequence ``dst`` sees what ``src`` sees (nothing to copy where the cells are the target's)."""
        if self.kind.cached:
            self.ctx.seq_cp(src, dst)

    def forget(self, seq: int) -> None:
        """Drop a branch sequence (cells no other sequence holds are freed)."""
        if self.kind.cached:
            self.ctx.seq_rm(-1, -1, seq=seq)

    def decode_branches(self, tokens: list[int], g: np.ndarray, pos: int, seqs: list[int],
                        who=None) -> list[tuple[np.ndarray, np.ndarray]]:
        """One decode of several tree branches, all at ``pos``, row ``i`` in sequence ``seqs[i]``:
        per row a copy of its logits and its fed-back state."""
        if len(tokens) > ALL_OUTPUT_ROWS:
            raise LocalspecError(f"internal: {len(tokens)} branches exceed {ALL_OUTPUT_ROWS} rows")
        if not self.kind.cached:   # nothing is cached: every branch is a row of the drafting sequence
            seqs = [0 if who is None else who.seq] * len(tokens)
        position = self.kind.position
        self._run_rows(seqs, tokens, np.ascontiguousarray(g, dtype=np.float32), [position(s, pos) for s in seqs], True,
                       who)
        return [(np.array(self.ctx.logits(i)), self.state(i)) for i in range(len(tokens))]

    def close(self) -> None:
        """The batch, the context (before the target's, whose cache or embeddings it reads) and
        the model where it is the drafter's own (MTP heads': the engine closes the target)."""
        batch, self._batch = self._batch, None   # dropped before freed (see llama_model.Model.close)
        if batch:
            llama_cpp.llama_batch_ext_free(batch)
        self.kind.close()
        self.ctx.close()
        if self._own_model:
            self.model.close()


class DrafterSequence:
    """One sequence of a drafter's context (a slot's): the target rows recorded for it and not
    yet written, how far its pairs are written, its own clock. Its public methods are the ones a
    generation uses: ``observe``, ``drop_pending``, ``pending``, ``catch_up`` (``take``), ``decode``,
    ``begin``, ``reset``, and the tree's ``fork``, ``forget``, ``decode_branches``."""

    def __init__(self, drafter: ModelDrafter, seq: int) -> None:
        self.drafter, self.seq, self.kind = drafter, seq, drafter.kind
        self.name, self.shift, self.max_depth = drafter.name, drafter.shift, drafter.max_depth
        self.ctx, self.n_embd, self.tree_seqs = drafter.ctx, drafter.n_embd, drafter.tree_seqs
        self.block = drafter.kind.block
        # whether the kind hears of each observe (DFlash's backlog): every cycle otherwise skips the call
        self._tells_kind = type(self.kind).observed is not DrafterKind.observed
        self._feats: np.ndarray | None = None   # rows [0, pending) recorded, not yet written (see observe)
        self._gather = _gatherer(self.kind, drafter.target)   # the C gather's arguments (layer inputs), or None
        self._target = drafter.target
        self._pending_tokens: list[int] = []
        self._pending_start: int | None = None
        self.written_until = 0   # committed pairs are written below this position; drafts above
        self._trimmed = False    # the drafts above written_until are gone already (trim)
        self._first: int | None = None   # the prompt's first token (first_pair kinds)
        self.seconds = 0.0        # time inside llama.cpp calls for this sequence, read by the engine
        self.kind.begin_sequence(self)

    def decode(self, tokens: list[int], g: np.ndarray, start_pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Write pairs (tokens[i], g[i]) at positions start_pos+i of this sequence; the last row's
        logits and fed-back state."""
        return self.kind.decode(self, tokens, g, start_pos)

    def step(self, token: int, state: np.ndarray, pos: int, last: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """One chain step (:meth:`ModelDrafter.step`): the logits and the state to feed back
        (None where ``last``: the chain's last step)."""
        return self.drafter.step(self, token, state, pos, last)

    def greedy(self, logits: np.ndarray, state: np.ndarray, pos: int, k: int) -> list[int]:
        """A greedy chain of ``k`` drafts alone (:meth:`ModelDrafter.greedy`)."""
        return self.drafter.greedy(self, logits, state, pos, k)

    def rm(self, p: int) -> None:
        """Forget this sequence's pairs at positions >= ``p`` (0 or below: all of them)."""
        self.ctx.seq_rm(self._cell(p), seq=self.seq)

    def _cell(self, p: int) -> int:
        """The drafter context's position of this sequence's pair ``p`` as :meth:`rm` counts it."""
        return p + self.shift if p > 0 else 0

    def drafted_from(self) -> int:
        """Where the pairs a chain drafts after the committed ones begin in the drafter's
        context: what a C chain drops once it ends (``trim``), then :meth:`trimmed` is told."""
        return self._cell(self.written_until)

    def trimmed(self) -> None:
        """A C chain dropped its drafted pairs itself: the next catch-up (:meth:`take`) needs no
        trim of its own (it cost three Python frames after the target's decode, though moving it
        did not shorten one slot's cycle: docs/speculation.md, fourth round)."""
        self._trimmed = True

    # -- cycle-level API used by the engine ----------------------------------------------------
    # The target's features must be read right after each target decode, but feeding them to the
    # drafter can wait until the next draft: while the policy decodes plain, committed rows only
    # accumulate here (a copy of the features per token), and one catch-up writes them all.

    def observe(self, tokens_next: list[int], n_rows: int, start_pos: int, rows: list[int] | None = None) -> None:
        """Record the committed rows of the target's last batch: ``n_rows`` positions from
        ``start_pos`` (the batch's first rows, or its rows ``rows``); ``tokens_next[i]`` is the
        token at ``start_pos + i + 1``. Layer inputs are gathered by one C call straight into the
        recorded rows: right after a decode every Python frame runs cold, and the three that read
        them through the kind cost ~60 µs a cycle there (docs/speculation.md, fifth round)."""
        pending = self._pending_tokens
        if self._pending_start is None:
            if start_pos == 0 and self.kind.first_pair and self._first is not None:
                # the first token's pair, (x_0, a zero state) at position 0, as draft-mtp writes it
                self._pending_start = -1
                self._rows(1, self.n_embd)[:] = 0.0
                pending.append(self._first)
            else:
                self._pending_start = start_pos
        elif start_pos != self._pending_start + len(pending):
            raise LocalspecError("internal: drafter rows recorded out of order")
        gather, gather_rows = self._gather, hostloop.gather_rows   # (None: C not built, or turned off by a test)
        if gather is not None and gather_rows is not None:
            if self._target.token_order is not None:   # the batch went in re-ordered (llama.stream_rows)
                n_rows, rows = self._target.token_rows(n_rows, rows)
            out = self._rows(n_rows if rows is None else len(rows), gather[4])
            try:
                gather_rows(out, gather[0], gather[1], gather[2], gather[3], 0, n_rows, rows, gather[5])
            except RuntimeError as e:
                raise LocalspecError(str(e)) from None
        else:
            feats = self.kind.features(self.drafter, n_rows, rows)
            self._rows(feats.shape[0], feats.shape[1])[:] = feats
        pending.extend(tokens_next[:n_rows])
        if self._tells_kind:
            self.kind.observed(self)

    def _rows(self, n: int, width: int) -> np.ndarray:
        """The next ``n`` recorded rows (``width`` floats each), to be filled: the buffer grows
        by doubling, so that recording a row copies nothing but its features."""
        feats, at = self._feats, len(self._pending_tokens)
        if feats is None or at + n > feats.shape[0] or feats.shape[1] != width:
            grown = np.empty((max(2 * at + n, KEPT_ROWS), width), dtype=np.float32)
            if at:
                grown[:at] = feats[:at]
            feats = self._feats = grown
        return feats[at:at + n]

    def drop_pending(self) -> None:
        """Forget the recorded rows (the next ``observe`` may start at any later position; the
        drafter's cache then restarts from there, see catch_up)."""
        if self._pending_start is not None:   # none recorded (most rested cycles): nothing to renew
            self._pending_tokens, self._pending_start = [], None
            self._release()
        self.kind.forgot(self, -1)

    def _release(self) -> None:
        """A buffer grown past KEPT_ROWS (a prompt's rows) is not kept for the next cycles' few."""
        if self._feats is not None and self._feats.shape[0] > KEPT_ROWS:
            self._feats = None

    @property
    def pending(self) -> int:
        return len(self._pending_tokens)

    def catch_up(self, max_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Write the recorded pairs (dropping the speculative entries after them) and return the
        logits and fed-back state for the first draft of the next cycle (several sequences'
        together: :meth:`ModelDrafter.catch_ups`).

        Every drafter row costs about one drafting step (llama.cpp's graphs compute the vocabulary
        logits of every row), so after a long stretch of plain decoding ``max_rows`` writes only
        the most recent rows, and the drafter forgets the older ones (it attends to what is
        there; drafts only get a little worse, never the output)."""
        tokens, feats, start = self.take(max_rows)
        done = self.drafter.write_direct(self, tokens, feats, start)
        if done is not None:
            return done
        return self.kind.write(self, tokens, self.drafter.encode(feats, self), start)

    def plan_greedy(self, max_rows: int | None, pos: int, k: int) -> tuple:
        """:meth:`catch_up`, then :meth:`greedy`'s ``k`` drafts from it (the pair of the token at
        ``pos``), planned as one C call where the drafter :meth:`~ModelDrafter.fuses` them: the
        rows taken now, the call's arguments for :meth:`run_planned` (the step's run phase, right
        before the target's decode)."""
        tokens, feats, start = self.take(max_rows)
        return self.drafter.chain_args(self, tokens, feats, start, pos, k)

    def run_planned(self, args: tuple, then: tuple | None = None) -> tuple[list[int], float, tuple | None]:
        """The chain :meth:`plan_greedy` planned (then the target decode ``then``, see
        :meth:`ModelDrafter.run_chain`)."""
        return self.drafter.run_chain(self, args, then)

    def take(self, max_rows: int | None = None) -> tuple[list[int], np.ndarray, int]:
        """A catch-up's rows, taken from the recorded ones: (tokens, features, first position),
        the speculative pairs after the written ones dropped (see :meth:`catch_up`)."""
        if self._pending_start is None:
            raise LocalspecError("internal: the drafter has no committed rows to draft from")
        start, tokens = self._pending_start, self._pending_tokens
        feats = self._feats[:len(tokens)]   # a view: read by the catch-up before the next observe writes
        self._pending_tokens, self._pending_start = [], None
        self._release()   # (the view keeps a prompt's buffer until the catch-up is done with it)
        if max_rows is not None and len(tokens) > max_rows:
            cut = len(tokens) - max_rows
            feats, tokens, start = feats[cut:], tokens[cut:], start + cut
        # drop speculative pairs of earlier drafts; llama.cpp takes a sequence's positions only
        # consecutively, so rows after a gap (drop_pending, or the cut above) start afresh: the
        # drafter then attends to the recent rows only
        if not (self._trimmed and start == self.written_until):
            self.rm(start if start <= self.written_until else 0)
        self._trimmed = False
        self.written_until = start + len(tokens)
        return tokens, feats, start

    def begin(self, prompt: list[int], keep: int) -> None:
        """A generation of ``prompt`` starts, its pairs below ``keep`` kept from the last one."""
        self._first = int(prompt[0]) if len(prompt) else None
        self.reset(keep)

    def reset(self, keep: int) -> None:
        """Forget drafter pairs (written or recorded) at positions >= keep (0: all of them, the
        first token's pair too)."""
        self.rm(keep)
        self._trimmed = False
        self.written_until = min(self.written_until, max(keep, 0))
        self.kind.forgot(self, keep)
        if keep <= 0:
            self.drop_pending()
        elif self._pending_start is not None:
            n = max(0, keep - self._pending_start)
            if n == 0:
                self.drop_pending()
            elif n < len(self._pending_tokens):
                self._pending_tokens = self._pending_tokens[:n]   # rows past n in the buffer: free again

    # -- draft trees (speculation.tree) --------------------------------------------------------
    def fork(self, src: int, dst: int) -> None:
        self.drafter.fork(src, dst)

    def forget(self, seq: int) -> None:
        self.drafter.forget(seq)

    def decode_branches(self, tokens: list[int], g: np.ndarray, pos: int,
                        seqs: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.drafter.decode_branches(tokens, g, pos, seqs, self)

    def close(self) -> None:
        """Nothing of its own outside Python: the drafter closes the context."""


def _gatherer(kind: DrafterKind, target: Context) -> tuple | None:
    """hostloop.gather_rows' arguments for a kind whose features are the target's layer inputs
    (the function's and the target's addresses, the layers, their width, the row width, the RMS
    eps or -1), or None: the kind reads its features itself (or C is not built)."""
    spec = kind.layer_inputs()
    if spec is None or hostloop.gather_rows is None:
        return None
    layers, width, eps = spec
    return (llama_ext.layer_inputs_function(), target.address, tuple(layers), width, len(layers) * width,
            -1.0 if eps is None else eps)


def open_context(model: Model, target: Context, **settings) -> Context:
    """A drafter's context on ``model`` beside ``target`` (its ``ctx_other``); the model is closed
    if the context cannot be made."""
    try:
        return Context(model, ctx_other=target, **settings)
    except BaseException:
        model.close()
        raise


def assembled(model: Model, ctx: Context, target: Context, make_kind) -> ModelDrafter:
    """The backend over ``ctx`` with the kind ``make_kind()`` builds, checked by the kind's own
    ``check``; the context and the model are closed if either fails."""
    try:
        kind = make_kind()
    except BaseException:
        ctx.close()
        model.close()
        raise
    return checked(ModelDrafter(kind, model, ctx, target, own_model=True), kind.check)


def checked(d: ModelDrafter, check) -> ModelDrafter:
    """``d`` once ``check(d)`` passed (closed, and the error raised, if not)."""
    try:
        check(d)
    except BaseException:
        d.close()
        raise
    return d
