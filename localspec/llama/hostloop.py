"""The host steps around a llama.cpp compute (the decode's and the KV cache's calls, a row's
argmax, a drafter's greedy chains, every token's text), in C where ``_hostloop`` was built at
install, else in numpy and ctypes: the same tokens either way.

After a decode has streamed the model's weights through the caches, each Python-level call runs
cold: on a 2-core EPYC a ctypes call takes ~20-45 µs and numpy's argmax ~45 µs there, against ~10
µs for both in one C call (docs/speculation.md, "The host loop in C" and its second round)."""

from __future__ import annotations

import ctypes
import functools
from typing import Callable, Sequence

import llama_cpp

from ..core import options

ENV = "LOCALSPEC_HOSTLOOP"   # "numpy": the numpy steps though the C ones were built (A/B benches)

try:
    from . import _hostloop as _c
except ImportError:   # not built (no compiler or Python headers at install): numpy does it
    _c = None

if options.env_choice(ENV, ("c", "numpy"), "c") == "numpy":
    _c = None

# what _hostloop.c calls, in the order its bind() takes them
BOUND = ("llama_decode", "llama_encode", "llama_get_logits_ith", "llama_token_to_piece", "llama_memory_seq_rm",
         "llama_memory_seq_pos_max")

if _c is not None:
    _lib = llama_cpp.llama_cpp._lib
    _c.bind(*(ctypes.cast(getattr(_lib, name), ctypes.c_void_p).value for name in BOUND))

COMPILED = _c is not None


def address(ptr) -> int:
    """A ctypes pointer (a llama_context_p, a function) as the int address C is handed."""
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0


def _numpy_argmax(row) -> int:
    return int(row.argmax())


ALL_OUTPUT_ROWS = _c.ALL_OUTPUT_ROWS if _c is not None else None   # rows a C catch-up decodes whole (drafter.ALL_OUTPUT_ROWS)
argmax = _c.argmax if _c is not None else _numpy_argmax           # (a float32 row) -> its argmax
argmax_ith = _c.argmax_ith if _c is not None else None            # (ctx address, row, n_vocab) -> token
top1 = _c.top1 if _c is not None else None                        # (a float32 row) -> (argmax, its probability)
argmax_rows = _c.argmax_rows if _c is not None else None          # (ctx address, rows tuple, n_vocab) -> tokens
normed_state = _c.normed_state if _c is not None else None        # (out row, h row, norm address, eps)
greedy_chain = _c.greedy_chain if _c is not None else None        # see _hostloop.c
greedy_rounds = _c.greedy_rounds if _c is not None else None      # see _hostloop.c
gather_rows = _c.gather_rows if _c is not None else None          # see _hostloop.c
catch_up = _c.catch_up if _c is not None else None                # see _hostloop.c
catch_up_chain = _c.catch_up_chain if _c is not None else None    # see _hostloop.c
catch_up_rounds = _c.catch_up_rounds if _c is not None else None  # see _hostloop.c


def batch_runner(ctx_ptr, batch, *, encode: bool = False) -> Callable[[int], int]:
    """A call that runs ``llama_decode`` (``llama_encode``) of the first n rows of ``batch`` (a
    ctypes llama_batch the caller keeps alive) in the context ``ctx_ptr``: ``run(n) -> code``. One
    C call where built (no ctypes copy of the batch struct); else ctypes', looked up at each call."""
    if _c is not None:
        return functools.partial(_c.encode if encode else _c.decode, address(ctx_ptr), ctypes.addressof(batch))

    def run(n: int) -> int:
        batch.n_tokens = n
        return (llama_cpp.llama_encode if encode else llama_cpp.llama_decode)(ctx_ptr, batch)
    return run


def pieces(vocab, n_vocab: int, special: bool) -> list[bytes]:
    """Every token's bytes by id (llama_token_to_piece; ``special``: control tokens as their text)."""
    if _c is not None:
        return _c.pieces(address(vocab), n_vocab, special)
    buf, out = ctypes.create_string_buffer(256), []
    for token in range(n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, 256, 0, special)
        out.append(buf.raw[:n] if n >= 0 else _long_piece(vocab, token, -n, special))
    return out


def _long_piece(vocab, token: int, n: int, special: bool) -> bytes:
    buf = ctypes.create_string_buffer(n)
    got = llama_cpp.llama_token_to_piece(vocab, token, buf, n, 0, special)
    return buf.raw[: max(got, 0)]


def token_runner(ctx_ptr, batch) -> Callable[[Sequence[int], int, bool], int] | None:
    """``run(tokens, start, all_logits) -> code``: rows ``tokens`` at positions ``start..`` of the
    batch's sequence (logits for every row or the last), then ``llama_decode``, in one C call;
    None where C was not built (the caller fills the rows through numpy and :func:`batch_runner`)."""
    if _c is None:
        return None
    return functools.partial(_c.decode_tokens, address(ctx_ptr), ctypes.addressof(batch))


def rows_runner(ctx_ptr, batch) -> Callable[[Sequence[int], Sequence[int], Sequence[int], Sequence[bool]], int] | None:
    """``run(tokens, positions, seqs, outputs) -> code``: rows of several sequences (each row's
    token, position, sequence and whether it has logits; at most the batch's rows), then
    ``llama_decode``, in one C call, every row's sequence 0 again after it; None where C was not
    built (the caller fills the rows through numpy and ctypes)."""
    if _c is None:
        return None
    return functools.partial(_c.decode_rows, address(ctx_ptr), ctypes.addressof(batch))


def memory_calls(memory) -> tuple[Callable[[int, int, int], bool], Callable[[int], int]]:
    """A context's ``(seq_rm(seq, p0, p1) -> done, seq_pos_max(seq) -> pos)`` of its memory
    (``llama_get_memory``): one C call each where built, else ctypes' (looked up at each call)."""
    if _c is not None:
        at = address(memory)
        return functools.partial(_c.seq_rm, at), functools.partial(_c.seq_pos_max, at)
    return (lambda seq, p0, p1: llama_cpp.llama_memory_seq_rm(memory, seq, p0, p1),
            lambda seq: llama_cpp.llama_memory_seq_pos_max(memory, seq))


def decode_clock() -> tuple[float, float, int]:
    """(seconds, this thread's CPU seconds, calls) inside the llama_decode / llama_encode calls C
    made itself (the target's decodes, the drafter's, its chains'): what a bench that times llama.cpp's compute adds to its own
    count. The CPU seconds count only after :func:`count_decode_cpu`."""
    return _c.clock() if _c is not None else (0.0, 0.0, 0)


def count_decode_cpu() -> None:
    """From now on :func:`decode_clock` adds the decodes' thread CPU time too (for benches: a
    thread clock costs a system call a decode, which generation does not pay otherwise)."""
    if _c is not None:
        _c.count_cpu(True)
