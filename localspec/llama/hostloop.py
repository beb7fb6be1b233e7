"""The host steps that run right after a llama.cpp compute (a row's argmax, a drafter's greedy
chain), in C where ``_hostloop`` was built at install, else in numpy: the same tokens either way.

After a decode has streamed the model's weights through the caches, each Python-level call runs
cold: on a 2-core EPYC a ctypes call takes ~60 µs and numpy's argmax ~45 µs there, against ~10
µs for both in one C call (docs/speculation.md, "The host loop in C")."""

from __future__ import annotations

import ctypes

import llama_cpp

from ..core import options

ENV = "LOCALSPEC_HOSTLOOP"   # "numpy": the numpy steps though the C ones were built (A/B benches)

try:
    from . import _hostloop as _c
except ImportError:   # not built (no compiler or Python headers at install): numpy does it
    _c = None

if options.env_choice(ENV, ("c", "numpy"), "c") == "numpy":
    _c = None

if _c is not None:
    _lib = llama_cpp.llama_cpp._lib
    _c.bind(ctypes.cast(_lib.llama_decode, ctypes.c_void_p).value, ctypes.cast(_lib.llama_encode, ctypes.c_void_p).value,
            ctypes.cast(_lib.llama_get_logits_ith, ctypes.c_void_p).value)

COMPILED = _c is not None


def address(ptr) -> int:
    """A ctypes pointer (a llama_context_p, a function) as the int address C is handed."""
    return ctypes.cast(ptr, ctypes.c_void_p).value or 0


def _numpy_argmax(row) -> int:
    return int(row.argmax())


argmax = _c.argmax if _c is not None else _numpy_argmax           # (a float32 row) -> its argmax
argmax_ith = _c.argmax_ith if _c is not None else None            # (ctx address, row, n_vocab) -> token
argmax_rows = _c.argmax_rows if _c is not None else None          # (ctx address, rows tuple, n_vocab) -> tokens
normed_state = _c.normed_state if _c is not None else None        # (out row, h row, norm address, eps)
greedy_chain = _c.greedy_chain if _c is not None else None        # see _hostloop.c
gather_rows = _c.gather_rows if _c is not None else None          # see _hostloop.c
catch_up = _c.catch_up if _c is not None else None                # see _hostloop.c
catch_up_chain = _c.catch_up_chain if _c is not None else None    # see _hostloop.c


def decode_clock() -> tuple[float, float, int]:
    """(seconds, this thread's CPU seconds, calls) inside the llama_decode calls C made itself
    (a greedy chain's, a catch-up's): what a bench that times llama.cpp's compute adds to its own count."""
    return _c.clock() if _c is not None else (0.0, 0.0, 0)
