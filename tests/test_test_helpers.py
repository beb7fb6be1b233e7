"""Shared test helpers live in helper modules (tests/*.py not named test_*) or conftest.py: no test
module imports from another test module, so each test file can be read, run and changed alone."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):   # every level: imports inside fixtures and functions count too
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_no_test_module_imports_another_test_module():
    offenders = [
        f"{path.name} imports {mod}"
        for path in sorted(TESTS.glob("*.py"))
        for mod in _imported_modules(ast.parse(path.read_text(encoding="utf-8")))
        if mod.split(".")[0].startswith("test_")
    ]
    assert not offenders, "move the shared helper into a helper module or conftest.py: " + "; ".join(offenders)


def test_the_check_sees_a_nested_import():
    tree = ast.parse("def f():\n    from test_engine import run\nimport test_cli\n")
    assert sorted(_imported_modules(tree)) == ["test_cli", "test_engine"]


def test_run_cli_captures_native_output_and_restores_the_process(tmp_path, monkeypatch):
    """In-process runs see what a terminal would: writes to fd 1 and 2 by native code count, the
    call's environment and directory are its own, and the test process's streams, environment,
    directory and SIGINT handler are as before."""
    import os
    import signal
    import sys

    from cli_run import run_cli
    from localspec.cli import _register
    from localspec.cli.app import app

    _register()   # every real command in the list first: the copy below (with the test's command) goes
    monkeypatch.setattr(app, "registered_commands", list(app.registered_commands))

    @app.command("echo-fds")
    def echo_fds() -> None:
        os.write(1, f"out {os.environ.get('ONLY_HERE')} {os.getcwd()}\n".encode())
        os.write(2, b"native line\n")
        print("python line", file=sys.stderr)

    before = (sys.stdout, sys.stderr, dict(os.environ), os.getcwd(), signal.getsignal(signal.SIGINT))
    r = run_cli("echo-fds", env=dict(os.environ, ONLY_HERE="yes"), cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"out yes {tmp_path}\n", "native line\npython line\n")
    assert (sys.stdout, sys.stderr, dict(os.environ), os.getcwd(), signal.getsignal(signal.SIGINT)) == before
