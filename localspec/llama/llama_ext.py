"""Bindings for the llama.cpp functions that llama-cpp-python does not expose.

llama.cpp declares its EAGLE-3 plumbing (layer-input extraction, the drafter's pre-norm state, the
drafter's target layer ids, the MTP heads' state and head selection) in the C++ staging header ``src/llama-ext.h``, so ``libllama`` exports
them under Itanium-mangled names (Linux, macOS). This module binds exactly those, by both their C and
mangled names, and nothing else. A library without them (another llama-cpp-python release) gives a
:class:`~localspec.core.errors.LocalspecError` naming what is missing, at first use.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from . import hostloop

_ctx_p = llama_cpp.llama_context_p_ctypes
_model_p = llama_cpp.llama_model_p_ctypes
_float_p = ctypes.POINTER(ctypes.c_float)
_int32_p = ctypes.POINTER(ctypes.c_int32)

# name -> (mangled name, argtypes, restype)
_SIGNATURES: dict[str, tuple[str, list[Any], Any]] = {
    "llama_set_embeddings_layer_inp": (
        "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
        [_ctx_p, ctypes.c_uint32, ctypes.c_bool],
        None,
    ),
    "llama_get_embeddings_layer_inp": (
        "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
        [_ctx_p, ctypes.c_uint32],
        _float_p,
    ),
    "llama_set_embeddings_nextn": (
        "_Z26llama_set_embeddings_nextnP13llama_contextbb",
        [_ctx_p, ctypes.c_bool, ctypes.c_bool],
        None,
    ),
    "llama_get_embeddings_nextn": (
        "_Z26llama_get_embeddings_nextnP13llama_context",
        [_ctx_p],
        _float_p,
    ),
    "llama_get_embeddings_nextn_ith": (
        "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
        [_ctx_p, ctypes.c_int32],
        _float_p,
    ),
    "llama_set_nextn_layer_offset": (   # which MTP head an MTP context's graph runs (0: the first)
        "_Z28llama_set_nextn_layer_offsetP13llama_contexti",
        [_ctx_p, ctypes.c_int32],
        None,
    ),
    "llama_model_target_layer_ids": (
        "_Z28llama_model_target_layer_idsPK11llama_model",
        [_model_p],
        _int32_p,
    ),
    "llama_model_target_layer_ids_n": (
        "_Z30llama_model_target_layer_ids_nPK11llama_model",
        [_model_p],
        ctypes.c_uint32,
    ),
}

_bound: dict[str, Any] = {}


def _function(name: str) -> Any:
    fn = _bound.get(name)
    if fn is not None:
        return fn
    mangled, argtypes, restype = _SIGNATURES[name]
    lib = llama_cpp.llama_cpp._lib
    for symbol in (name, mangled):
        fn = getattr(lib, symbol, None)
        if fn is not None:
            break
    else:
        raise LocalspecError(
            f"the installed llama.cpp lacks {name} (needed for EAGLE-3); "
            f"install llama-cpp-python==0.3.36 (found {llama_cpp.__version__})"
        )
    fn.argtypes = argtypes
    fn.restype = restype
    _bound[name] = fn
    return fn


def check_available() -> None:
    """Raise LocalspecError unless every binding resolves."""
    for name in _SIGNATURES:
        _function(name)


def set_embeddings_layer_inp(ctx: Any, layer: int, value: bool) -> None:
    _function("llama_set_embeddings_layer_inp")(ctx, layer, value)


def get_embeddings_layer_inp(ctx: Any, layer: int) -> Any:
    """Pointer to ``n_tokens x n_embd`` floats: the input of ``layer`` for every token of the last batch."""
    return _function("llama_get_embeddings_layer_inp")(ctx, layer)


def set_embeddings_nextn(ctx: Any, value: bool, masked: bool) -> None:
    _function("llama_set_embeddings_nextn")(ctx, value, masked)


def get_embeddings_nextn(ctx: Any) -> Any:
    return _function("llama_get_embeddings_nextn")(ctx)


def get_embeddings_nextn_ith(ctx: Any, i: int) -> Any:
    return _function("llama_get_embeddings_nextn_ith")(ctx, i)


def set_nextn_layer_offset(ctx: Any, offset: int) -> None:
    _function("llama_set_nextn_layer_offset")(ctx, offset)


def model_target_layer_ids(model: Any) -> tuple[int, ...]:
    n = _function("llama_model_target_layer_ids_n")(model)
    ptr = _function("llama_model_target_layer_ids")(model)
    return tuple(int(ptr[i]) for i in range(n)) if n and ptr else ()


# -- the hot path: addresses as ints, numpy views cached per address ------------------------------
# A pointer result costs a ctypes object per call, and np.ctypeslib.as_array a new ctypes array type
# (tens of µs): per drafted token that was a large part of a cycle's host time. These return the
# address as an int, and float_view keeps one view per (address, shape) (llama.cpp reuses its
# output buffers, so the same few addresses come back every cycle).
_address_fns: dict[str, Any] = {}


def _address_fn(name: str) -> Any:
    fn = _address_fns.get(name)
    if fn is None:
        typed = _function(name)   # resolves the symbol (plain or mangled) and checks it exists
        fn = ctypes.CFUNCTYPE(ctypes.c_void_p, *typed.argtypes)(ctypes.cast(typed, ctypes.c_void_p).value)
        _address_fns[name] = fn
    return fn


def layer_inp_address(ctx: Any, layer: int) -> int:
    """:func:`get_embeddings_layer_inp` as an int address (0: none)."""
    return _address_fn("llama_get_embeddings_layer_inp")(ctx, layer) or 0


def nextn_address(ctx: Any) -> int:
    """:func:`get_embeddings_nextn` as an int address (0: none)."""
    return _address_fn("llama_get_embeddings_nextn")(ctx) or 0


def nextn_ith_address(ctx: Any, i: int) -> int:
    """:func:`get_embeddings_nextn_ith` as an int address (0: none)."""
    return _address_fn("llama_get_embeddings_nextn_ith")(ctx, i) or 0


def nextn_getter() -> Any:
    """The C function behind :func:`nextn_address`, ``(ctx) -> address or None``."""
    return _address_fn("llama_get_embeddings_nextn")


def nextn_ith_getter() -> Any:
    """The C function behind :func:`nextn_ith_address`, ``(ctx, i) -> address or None``, bound
    once by a caller that reads a state every drafter step."""
    return _address_fn("llama_get_embeddings_nextn_ith")


def float_view(address: int, shape: tuple[int, ...], cache: dict) -> Any:
    """A float32 numpy view of ``shape`` at ``address``, kept in ``cache`` (valid while llama.cpp
    keeps that buffer: read it before the next decode)."""
    key = (address, shape)
    view = cache.get(key)
    if view is None:
        if len(cache) > 256:
            cache.clear()
        view = cache[key] = np.ctypeslib.as_array(ctypes.cast(address, ctypes.POINTER(ctypes.c_float)), shape=shape)
    return view


def layer_inputs(ctx: Any, layers: tuple[int, ...], width: int, n_rows: int, rows: list[int] | None, cache: dict,
                 eps: float | None = None) -> np.ndarray:
    """The inputs of target ``layers`` (each ``width`` wide) for the first ``n_rows`` rows of the
    context's last batch (or its batch rows ``rows``, in that order), side by side per row: what
    an EAGLE or block drafter reads after each target decode. ``eps``: each block divided by its
    RMS (EAGLE-3.1's fc_norm). ``ctx``: a :class:`~.llama_model.Context`."""
    if hostloop.gather_rows is not None:   # one C call, not three address calls and numpy copies
        out = np.empty((n_rows if rows is None else len(rows), len(layers) * width), dtype=np.float32)
        try:
            hostloop.gather_rows(out, layer_inputs_function(), ctx.address, layers, width, 0, n_rows, rows,
                                 -1.0 if eps is None else eps)
        except RuntimeError as e:
            raise LocalspecError(str(e)) from None
        return out
    lo = 0
    if rows and rows == list(range(rows[0], rows[0] + len(rows))):   # a chain's rows: a slice
        lo, n_rows, rows = rows[0], len(rows), None
    n_out = n_rows if rows is None else len(rows)
    out = np.empty((n_out, len(layers) * width), dtype=np.float32)
    n_batch = lo + n_rows if rows is None else max(rows) + 1
    ctx = ctx.ptr
    for k, lid in enumerate(layers):
        address = layer_inp_address(ctx, lid)
        if not address:
            raise LocalspecError(f"llama.cpp extracted no inputs of target layer {lid}")
        src = float_view(address, (n_batch, width), cache)
        block = out[:, k * width:(k + 1) * width]
        if rows is None:
            block[:] = src[lo:n_batch]
        else:
            src.take(rows, axis=0, out=block)
    if eps is not None:
        rms_normalize_rows(out.reshape(n_out * len(layers), width), eps)
    return out


@functools.cache
def layer_inputs_function() -> int:
    """The address of ``llama_get_embeddings_layer_inp`` (resolved once: it is read every cycle),
    as ``hostloop.gather_rows`` takes it."""
    return hostloop.address(_function("llama_get_embeddings_layer_inp"))


def rms_normalize_rows(x: np.ndarray, eps: float) -> None:
    """Each row of ``x`` (2-D, float32) divided by its RMS, in place: no temporaries the size of
    ``x`` (the hot path: three target features of every committed row)."""
    scale = np.einsum("ij,ij->i", x, x)
    scale *= 1.0 / x.shape[-1]
    scale += eps
    np.sqrt(scale, out=scale)
    np.reciprocal(scale, out=scale)
    x *= scale[:, None]
