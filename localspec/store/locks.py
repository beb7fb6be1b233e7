"""One lock per model name, so that creating, pulling and removing a model and the orphan sweep of
``list`` never see one another half done (a drafter converted for a ``create`` that has not yet
written its record is not an orphan).

``fcntl.flock`` on ``LOCALSPEC_HOME/locks/NAME.lock``: the kernel releases it when its process ends,
however it ends, so a killed ``create`` leaves no stale lock. Lock files stay (removing one would
let two processes lock two different files of the same name).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..core.errors import LocalspecError
from ..core.names import check_model_name
from ..core.paths import user_dir, writable_dir


class NameBusy(LocalspecError):
    """Another localspec process holds the lock of this name."""


def _lock_path(name: str) -> Path:
    check_model_name(name)   # the one name rule: no path, no newline in a lock's file name
    return writable_dir(user_dir() / "locks") / f"{name}.lock"


@contextmanager
def name_lock(name: str, *, what: str, wait: bool) -> Iterator[None]:
    """Hold the lock of model ``name`` (a checked name); ``wait``: until it is free, else raise
    NameBusy at once, saying that another process is busy with it (``what`` we wanted to do)."""
    path = _lock_path(name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LocalspecError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise NameBusy(f"cannot {what} model '{name}': another localspec is creating or removing it "
                           "right now; try again when it has finished") from None
        yield
    finally:
        os.close(fd)   # releases the lock


def is_busy(name: str) -> bool:
    """Whether another process holds the lock of ``name`` now (a create under way)."""
    path = user_dir() / "locks" / f"{name}.lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False   # never locked
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
