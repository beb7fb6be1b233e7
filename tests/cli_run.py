"""The command line as a user runs it: `python -m localspec ...` in a subprocess."""

from __future__ import annotations

import subprocess
import sys


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True, timeout=timeout)
