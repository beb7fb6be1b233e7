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

import numpy as np

from ..core.errors import LocalspecError
from .process import init_backend, take_recent_errors

from .ggml_base import (ARRAY, BOOL, F32, F64, I8, I16, I32, I64, SCALAR_GETTERS, STRING, U8, U16, U32, U64,
                        InitParams, lib as ggml_base)
_NUMPY = {U8: np.uint8, I8: np.int8, U16: np.uint16, I16: np.int16, U32: np.uint32, I32: np.int32,
          F32: np.float32, BOOL: np.int8, U64: np.uint64, I64: np.int64, F64: np.float64}
# ggml tensor types whose data numpy reads directly
TENSOR_NUMPY = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}


def _c_str(ptr: int | None) -> str:
    return ctypes.string_at(ptr).decode("utf-8", "replace") if ptr else ""


class GGUFHeader:
    """Metadata and tensor table of one GGUF file (no tensor data is loaded)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        lib = ggml_base()
        init_backend()   # ggml's parser logs through llama.cpp's logger: quiet unless --verbose
        take_recent_errors()
        ctx = lib.gguf_init_from_file(str(self.path).encode(), InitParams(True, None))
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
        if kind in SCALAR_GETTERS:
            value = getattr(lib, SCALAR_GETTERS[kind][0])(ctx, i)
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
        name = ggml_base().ggml_type_name(ggml_type)
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
