"""Read GGUF headers with ggml's own parser (``gguf_*`` in libggml-base, shipped with llama-cpp-python).

Why not ``gguf.GGUFReader``: it builds two numpy objects per vocabulary string, which takes about
2 s for a 49k-token tokenizer; ggml's C parser takes milliseconds, and it is the parser llama.cpp
itself loads models with, so what we check is what llama.cpp will see. Writing stays with the
``gguf`` package. ggml's getters abort on a wrong type, so every read checks the type first.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError

# enum gguf_type
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_SCALAR = {
    U8: ("gguf_get_val_u8", ctypes.c_uint8), I8: ("gguf_get_val_i8", ctypes.c_int8),
    U16: ("gguf_get_val_u16", ctypes.c_uint16), I16: ("gguf_get_val_i16", ctypes.c_int16),
    U32: ("gguf_get_val_u32", ctypes.c_uint32), I32: ("gguf_get_val_i32", ctypes.c_int32),
    F32: ("gguf_get_val_f32", ctypes.c_float), BOOL: ("gguf_get_val_bool", ctypes.c_bool),
    U64: ("gguf_get_val_u64", ctypes.c_uint64), I64: ("gguf_get_val_i64", ctypes.c_int64),
    F64: ("gguf_get_val_f64", ctypes.c_double),
}
_NUMPY = {U8: np.uint8, I8: np.int8, U16: np.uint16, I16: np.int16, U32: np.uint32, I32: np.int32,
          F32: np.float32, BOOL: np.int8, U64: np.uint64, I64: np.int64, F64: np.float64}
# ggml tensor types whose data numpy reads directly
TENSOR_NUMPY = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def _lib() -> ctypes.CDLL:
    lib = getattr(_lib, "cached", None)
    if lib is not None:
        return lib
    base = Path(llama_cpp.__file__).parent / "lib"
    candidates = sorted(base.glob("libggml-base.*")) or sorted(base.glob("ggml-base.*"))
    try:
        lib = ctypes.CDLL(str(candidates[0])) if candidates else llama_cpp.llama_cpp._lib
        lib.gguf_init_from_file
    except (OSError, AttributeError):
        lib = llama_cpp.llama_cpp._lib
    vp, i64, cp = ctypes.c_void_p, ctypes.c_int64, ctypes.c_char_p
    sigs = {
        "gguf_init_from_file": ([cp, _InitParams], vp),
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
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    for name, (getter, ctype) in _SCALAR.items():
        fn = getattr(lib, getter)
        fn.argtypes = [vp, i64]
        fn.restype = ctype
    _lib.cached = lib
    return lib


def _c_str(ptr: int | None) -> str:
    return ctypes.string_at(ptr).decode("utf-8", "replace") if ptr else ""


class GGUFHeader:
    """Metadata and tensor table of one GGUF file (no tensor data is loaded)."""

    def __init__(self, path: str | Path) -> None:
        from .llama_model import _init_backend, take_recent_errors

        self.path = Path(path)
        lib = _lib()
        _init_backend()   # ggml's parser logs through llama.cpp's logger: quiet unless --verbose
        take_recent_errors()
        ctx = lib.gguf_init_from_file(str(self.path).encode(), _InitParams(True, None))
        if not ctx:
            why = take_recent_errors()
            why = f": {why[0]}" if why else ""
            raise LocalspecError(f"{self.path}: not a valid GGUF file (ggml could not parse its header{why})")
        try:
            self.kv: dict[str, Any] = {}
            self.string_arrays: dict[str, list[str]] = {}
            self.types: dict[str, tuple[int, int | None]] = {}  # key -> (gguf_type, array item type)
            for i in range(lib.gguf_get_n_kv(ctx)):
                key = lib.gguf_get_key(ctx, i).decode("utf-8", "replace")
                self.kv[key] = self._value(lib, ctx, i, key)
            self.data_offset = int(lib.gguf_get_data_offset(ctx))
            self.tensors: dict[str, tuple[tuple[int, ...], int, int, int]] = {}
            for i in range(lib.gguf_get_n_tensors(ctx)):
                name = lib.gguf_get_tensor_name(ctx, i).decode("utf-8", "replace")
                ne = lib.gguf_get_tensor_ne(ctx, i)
                dims = [int(ne[d]) for d in range(4)]
                while len(dims) > 1 and dims[-1] == 1:
                    dims.pop()
                self.tensors[name] = (
                    tuple(dims),
                    int(lib.gguf_get_tensor_type(ctx, i)),
                    int(lib.gguf_get_tensor_size(ctx, i)),
                    self.data_offset + int(lib.gguf_get_tensor_offset(ctx, i)),
                )
        finally:
            lib.gguf_free(ctx)

    def _value(self, lib: Any, ctx: int, i: int, key: str) -> Any:
        kind = lib.gguf_get_kv_type(ctx, i)
        self.types[key] = (kind, lib.gguf_get_arr_type(ctx, i) if kind == ARRAY else None)
        if kind == STRING:
            return _c_str(lib.gguf_get_val_str(ctx, i))
        if kind in _SCALAR:
            value = getattr(lib, _SCALAR[kind][0])(ctx, i)
            return bool(value) if kind == BOOL else value
        if kind == ARRAY:
            sub = lib.gguf_get_arr_type(ctx, i)
            n = int(lib.gguf_get_arr_n(ctx, i))
            if sub == STRING:
                strings = [_c_str(lib.gguf_get_arr_str(ctx, i, j)) for j in range(n)]
                self.string_arrays[key] = strings
                return strings
            if sub in _NUMPY:
                ptr = lib.gguf_get_arr_data(ctx, i)
                if not n or not ptr:
                    return np.zeros(0, dtype=_NUMPY[sub])
                dtype = np.dtype(_NUMPY[sub])
                buf = ctypes.string_at(ptr, n * dtype.itemsize)
                return np.frombuffer(buf, dtype=dtype).copy()
        return None

    @staticmethod
    def type_name(ggml_type: int) -> str:
        name = _lib().ggml_type_name(ggml_type)
        return name.decode().upper() if name else str(ggml_type)

    def tensor_data(self, name: str) -> np.ndarray:
        """Data of a tensor stored as F32/F16/integers (norm weights, d2t), shaped numpy-style."""
        if name not in self.tensors:
            raise LocalspecError(f"{self.path}: tensor {name} not found")
        shape, kind, size, offset = self.tensors[name]
        dtype = TENSOR_NUMPY.get(kind)
        if dtype is None:
            raise LocalspecError(f"{self.path}: tensor {name} is quantized ({self.type_name(kind)}); expected a plain type")
        count = size // np.dtype(dtype).itemsize
        data = np.fromfile(self.path, dtype=dtype, count=count, offset=offset)
        if data.size != count:
            raise LocalspecError(f"{self.path}: file is truncated (tensor {name})")
        return data.reshape(tuple(reversed(shape)))
