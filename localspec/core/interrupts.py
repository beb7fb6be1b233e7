"""Ctrl-C that always stops the program, even while llama.cpp is calling back into Python.

Python runs a signal handler at the next bytecode it executes. While a native llama.cpp call runs
(a model load, a quantization), that next bytecode is often inside one of our ctypes callbacks (the
log callback, the load progress callback), and an exception raised there cannot cross the C frames:
ctypes reports it as "ignored" and llama.cpp carries on, so the Ctrl-C is lost.

:func:`install` puts a SIGINT handler in place that knows this. Inside a function wrapped with
:func:`callback` it only records the interrupt (:func:`pending` becomes true, so the load progress
callback asks llama.cpp to stop), and a watcher thread signals the main thread again every few
milliseconds until the handler runs outside every callback, where it raises ``KeyboardInterrupt``
as usual. (Raising the signal again from inside the handler would make the handler recurse.)
Callbacks swallow any exception of their own: nothing above a C frame could handle it.
"""

from __future__ import annotations

import _thread
import functools
import signal
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable

RETRIGGER_S = 0.02

_callback_codes: set[CodeType] = set()
_pending = threading.Event()
_installed = False
_watcher: threading.Thread | None = None
_closing = False   # set once report() has run: later Ctrl-Cs are ignored
_lock = threading.Lock()
_deferred_raised_at = float("-inf")


def callback(on_error: Any = None) -> Callable[[Callable], Callable]:
    """Decorator for a Python function that native code calls: its exceptions stay inside (it
    returns ``on_error`` then), and a Ctrl-C that lands in it is deferred until native code returns."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def guarded(*args):
            try:
                return fn(*args)
            except KeyboardInterrupt:
                _pending.set()   # raised by a handler that is not ours: remembered for raise_if_pending
            except BaseException:   # noqa: BLE001
                pass
            return on_error

        _callback_codes.update((guarded.__code__, fn.__code__))
        return guarded

    return wrap


def pending() -> bool:
    """A Ctrl-C arrived and has not been raised yet."""
    return _pending.is_set()


def _in_callback(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _callback_codes:
            return True
        frame = frame.f_back
    return False


def _retrigger() -> None:
    global _watcher
    while _pending.is_set():
        time.sleep(RETRIGGER_S)
        with _lock:
            if _pending.is_set():
                _thread.interrupt_main(signal.SIGINT)
    _watcher = None


def _handler(signum: int, frame: FrameType | None) -> None:
    global _watcher, _deferred_raised_at
    if _closing:   # "Interrupted." is printed and the process is on its way out
        return
    if _in_callback(frame):
        _pending.set()
        if _watcher is None:
            _watcher = threading.Thread(target=_retrigger, name="localspec-interrupt", daemon=True)
            _watcher.start()
        return
    with _lock:
        deferred = _pending.is_set()
        _pending.clear()
    now = time.monotonic()
    if not deferred and now - _deferred_raised_at < RETRIGGER_S * 5:
        return   # a re-trigger that crossed the deferred raise: the interrupt is already on its way
    if deferred:
        _deferred_raised_at = now
    raise KeyboardInterrupt


def install() -> None:
    """Use the deferring SIGINT handler (main thread only; a no-op elsewhere or when the program
    has put a SIGINT handler of its own in place)."""
    global _installed, _closing
    _closing = False
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    signal.signal(signal.SIGINT, _handler)
    _installed = True


def raise_if_pending() -> None:
    """Raise a Ctrl-C that a callback recorded (under a SIGINT handler that is not ours, which the
    callback saw as a KeyboardInterrupt): call after native calls that run callbacks."""
    global _deferred_raised_at
    if not _pending.is_set():   # after every decode: no lock on the common path
        return
    with _lock:
        if not _pending.is_set():
            return
        _pending.clear()
        _deferred_raised_at = time.monotonic()
    raise KeyboardInterrupt


def is_interrupt(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was caused by, a KeyboardInterrupt (typer turns one into Exit(130))."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def report() -> int:
    """Print the one line a Ctrl-C ends with; return the exit status (130, as shells use).

    Further Ctrl-Cs (a second key press, or the watcher's re-trigger crossing this exit) are ignored
    from here on, so none raises again while the process exits."""
    global _closing
    with _lock:
        _pending.clear()
        _closing = True
    try:
        print("Interrupted.", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    return 130
