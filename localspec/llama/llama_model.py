"""Thin wrappers over llama-cpp-python's ctypes layer: one model, one context, one token batch.

Only what the engine needs, with llama.cpp's failures turned into LocalspecError (the log and the
backend set-up are :mod:`localspec.llama.process`'s).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections import Counter
from pathlib import Path
from typing import Sequence

import llama_cpp
import numpy as np

from ..core import interrupts, options
from ..core.errors import LocalspecError
from . import hostloop, stream_rows
from .special_split import SplitTokenizer
from .process import capture_log, init_backend, llama_failure, load_progress
from .weights_memory import HugePageLoad, read_weights

# Called once or more per generated token. llama_get_logits_ith bound to return the address as an
# int (llama-cpp-python's binding returns a float pointer, which costs a ctypes.cast per call).
_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, llama_cpp.llama_context_p_ctypes, ctypes.c_int32)(
    ("llama_get_logits_ith", llama_cpp.llama_cpp._lib))
# llama_get_logits likewise: every output row of the last batch, contiguous in batch order (llama.h)
_all_logits_address = ctypes.CFUNCTYPE(ctypes.c_void_p, llama_cpp.llama_context_p_ctypes)(
    ("llama_get_logits", llama_cpp.llama_cpp._lib))

MAX_THREADS = options.MAX_THREADS   # GGML_MAX_N_THREADS


def check_threads(n: int) -> int:
    """``n`` if llama.cpp can run that many threads: ggml indexes fixed arrays by thread, so more
    crashes the process."""
    if n == 0:   # "automatic" is resolved before this point
        raise LocalspecError(f"threads must be between 1 and {MAX_THREADS} (0: automatic), got 0")
    return options.check_threads(n)


def default_threads(*, reserve: int = 0) -> int:
    """``$LOCALSPEC_THREADS``, else every core this process may use but ``reserve`` (at least one).

    llama.cpp's workers spin while they wait, so more threads than free cores is far slower than
    fewer (docs/design-notes.md, note 5).
    """
    env = os.environ.get("LOCALSPEC_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise LocalspecError(f"LOCALSPEC_THREADS must be a number (got '{env}')") from None
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        n = os.cpu_count() or 1
    return max(1, n - reserve)


def gpu_offload_supported() -> bool:
    init_backend()
    return bool(llama_cpp.llama_supports_gpu_offload())


class Model:
    """A loaded GGUF model and its vocabulary."""

    def __init__(self, path: str | Path, *, n_gpu_layers: int = 0, no_alloc: bool = False,
                 load_mtp: bool = False) -> None:
        init_backend()
        self.path = Path(path)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        params.load_mtp = load_mtp   # the MTP (NextN) heads past the trunk: skipped unless asked for
        self.load_mtp = load_mtp
        params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP  # as llama-cpp-python's Llama loads (not "auto")
        # weights read into huge-page memory: faster decodes on the CPU (localspec.llama.weights_memory)
        self.weights_read = not no_alloc and read_weights(n_gpu_layers)
        if no_alloc:  # metadata only, allocations simulated (llama.cpp needs no mmap for that)
            params.no_alloc = True
        if no_alloc or self.weights_read:
            params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
        params.progress_callback = load_progress   # a module global: never collected
        with capture_log() as self.load_log, (HugePageLoad() if self.weights_read else contextlib.nullcontext()):
            self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if interrupts.pending() or not self._model:
            self.close()
            interrupts.raise_if_pending()
            raise llama_failure(f"llama.cpp could not load {self.path.name}")
        self.ptr = self._model
        self.vocab = llama_cpp.llama_model_get_vocab(self._model)
        self._split = SplitTokenizer(self.vocab, self._llama_tokenize)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(llama_cpp.llama_model_n_embd(self._model))
        self.n_layer = int(llama_cpp.llama_model_n_layer(self._model))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
        self.bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        self.eos = int(llama_cpp.llama_vocab_eos(self.vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))
        self.size_bytes = int(llama_cpp.llama_model_size(self._model))
        # a recurrent state per sequence (Mamba, RWKV; hybrid: Qwen3.5's gated delta nets, Qwen3-Next,
        # Nemotron-H ...): llama.cpp cannot trim it to any position, see Context.can_seq_rm
        self.recurrent = bool(llama_cpp.llama_model_is_recurrent(self._model)
                              or llama_cpp.llama_model_is_hybrid(self._model))
        self._pieces: dict[bool, list[bytes]] = {}   # special -> every token's bytes (pieces)
        # a set: the membership test runs once a generated token, right after a decode (a numpy
        # element and its bool() cost several times as much there)
        self._eog = frozenset(tok for tok in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, tok))

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True,
                 limit: int | None = None) -> list[int]:
        """llama.cpp's tokens for ``text``, its special tokens cut out in linear time
        (:mod:`.special_split`); TooManyTokens once ``limit`` special tokens are found, or more
        than ``limit`` tokens made. Safe on any thread: the vocabulary is only read."""
        return self._split.tokens(text.encode("utf-8"), add_special=add_special, parse_special=parse_special, limit=limit)

    def _llama_tokenize(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        """llama.cpp's own tokenization of ``data`` (quadratic in its special tokens: see :meth:`tokenize`)."""
        capacity = len(data) + 8
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            raise LocalspecError("could not tokenize the prompt")
        return list(buf[:n])

    def pieces(self, *, special: bool = False) -> list[bytes]:
        """Every token's bytes by id (``special``: control tokens as their text, else as nothing),
        built on first use: a token's first lookup right after a decode costs ~35 µs of cold
        tokenizer tables, the whole table ~10 ms once (in C; see llama.hostloop)."""
        table = self._pieces.get(special)
        if table is None:
            table = self._pieces[special] = hostloop.pieces(self.vocab, self.n_vocab, special)
        return table

    def piece(self, token: int) -> bytes:
        """The bytes of one token as text (special tokens rendered as nothing)."""
        table = self._pieces.get(False) or self.pieces()
        if not 0 <= token < len(table):
            raise LocalspecError(f"token {token} is not in the vocabulary (0..{len(table) - 1})")
        return table[token]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        """The tokens' text; ``special``: control tokens written as their text (``<|im_start|>``),
        so that tokenizing it again with special tokens parsed gives them back."""
        piece = self.special_piece if special else self.piece
        return b"".join(piece(t) for t in tokens).decode("utf-8", "replace")

    def special_piece(self, token: int) -> bytes:
        """The bytes of one token, a control token as its text."""
        table = self.pieces(special=True)
        if not 0 <= token < len(table):
            raise LocalspecError(f"token {token} is not in the vocabulary (0..{len(table) - 1})")
        return table[token]

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """The fill-in-the-middle tokens (prefix, suffix, middle) llama.cpp found in the GGUF, or None."""
        ids = (llama_cpp.llama_vocab_fim_pre(self.vocab), llama_cpp.llama_vocab_fim_suf(self.vocab),
               llama_cpp.llama_vocab_fim_mid(self.vocab))
        return None if any(t < 0 or t >= self.n_vocab for t in ids) else tuple(int(t) for t in ids)

    def is_eog(self, token: int) -> bool:
        return token in self._eog

    @property
    def eog(self) -> frozenset[int]:
        """Every end-of-generation token."""
        return self._eog

    def close(self) -> None:
        # the handle is dropped before it is freed: a Ctrl-C raised right after the native call
        # (Python runs signal handlers there) must not leave it for __del__ to free twice
        model, self._model = getattr(self, "_model", None), None
        if model:
            llama_cpp.llama_model_free(model)

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass


