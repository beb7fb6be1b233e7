"""The command line as a user runs it: `python -m localspec ...` in a subprocess.

Children start with SIGINT at its default: pytest started in the background of a non-interactive
shell runs with SIGINT ignored, and a child would inherit that and never see a test's Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys

LOCALSPEC = (sys.executable, "-m", "localspec")


def default_sigint() -> None:
    """``preexec_fn`` for every child a test may send SIGINT to."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*LOCALSPEC, *args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=default_sigint, **kwargs)
