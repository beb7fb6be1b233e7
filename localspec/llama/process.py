"""llama.cpp's process-wide state: backend initialisation and its log.

llama.cpp's and ggml's log lines go through one callback: silent unless :func:`set_verbose` is on,
collected by :func:`capture_log` blocks, and their last error lines kept so that our error
messages can say what llama.cpp said (:func:`llama_failure`).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import sys

import llama_cpp

from ..core import interrupts
from ..core.errors import LocalspecError
from . import ggml_base, weights_memory

_verbose = False
_recent_errors: collections.deque[str] = collections.deque(maxlen=4)
_backend_ready = False
_log_sinks: list[list[str]] = []  # capture_log(): every llama.cpp log fragment goes to each open sink


@llama_cpp.llama_log_callback
@interrupts.callback()
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", "replace")
    for sink in _log_sinks:
        sink.append(message)
    if level in (3, 4):  # WARN and ERROR in the vendored ggml.h (llama-cpp-python calls 3 ERROR)
        if message.strip():
            _recent_errors.append(message.strip())
    if _verbose:
        sys.stderr.write(message)


@llama_cpp.llama_progress_callback
@interrupts.callback(on_error=True)
def load_progress(progress: float, user_data: ctypes.c_void_p) -> bool:
    """Model loading goes on unless a Ctrl-C is waiting (False makes llama.cpp stop the load); the
    weight buffers exist by its first call (huge-page advice: :mod:`localspec.llama.weights_memory`)."""
    weights_memory.on_progress()
    return not interrupts.pending()


def set_verbose(verbose: bool) -> None:
    global _verbose
    _verbose = verbose


def init_backend() -> None:
    """Initialise llama.cpp once per process and route its log through our (quiet) callback.

    The callback object is a module global: ctypes callbacks that get collected crash the process
    at the next log line.
    """
    global _backend_ready
    if _backend_ready:
        return
    llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
    _set_ggml_log()
    llama_cpp.llama_backend_init()
    _backend_ready = True


def _set_ggml_log() -> None:
    """ggml has a logger of its own (its GGUF parser and backends print through it): route it to
    the same callback, else a bad GGUF header prints ggml's lines before our Error line."""
    try:
        fn = ggml_base.lib().ggml_log_set
    except AttributeError:  # pragma: no cover - every ggml of llama-cpp-python 0.3.36 has it
        return
    fn.argtypes = [llama_cpp.llama_log_callback, ctypes.c_void_p]
    fn.restype = None
    fn(_log_callback, ctypes.c_void_p(0))


@contextlib.contextmanager
def capture_log():
    """Collect llama.cpp's log text (quiet or not) while the block runs: ``with capture_log() as lines``.
    The fit planner reads llama.cpp's own buffer-size lines from it."""
    sink: list[str] = []
    _log_sinks.append(sink)
    try:
        yield sink
    finally:
        _log_sinks.remove(sink)


def take_recent_errors() -> list[str]:
    """The error lines llama.cpp / ggml logged since the last call (oldest first), forgotten."""
    lines = [line.split(": ", 1)[-1] if line.startswith(("gguf_", "llama_")) else line for line in _recent_errors]
    _recent_errors.clear()
    return lines


def llama_failure(what: str) -> LocalspecError:
    detail = f": {_recent_errors[-1]}" if _recent_errors else ""
    _recent_errors.clear()
    return LocalspecError(f"{what}{detail}")