def _closed(*args) -> int:
    raise LocalspecError("internal: a call on a closed context")


def _outputs_param(n_outputs_max: int, n_ctx: int, n_batch: int, n_seq_max: int) -> int:
    """llama.cpp's n_outputs_max (0: its default, n_batch capped by n_ctx): the most logit rows one
    batch may ask for (it sizes the compute buffer). llama.cpp also reserves a row per sequence and
    asserts they fit (GGML_ASSERT, at a small n_ctx with many sequences)."""
    if n_outputs_max or n_seq_max > min(n_ctx, n_batch):
        return max(n_outputs_max or min(n_ctx, n_batch), n_seq_max)
    return 0


class Context:
    """A llama.cpp context (KV cache + compute buffers) over one model, decoding sequence 0."""

    pad_single: range | None = None   # positions where one row is decoded as two (runtime.batch)

    def __init__(
        self,
        model: Model,
        *,
        n_ctx: int,
        n_batch: int = 512,
        n_threads: int | None = None,
        ctx_other: "Context | None" = None,
        n_seq_max: int = 1,
        kv_unified: bool = False,
        precise_attention: bool = False,
        kv_type: int | None = None,
        n_outputs_max: int = 0,
        mtp: bool = False,
        n_rs_seq: int = 0,
    ) -> None:
        self.model = model
        params = llama_cpp.llama_context_default_params()
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP if mtp else params.ctx_type   # mtp: the MTP heads' graph
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_seq_max, params.kv_unified = n_seq_max, kv_unified
        threads = check_threads(n_threads or default_threads())
        params.n_threads = threads
        params.n_threads_batch = threads
        self.n_threads = threads
        params.no_perf = True
        if precise_attention:  # F32 KV, no flash attention (it rounds Q to F16 on CPU)
            params.type_k = params.type_v = 0  # GGML_TYPE_F32
            params.flash_attn_type = 0
        if kv_type is not None and not precise_attention:  # a ggml type id for both K and V
            params.type_k = params.type_v = kv_type
        params.n_outputs_max = _outputs_param(n_outputs_max, n_ctx, n_batch, n_seq_max)
        # rollback snapshots of a recurrent state (0 where the arch has none); 1 + n_rs_seq rows fit a ubatch
        params.n_rs_seq = max(0, min(n_rs_seq, min(n_ctx, n_batch) - 2))
        if ctx_other is not None:
            params.ctx_other = ctx_other.ptr
        with capture_log() as self.load_log:
            self._ctx = llama_cpp.llama_init_from_model(model.ptr, params)
        if self._ctx and interrupts.pending():
            self.close()
        interrupts.raise_if_pending()
        if not self._ctx:
            raise llama_failure(f"llama.cpp could not create a context for {model.path.name}")
        self.ptr = self._ctx
        self.address = hostloop.address(self._ctx)   # the context as C code is handed it (llama.hostloop)
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))
        self.n_seq_max = n_seq_max
        # one KV stream per sequence (llama-server's layout): rows go in sorted (llama.stream_rows; token_order: where)
        self.streams, self._sent_at, self.token_order = not kv_unified and n_seq_max > 1, None, None
        # llama.cpp may lower n_batch to the requested n_ctx (while it grows the context): every
        # batch, hence every batch of logit rows (a padded verify, a tree), must fit in it
        n_batch = self.n_batch = min(int(llama_cpp.llama_n_batch(self._ctx)), int(llama_cpp.llama_n_ubatch(self._ctx)))
        self.n_outputs_max = min(n_outputs_max or n_batch, n_batch)
        self.memory = llama_cpp.llama_get_memory(self._ctx)
        self.n_rs_seq = int(llama_cpp.llama_n_rs_seq(self._ctx))
        # a recurrent state (not an MTP context: its head's KV only): each sequence's rows in its last decode
        self._recurrent: dict[int, int] | None = {} if model.recurrent and not mtp else None
        self._rolled_back: set[int] = set()   # rolled back, not decoded past since
        self._views: dict[int, np.ndarray] = {}
        self._init_calls(n_batch, n_seq_max)

    def _init_calls(self, n_batch: int, n_seq_max: int) -> None:
        """The token batch every decode fills (rows of sequence 0 until told otherwise), and the
        calls that run it and trim the memory: in C where the host loop was built."""
        self._seq_rm, self._pos_max = hostloop.memory_calls(self.memory)
        # the memory's address for a C loop that trims it itself (plain llama_memory_seq_rm: no recurrent state)
        self.trim_address = hostloop.address(self.memory) if hostloop.COMPILED and self._recurrent is None else None
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, n_seq_max)
        self._run = hostloop.batch_runner(self._ctx, self._batch)   # run(n): llama_decode of its first n rows
        self._run_tokens = hostloop.token_runner(self._ctx, self._batch)   # sequence 0's rows filled and run, in C
        self._run_rows = hostloop.rows_runner(self._ctx, self._batch)   # several sequences' rows, in C
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        n_seq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))
        n_seq[:] = 1
        for i in range(n_batch):
            self._batch.seq_id[i][0] = 0

    def set_threads(self, n_threads: int) -> None:
        """Run later decodes (single tokens and batches) on ``n_threads`` threads."""
        n = check_threads(n_threads)
        llama_cpp.llama_set_n_threads(self._ctx, n, n)
        self.n_threads = n

    def decode(self, tokens: Sequence[int], start_pos: int, *, all_logits: bool) -> None:
        """Decode ``tokens`` at positions ``start_pos..``; logits for every row or only the last."""
        n = len(tokens)
        if n == 0:
            return
        self._sent_at = self.token_order = None
        if n > self.n_batch:
            raise LocalspecError(f"internal: batch of {n} exceeds n_batch {self.n_batch}")
        if all_logits and n > self.n_outputs_max:  # llama.cpp would abort the process
            raise LocalspecError(f"internal: {n} logit rows exceed n_outputs_max {self.n_outputs_max}")
        if self._run_tokens is not None:   # the rows filled and decoded in one C call
            rc = self._run_tokens(tokens, start_pos, all_logits)
        else:
            if n == 1:  # a plain decoding step: the hot path, kept lean
                self._tok[0] = tokens[0]
                self._pos[0] = start_pos
                self._out[0] = 1
            else:
                self._tok[:n] = tokens
                self._pos[:n] = np.arange(start_pos, start_pos + n, dtype=np.int32)
                self._out[:n] = 1 if all_logits else 0
                self._out[n - 1] = 1
            rc = self._run(n)
        if self._recurrent is not None:
            self._decoded({0: n})
        interrupts.raise_if_pending()   # a Ctrl-C a log callback caught (embedding programs' handlers)
        if rc != 0:
            raise llama_failure(f"llama_decode failed (code {rc})")

    def decode_call(self, tokens: list[int], start_pos: int, *, all_logits: bool) -> tuple | None:
        """:meth:`decode`'s C call, checked but not run, for a planned drafter chain's C call to run
        right after its drafts fill ``tokens`` (``hostloop.catch_up_chain``'s ``then`` without its
        rows); :meth:`decoded` follows it. None where C was not built."""
        n = len(tokens)
        if self._run_tokens is None or n == 0:
            return None
        if n > self.n_batch:
            raise LocalspecError(f"internal: batch of {n} exceeds n_batch {self.n_batch}")
        if all_logits and n > self.n_outputs_max:  # llama.cpp would abort the process
            raise LocalspecError(f"internal: {n} logit rows exceed n_outputs_max {self.n_outputs_max}")
        self._sent_at = self.token_order = None
        return self._run_tokens, tokens, start_pos, all_logits

    def decoded(self, n: int, rc: int) -> None:
        """After :meth:`decode_call`'s decode of ``n`` rows ran (llama.cpp's code ``rc``): as :meth:`decode` ends."""
        if self._recurrent is not None:
            self._decoded({0: n})
        interrupts.raise_if_pending()
        if rc != 0:
            raise llama_failure(f"llama_decode failed (code {rc})")

    def decode_batch(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int],
                     outputs: Sequence[bool]) -> None:
        """Decode rows of several sequences in one batch, one sequence per row (the scheduler's
        step: every slot's rows); read a row's logits with :meth:`logits` at its index."""
        n = len(tokens)
        if n == 0:
            return
        if n > self.n_batch:
            raise LocalspecError(f"internal: batch of {n} exceeds n_batch {self.n_batch}")
        n_out = sum(1 for o in outputs if o)
        if n_out > self.n_outputs_max:  # llama.cpp would abort the process
            raise LocalspecError(f"internal: {n_out} logit rows exceed n_outputs_max {self.n_outputs_max}")
        sent = stream_rows.arrange(seqs) if self.streams else None
        self._sent_at = self.token_order = None
        if sent is not None:   # sorted by sequence: one micro-batch per run of consecutive slots
            self.token_order = stream_rows.inverse(sent)
            last = max((i for i in range(n) if outputs[i]), default=n - 1)
            self._sent_at = self.token_order + [self.token_order[last]]   # [-1]: the last row with logits
            tokens, positions = [tokens[i] for i in sent], [positions[i] for i in sent]
            seqs, outputs = [seqs[i] for i in sent], [outputs[i] for i in sent]
        rc = self._run_rows(tokens, positions, seqs, outputs) if self._run_rows is not None else \
            self._fill_and_run(tokens, positions, seqs, outputs)
        if self._recurrent is not None:
            self._decoded(Counter(seqs))
        interrupts.raise_if_pending()
        if rc != 0:
            raise llama_failure(f"llama_decode failed (code {rc})")

    def _fill_and_run(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int],
                      outputs: Sequence[bool]) -> int:
        """:meth:`decode_batch`'s rows through numpy and ctypes (no C host loop); llama.cpp's code."""
        n = len(tokens)
        self._tok[:n] = tokens
        self._pos[:n] = positions
        self._out[:n] = np.asarray(outputs, dtype=np.int8)
        seq_id = self._batch.seq_id
        moved = [i for i, s in enumerate(seqs) if s]
        for i in moved:
            seq_id[i][0] = seqs[i]
        try:
            return self._run(n)
        finally:
            for i in moved:  # decode() writes sequence 0 only
                seq_id[i][0] = 0

    def decode_rows(self, rows: Sequence[tuple[int, int, int, bool]]) -> None:
        """Decode rows of several sequences at once: (seq, token, pos, wants_logits) each; read a
        row's logits with :meth:`logits` at its index in ``rows``."""
        self._decode_seqs([r[1] for r in rows], [r[2] for r in rows], [(r[0],) for r in rows],
                          [r[3] for r in rows])

    def decode_tree(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[Sequence[int]]) -> None:
        """Decode a draft tree in one batch, logits for every row: row ``i`` holds ``tokens[i]`` at
        ``positions[i]`` and belongs to the sequences ``seqs[i]`` (the leaves below it). A row
        attends to the cells of its first sequence, so each sequence must already hold the
        committed prefix (:meth:`seq_cp`) and list the rows of one root-to-leaf path."""
        if len(tokens) > self.n_outputs_max:
            raise LocalspecError(f"internal: tree of {len(tokens)} rows exceeds n_outputs_max {self.n_outputs_max}")
        self._decode_seqs(tokens, positions, seqs, [True] * len(tokens))

    def decode_sets(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[Sequence[int]],
                    outputs: Sequence[bool]) -> None:
        """Decode rows that may each belong to several sequences (``seqs[i]``), logits where
        ``outputs`` says: a draft tree's rows beside other rows of a step."""
        n_out = sum(1 for o in outputs if o)
        if n_out > self.n_outputs_max:  # llama.cpp would abort the process
            raise LocalspecError(f"internal: {n_out} logit rows exceed n_outputs_max {self.n_outputs_max}")
        self._decode_seqs(tokens, positions, seqs, outputs)

    def _decode_seqs(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[Sequence[int]],
                     outputs: Sequence[bool]) -> None:
        n = len(tokens)
        self._sent_at = self.token_order = None
        if n > self.n_batch:
            raise LocalspecError(f"internal: batch of {n} exceeds n_batch {self.n_batch}")
        n_seq = self._batch.n_seq_id
        seq_id = self._batch.seq_id
        for i in range(n):
            row = seqs[i]
            if not 0 < len(row) <= self.n_seq_max:
                raise LocalspecError(f"internal: batch row {i} has {len(row)} sequences")
            self._tok[i] = tokens[i]
            self._pos[i] = positions[i]
            self._out[i] = 1 if outputs[i] else 0
            n_seq[i] = len(row)
            for j, s in enumerate(row):
                seq_id[i][j] = s
        try:
            rc = self._run(n)
        finally:
            for i in range(n):  # decode() writes sequence 0 only
                n_seq[i] = 1
                seq_id[i][0] = 0
        if self._recurrent is not None:
            self._decoded(Counter(s for row in seqs for s in row))
        interrupts.raise_if_pending()   # a Ctrl-C a log callback caught (embedding programs' handlers)
        if rc != 0:
            raise llama_failure(f"llama_decode failed (code {rc})")

    def logits(self, i: int) -> np.ndarray:
        """Logits of output row ``i`` of the last batch (-1: the last), a view valid until the next decode."""
        if self._sent_at is not None:   # the batch went in re-ordered (streams)
            i = self._sent_at[i]
        # rows live in one output buffer that llama.cpp reuses: cache a view per address
        address = _logits_address(self._ctx, i)
        view = self._views.get(address)
        if view is None:
            if not address:
                raise llama_failure("llama.cpp returned no logits")
            if len(self._views) > 256:
                self._views.clear()
            ptr = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = self._views[address] = np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))
        return view

    def argmax(self, i: int) -> int:
        """The argmax of output row ``i``'s logits (-1: the last; the first of equal maxima, as
        numpy's): one C call where :mod:`.hostloop` was built, rather than a logits call and a numpy
        argmax, each run cold after the decode."""
        if hostloop.argmax_ith is None:
            return int(self.logits(i).argmax())
        if self._sent_at is not None:
            i = self._sent_at[i]
        try:
            return hostloop.argmax_ith(self.address, i, self.model.n_vocab)
        except RuntimeError as e:
            raise llama_failure(str(e)) from None

    def argmax_rows(self, first: int, n: int, drafts: Sequence[int] | None = None, *,
                    trim: tuple[int, int, bool] | None = None) -> list[int]:
        """:meth:`argmax` of output rows ``first .. first + n - 1`` (a verify's rows), in one C call;
        with ``drafts``, only until the first row whose argmax is not its draft (``drafts[r]`` for
        row ``first + r``): a greedy verify's tokens, the last one the correction. ``trim`` (with
        ``drafts``): (seq, p0, always) drops that verify's rejected cells of ``seq`` too (positions
        from ``p0`` + the drafts accepted; ``always``: also where none was rejected, filler rows
        followed them), in the same C call where the memory is a plain KV cache."""
        if hostloop.argmax_rows is None:
            out = []
            for r, i in enumerate(range(first, first + n)):
                out.append(int(self.logits(i).argmax()))
                if drafts is not None and (r >= len(drafts) or out[-1] != drafts[r]):
                    break
        else:
            at = self._sent_at
            rows = tuple(range(first, first + n)) if at is None else tuple(at[i] for i in range(first, first + n))
            in_c = (self.trim_address, *trim) if trim is not None and self.trim_address is not None else None
            try:
                if drafts is None:
                    return hostloop.argmax_rows(self.address, rows, self.model.n_vocab)
                out = hostloop.argmax_rows(self.address, rows, self.model.n_vocab, tuple(drafts), in_c)
            except RuntimeError as e:
                raise llama_failure(str(e)) from None
            if in_c is not None:
                return out
        if trim is not None:   # no C call trimmed: llama.cpp's own (a recurrent state's rules, see seq_rm)
            seq, p0, always = trim
            if len(out) <= len(drafts) or always:
                self.seq_rm(p0 + len(out) - 1, seq=seq)
        return out

    def logits_block(self, n_rows: int) -> np.ndarray | None:
        """The logits of the last batch's first ``n_rows`` output rows as one ``(n_rows, n_vocab)``
        view (one C call for all: llama.h keeps them contiguous in batch order), valid until the next
        decode; None where the batch went in re-ordered (streams: read :meth:`logits` row by row)."""
        if self._sent_at is not None:
            return None
        address = _all_logits_address(self._ctx)
        if not address:
            raise llama_failure("llama.cpp returned no logits")
        key = (address, n_rows)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 256:
                self._views.clear()
            ptr = ctypes.cast(address, ctypes.POINTER(ctypes.c_float))
            view = self._views[key] = np.ctypeslib.as_array(ptr, shape=(n_rows, self.model.n_vocab))
        return view

    def token_rows(self, n_rows: int, rows: list[int] | None) -> tuple[int, list[int] | None]:
        """Where rows ``rows`` (None: the first ``n_rows``) of the last batch are in the per-token
        outputs (target layer inputs, MTP hidden states): themselves, unless the batch went in
        re-ordered (:mod:`.stream_rows`; ``token_order`` maps them then)."""
        at = self.token_order
        if at is None:
            return n_rows, rows
        return n_rows, [at[r] for r in (range(n_rows) if rows is None else rows)]

    @property
    def rollback(self) -> int | None:
        """None: a KV cache, trimmed anywhere. A recurrent state: the most rows one verify may
        reject (``n_rs_seq``; 0: none, the state cannot be rolled back at all)."""
        return None if self._recurrent is None else self.n_rs_seq

    def _decoded(self, rows: dict[int, int]) -> None:
        """A recurrent state: each sequence's rows in the batch just decoded (its snapshots)."""
        self._recurrent.update(rows)
        self._rolled_back.difference_update(rows)

    def can_seq_rm(self, p0: int, seq: int = 0) -> bool:
        """Whether :meth:`seq_rm` ``(p0, -1, seq)`` leaves the sequence as if it had never held the
        rows from ``p0`` on. A KV cache: always. A recurrent state (one per sequence, no history):
        when nothing or everything goes, or a rollback of at most ``n_rs_seq`` rows, all of them
        rows of the sequence's last decode, with no rollback before it still pending: llama.cpp
        keeps a snapshot of the state after each of the last ``1 + n_rs_seq`` rows of a decode
        (``src/models/delta-net-base.cpp``: only the last min(rows, 1 + n_rs_seq) are written, the
        others are stale) and rolls back once between decodes (``llama-memory-recurrent.cpp``)."""
        if self._recurrent is None or p0 <= 0:
            return True
        back = self.pos_max(seq) + 1 - p0
        return back <= 0 or (seq not in self._rolled_back
                             and back <= min(self.n_rs_seq, self._recurrent.get(seq, 0) - 1))

    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> None:
        """Drop sequence ``seq``'s rows at positions [p0, p1) (-1: to the end; p0 <= 0 and p1 -1:
        all). A recurrent state: ask :meth:`can_seq_rm` first (llama.cpp refuses more than
        ``n_rs_seq`` rows, but cannot tell a stale snapshot from a valid one)."""
        partial = self._recurrent is not None and p0 > 0 and self.pos_max(seq) >= p0
        if not self._seq_rm(seq, p0, p1):
            raise LocalspecError("internal: could not trim the KV cache"
                                 + (f" (a recurrent state rolls back {self.n_rs_seq} rows at most)"
                                    if self._recurrent is not None else ""))
        if partial:
            self._rolled_back.add(seq)   # the next decode of the sequence starts from the snapshot
        elif self._recurrent is not None and p0 <= 0 and p1 < 0:
            self._rolled_back.discard(seq)
            self._recurrent.pop(seq, None)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Add sequence ``dst`` to the cells of ``src`` in positions [p0, p1) (a unified cache
        shares the cells: no data moves)."""
        llama_cpp.llama_memory_seq_cp(self.memory, src, dst, p0, p1)

    def seq_state(self, seq: int):
        """Sequence ``seq``'s KV cells as llama.cpp serialises them (a ctypes byte array), for
        :meth:`set_seq_state`; None where llama.cpp gives nothing, or where a recurrent state was
        rolled back and not decoded past (llama.cpp would write the state before the rollback)."""
        if seq in self._rolled_back:
            return None
        size = int(llama_cpp.llama_state_seq_get_size(self._ctx, seq))
        if size <= 0:
            return None
        buf = (ctypes.c_uint8 * size)()
        n = int(llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, seq))
        return buf if n == size else None

    def set_seq_state(self, seq: int, state) -> bool:
        """Load :meth:`seq_state` into sequence ``seq`` (emptied first); False where llama.cpp
        could not (no free cells): the sequence is then empty."""
        self.seq_rm(0, seq=seq)
        if llama_cpp.llama_state_seq_set_data(self._ctx, state, len(state), seq) > 0:
            return True
        self.seq_rm(0, seq=seq)
        return False

    def pos_max(self, seq: int = 0) -> int:
        return self._pos_max(seq)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, True)
        if self._recurrent is not None:
            self._recurrent.clear()
            self._rolled_back.clear()

    def close(self) -> None:
        ctx, self._ctx = getattr(self, "_ctx", None), None          # see Model.close
        batch, self._batch = getattr(self, "_batch", None), None
        self._run = self._run_tokens = self._run_rows = self._seq_rm = self._pos_max = _closed
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        if ctx:
            llama_cpp.llama_free(ctx)

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass
