"""Atomic file writes, and the cleanup of what a killed writer left behind.

Every file localspec writes goes through :func:`atomic_path` (a writer that needs a path: llama.cpp's
quantizer, the GGUF writer, torch, numpy) or :func:`atomic_write` (bytes or text), and every
directory it writes as a whole (``export``) through :func:`atomic_dir`: the data goes to
``.NAME.partial-PID`` beside the destination and is renamed over it only when complete, so a reader
sees the old file or the whole new one. An exception or Ctrl-C removes the partial file; a process
killed outright (SIGKILL, power loss) cannot, so the next writer to the same place removes partial
files whose process is gone (:func:`clean_stale`), and the user directory is swept at start.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path
from typing import Iterator

from .errors import LocalspecError

# .NAME.partial-PID[...]: ours. Older releases also left .NAME.staging-PID[...] and .NAME.PID.tmp
# files, and .NAME.export-PID / .NAME.old-PID directories (export).
_DEBRIS_RE = re.compile(r"^\.(?P<base>.+?)\.(?:(?:partial|staging|export|old)-(?P<pid>\d+)(?:\..*)?"
                        r"|(?P<tmp_pid>\d+)\.tmp)$")
_WRITE_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.ENOTDIR, errno.EEXIST}


def partial_path(path: str | Path) -> Path:
    """Where this process writes ``path`` before renaming it into place."""
    path = Path(path)
    return path.with_name(f".{path.name}.partial-{os.getpid()}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process
        return True
    except OSError:
        return True
    return True


def clean_stale(directory: str | Path, name: str | None = None) -> list[Path]:
    """Remove the partial files and directories in ``directory`` whose writing process no longer
    runs: all of ours (``.X.partial-PID``), and those of older releases (``.X.staging-PID``,
    ``.X.PID.tmp``, ``.X.export-PID``, ``.X.old-PID``) for ``name`` (all of them when ``name`` is
    None); the removed paths."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = _DEBRIS_RE.match(entry.name)
        if m is None:
            continue
        ours = re.search(r"\.partial-\d+$", entry.name) is not None
        if not ours and name is not None and m.group("base") != name and not m.group("base").startswith(f"{name}."):
            continue
        if _alive(int(m.group("pid") or m.group("tmp_pid"))):
            continue
        try:
            if entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            elif entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
                removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


def write_error(path: Path, exc: OSError) -> LocalspecError:
    """One line for a file that cannot be written (read-only directory, disk full, ...)."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        reason = "a file is in the way of a directory"
    return LocalspecError(f"cannot write {path} ({reason}); is {path.parent} a writable directory?")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """``with atomic_path(out) as tmp:`` write ``tmp`` completely; it becomes ``out`` when the block
    ends without an exception, and is removed otherwise."""
    path = Path(path)
    tmp = partial_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(path.parent, path.name)
        tmp.touch()   # fails here, in one clear line, when the directory is not writable
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        yield tmp
        if not tmp.is_file():
            raise LocalspecError(f"internal: nothing was written for {path}")
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        if exc.errno in _WRITE_ERRNOS:
            raise write_error(path, exc) from None
        raise
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: Path) -> None:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        pass


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """``with atomic_dir(out) as tmp:`` fill the new directory ``tmp``; it becomes ``out`` (replacing
    an existing directory ``out``) when the block ends without an exception, and is removed otherwise.

    Replacing takes two renames (the old directory aside, the new one in); a process killed between
    them leaves the old one as ``.NAME.partial-PID.old``, swept like any partial file."""
    path = Path(path)
    tmp = partial_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale(path.parent, path.name)
        _unlink(tmp)
        tmp.mkdir()   # fails here, in one clear line, when the directory is not writable
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        yield tmp
        if path.exists():
            old = tmp.with_name(f"{tmp.name}.old")
            os.replace(path, old)
            os.replace(tmp, path)
            _unlink(old)
        else:
            os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        if exc.errno in _WRITE_ERRNOS:
            raise write_error(path, exc) from None
        raise
    except BaseException:
        _unlink(tmp)
        raise


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically and durably (fsync before the rename)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
    return path
