"""The ggml-base library shipped with llama-cpp-python, with the signatures of its ``gguf_*`` functions.

One handle per process (:func:`lib`); :mod:`localspec.llama.gguf_native` reads GGUF headers
through it and :mod:`localspec.llama.process` routes its log.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

# enum gguf_type
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_GETTERS = {
    U8: ("gguf_get_val_u8", ctypes.c_uint8), I8: ("gguf_get_val_i8", ctypes.c_int8),
    U16: ("gguf_get_val_u16", ctypes.c_uint16), I16: ("gguf_get_val_i16", ctypes.c_int16),
    U32: ("gguf_get_val_u32", ctypes.c_uint32), I32: ("gguf_get_val_i32", ctypes.c_int32),
    F32: ("gguf_get_val_f32", ctypes.c_float), BOOL: ("gguf_get_val_bool", ctypes.c_bool),
    U64: ("gguf_get_val_u64", ctypes.c_uint64), I64: ("gguf_get_val_i64", ctypes.c_int64),
    F64: ("gguf_get_val_f64", ctypes.c_double),
}


class InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def lib() -> ctypes.CDLL:
    cached = getattr(lib, "cached", None)
    if cached is not None:
        return cached
    base = Path(llama_cpp.__file__).parent / "lib"
    candidates = sorted(base.glob("libggml-base.*")) or sorted(base.glob("ggml-base.*"))
    try:
        handle = ctypes.CDLL(str(candidates[0])) if candidates else llama_cpp.llama_cpp._lib
        handle.gguf_init_from_file
    except (OSError, AttributeError):
        handle = llama_cpp.llama_cpp._lib
    vp, i64, cp = ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p
    sigs = {
        "gguf_init_from_file": ([cp, InitParams], vp),
        "gguf_free": ([vp], None),
        "gguf_get_n_kv": ([vp], i64),
        "gguf_get_key": ([vp, i64], cp),
        "gguf_get_kv_type": ([vp, i64], ctypes.c_int),
        "gguf_get_arr_type": ([vp, i64], ctypes.c_int),
        "gguf_get_arr_n": ([vp, i64], ctypes.c_size_t),
        "gguf_get_arr_data": ([vp, i64], vp),
        "gguf_get_arr_str": ([vp, i64, ctypes.c_size_t], ctypes.c_void_p),
        "gguf_get_val_str": ([vp, i64], ctypes.c_void_p),
        "gguf_get_n_tensors": ([vp], i64),
        "gguf_get_tensor_name": ([vp, i64], cp),
        "gguf_get_tensor_ne": ([vp, i64], ctypes.POINTER(ctypes.c_int64)),
        "gguf_get_tensor_type": ([vp, i64], ctypes.c_int),
        "gguf_get_tensor_size": ([vp, i64], ctypes.c_size_t),
        "gguf_get_tensor_offset": ([vp, i64], ctypes.c_size_t),
        "gguf_get_data_offset": ([vp], ctypes.c_size_t),
        "ggml_type_name": ([ctypes.c_int], cp),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(handle, name)
        fn.argtypes = args
        fn.restype = res
    for name, (getter, ctype) in SCALAR_GETTERS.items():
        fn = getattr(handle, getter)
        fn.argtypes = [vp, i64]
        fn.restype = ctype
    lib.cached = handle
    return handle
