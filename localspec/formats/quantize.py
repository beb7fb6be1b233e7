"""Re-quantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``), atomically."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from ..core import interrupts
from ..core.atomic import atomic_path
from ..core.errors import LocalspecError
from ..llama.process import init_backend
from ..llama.llama_model import default_threads

# llama_ftype values (llama.h)
FTYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7, "q4_k_m": 15, "iq4_nl": 25}


def requantize(src: str | Path, dst: str | Path, ftype: str) -> Path:
    if ftype not in FTYPES:
        raise LocalspecError(f"unknown weight type '{ftype}' (one of {', '.join(FTYPES)})")
    init_backend()
    dst = Path(dst)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True
    params.nthread = default_threads()
    with atomic_path(dst) as tmp:
        rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        interrupts.raise_if_pending()
        if rc != 0:
            raise LocalspecError(f"llama.cpp could not quantize {Path(src).name} to {ftype}")
    return dst
