"""The command line as a user runs it.

:func:`cli` runs ``python -m localspec ...`` in a subprocess: for what needs the process boundary
(exit statuses of native aborts, signals, Ctrl-C, the first run of a fresh process). Children start
with SIGINT at its default: pytest started in the background of a non-interactive shell runs with
SIGINT ignored, and a child would inherit that and never see a test's Ctrl-C.

:func:`run_cli` runs the same entry point (``localspec.cli.main``) in this process, with file
descriptors 1 and 2 captured, so llama.cpp's native output counts as it would in a terminal. It
returns the same ``CompletedProcess``, in a fraction of the time (no interpreter, torch or llama.cpp
start-up per call).

:func:`cli_batch` runs many commands through :func:`run_cli` in one child process: for inputs that
would abort the process natively if a check were missing (the child dies, not the test run), at
the cost of one start-up.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

LOCALSPEC = (sys.executable, "-m", "localspec")


def default_sigint() -> None:
    """``preexec_fn`` for every child a test may send SIGINT to."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*LOCALSPEC, *args], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=default_sigint, **kwargs)


def one_error_cli(*args, timeout: int = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """:func:`cli` with ``env`` added to this process's environment and undecodable output replaced."""
    return subprocess.run([*LOCALSPEC, *args], capture_output=True, text=True, errors="replace", timeout=timeout,
                          env={**os.environ, **(env or {})}, preexec_fn=default_sigint)


def assert_one_error(proc: subprocess.CompletedProcess, code: int = 1, *, contains: str = "") -> str:
    """Exactly one line on stderr, ``Error: ...``, the exit code, no traceback, no native crash."""
    err = proc.stderr
    assert proc.returncode == code, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and "GGML_ASSERT" not in err, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("Error: "), err[-2000:]
        assert contains in lines[0], (contains, lines[0])
        return lines[0]
    return err


def works(target: Path, *extra: str) -> None:
    """The next run works."""
    proc = one_error_cli("generate", "--target", str(target), "-p", "hi", "--raw", "-n", "3", "--no-spec", *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]


def cli_batch(*commands: list[str], timeout: int = 600) -> list[subprocess.CompletedProcess]:
    """``localspec ARGS`` for each command, in order, in one child process (:func:`run_cli` there);
    each result has ``seconds``, the time its command took. A child that dies (a native abort)
    fails the calling test with the command it died in and its output."""
    with tempfile.TemporaryDirectory() as d:
        results = Path(d) / "results.jsonl"
        child = subprocess.run([sys.executable, __file__, str(results)], input=json.dumps(commands),
                               capture_output=True, text=True, timeout=timeout, preexec_fn=default_sigint)
        done = [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines()] \
            if results.exists() else []
    if child.returncode != 0 or len(done) != len(commands):
        at = commands[len(done)] if len(done) < len(commands) else None
        raise AssertionError(f"the batch child ended with {child.returncode} at command {at}: "
                             f"{child.stdout[-2000:]}{child.stderr[-2000:]}")
    out = []
    for args, r in zip(commands, done):
        proc = subprocess.CompletedProcess(args, r["returncode"], r["stdout"], r["stderr"])
        proc.seconds = r["seconds"]
        out.append(proc)
    return out


def _batch_child(results: str) -> None:
    import time

    for args in json.loads(sys.stdin.read()):
        t0 = time.perf_counter()
        r = run_cli(*args)
        with open(results, "a", encoding="utf-8") as fh:   # line by line: a native abort keeps the earlier ones
            fh.write(json.dumps(dict(returncode=r.returncode, stdout=r.stdout, stderr=r.stderr,
                                     seconds=time.perf_counter() - t0)) + "\n")


def run_cli(*args: str, env: dict | None = None, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``localspec ARGS`` in this process; ``env`` replaces the environment for the call (as
    ``subprocess.run(env=...)`` does), ``cwd`` the working directory."""
    from localspec.cli import main

    handler = signal.getsignal(signal.SIGINT)
    with _environment(env), _directory(cwd), _captured() as result:
        try:
            result.returncode = main(list(args))
        finally:
            signal.signal(signal.SIGINT, handler)   # main() installs its Ctrl-C handler
    return result


@contextlib.contextmanager
def _environment(env: dict | None) -> Iterator[None]:
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _directory(cwd: str | Path | None) -> Iterator[None]:
    if cwd is None:
        yield
        return
    saved = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved)


@contextlib.contextmanager
def _captured() -> Iterator[subprocess.CompletedProcess]:
    """fd 1 and 2 (Python's and native writes) into files; the result's stdout and stderr."""
    result = subprocess.CompletedProcess(args=[], returncode=-1)
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    streams = sys.stdout, sys.stderr
    for s in streams:
        s.flush()
    saved = [os.dup(1), os.dup(2)]
    os.dup2(files[0].fileno(), 1)
    os.dup2(files[1].fileno(), 2)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    try:
        yield result
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = streams
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        result.stdout, result.stderr = (_read(f) for f in files)


def _read(f) -> str:
    f.seek(0)
    text = io.TextIOWrapper(f, encoding="utf-8", errors="replace").read()
    return text


if __name__ == "__main__":
    _batch_child(sys.argv[1])
