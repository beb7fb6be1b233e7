"""Re-quantize a GGUF with llama.cpp's own quantizer (``llama_model_quantize``), atomically."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import llama_cpp

from ..core import interrupts
from ..core.atomic import atomic_path
from ..core.errors import LocalspecError
from ..core.units import format_size
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
            raise _failure(Path(src), tmp, ftype)
    return dst


def _failure(src: Path, tmp: Path, ftype: str) -> LocalspecError:
    """Why llama.cpp's quantizer failed, as far as we can tell: it reports no cause, and the usual
    one is a full disk (ENOSPC), seen while the partial output still holds its space: less room is
    left than the rest of an output no larger than its source."""
    try:
        st = os.statvfs(tmp.parent)
        free = st.f_bavail * st.f_frsize
        written = tmp.stat().st_size if tmp.exists() else 0
        need = src.stat().st_size
    except OSError:
        return LocalspecError(f"llama.cpp could not quantize {src.name} to {ftype}")
    if free < max(need - written, 1 << 20):
        return LocalspecError(f"cannot quantize {src.name} to {ftype}: the disk is full (no space left on device "
                              f"in {tmp.parent}; {format_size(free)} free, about {format_size(need)} needed)")
    return LocalspecError(f"llama.cpp could not quantize {src.name} to {ftype}")
