"""Standard output that cannot be written (a full disk, ``>/dev/full``, a closed descriptor, a reader
that went away): one ``Error:`` line, or a quiet exit for a closed pipe, instead of a traceback.

:class:`GuardedStdout` wraps ``sys.stdout`` for the whole command, so a failed write anywhere (print,
rich tables, the token stream) surfaces as :class:`StdoutUnwritable`, which nothing on the way up
mistakes for a failed file of its own (it is not an ``OSError``); :func:`report` turns it into the
exit status at the CLI edge.
"""

from __future__ import annotations

import errno
import os
import sys

# 128 + SIGPIPE: what a shell shows for a Unix tool whose reader went away (`yes | head -1`)
EXIT_BROKEN_PIPE = 141


class StdoutUnwritable(Exception):
    def __init__(self, cause: OSError):
        super().__init__(cause.strerror or str(cause))
        self.cause = cause


class GuardedStdout:
    """A text stream that forwards everything to ``stream`` and raises StdoutUnwritable when a write
    or a flush fails."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            raise StdoutUnwritable(exc) from None

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            raise StdoutUnwritable(exc) from None

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def install() -> str | None:
    """Guard sys.stdout; the reason it cannot be used at all (closed), or None."""
    if sys.stdout is None:   # started with descriptor 1 closed (`>&-`)
        return "cannot write to standard output: it is closed"
    if not isinstance(sys.stdout, GuardedStdout):
        sys.stdout = GuardedStdout(sys.stdout)
    return None


def uninstall() -> None:
    """Give sys.stdout back as it was (main() called in-process, as tests do)."""
    if isinstance(sys.stdout, GuardedStdout):
        sys.stdout = sys.stdout._stream


def _silence() -> None:
    """Point descriptor 1 and sys.stdout at /dev/null, so that what is still buffered goes nowhere
    at exit instead of failing again ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    sys.stdout = open(os.devnull, "w")


def report(exc: StdoutUnwritable) -> int:
    """The exit status for a failed standard output: quiet for a closed pipe, else one line."""
    _silence()
    if exc.cause.errno == errno.EPIPE:
        return EXIT_BROKEN_PIPE
    print(f"Error: cannot write to standard output: {exc}", file=sys.stderr)
    return 1
