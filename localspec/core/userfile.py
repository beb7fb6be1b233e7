"""Files a user names (``--prediction``, ``--grammar``, ``--json-schema``, ``create -f``'s Modelfile,
``bench --prompts``, a checkpoint's ``config.json``): read through :func:`read_text` only, which
checks the size before reading a byte (a 12 GiB sparse file, a FIFO, ``/dev/zero`` are refused in
one line instead of filling the memory; a pipe or a device is read up to the limit) and decodes UTF-8.

The limits are per kind of file, far above what any real one needs (a Modelfile of 1 MiB, a
prompts file of 256 MiB), so they only ever stop something that is not the file it claims to be.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import LocalspecError
from .units import MiB, format_size

TEXT_LIMIT = 64 * MiB        # a prediction, a grammar, a JSON schema
PROMPTS_LIMIT = 256 * MiB    # bench --prompts (JSONL)
CONFIG_LIMIT = 16 * MiB      # a Modelfile, a checkpoint's config.json


def read_bytes(path: str | Path, what: str, limit: int = TEXT_LIMIT) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, or one LocalspecError
    naming ``what`` (the flag, or the file's role)."""
    p = Path(path).expanduser()
    try:
        fd = os.open(p, os.O_RDONLY)
    except OSError as exc:   # (missing: "cannot read (No such file or directory)")
        raise LocalspecError(f"{what} {p}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise LocalspecError(f"{what} {p}: is a directory, not a file")
        if stat.S_ISREG(st.st_mode) and st.st_size > limit:   # (a pipe or device: the read below is bounded)
            raise LocalspecError(f"{what} {p}: {format_size(st.st_size)} is more than the "
                                 f"{format_size(limit)} such a file may hold")
        chunks, total = [], 0
        while True:   # bounded even if the file grows while it is read
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise LocalspecError(f"{what} {p}: more than the {format_size(limit)} such a file may hold")
        return b"".join(chunks)
    except OSError as exc:
        raise LocalspecError(f"{what} {p}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def read_text(path: str | Path, what: str, limit: int = TEXT_LIMIT) -> str:
    """:func:`read_bytes` decoded as UTF-8 (one LocalspecError when it is not)."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LocalspecError(f"{what} {Path(path).expanduser()}: not UTF-8 text "
                             f"(byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
