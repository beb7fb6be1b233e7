"""The ``localspec`` command line: one module per subcommand, errors turned into one line here."""

from __future__ import annotations

import sys

from ..core import interrupts
from ..core.errors import LocalspecError
from . import stdout_guard


def _register() -> None:
    # Imported for their @app.command side effect (on .app.app), in the order `--help` lists them;
    # imported here, inside main()'s Ctrl-C handling: typer and the engine take a moment to import.
    from . import generate, bench, chat, serve, models, fit, convert, export, inspect, train  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; usage errors are click's (exit 2), user errors one line (exit 1), Ctrl-C
    "Interrupted." (exit 130), standard output that cannot be written one line (exit 1), or a quiet
    exit 141 when its reader went away."""
    interrupts.install()   # a Ctrl-C inside a llama.cpp callback is not lost
    closed = stdout_guard.install()
    if closed:
        print(f"Error: {closed}", file=sys.stderr)
        return 1
    try:
        try:
            _register()
            from .app import app

            app(args=argv, standalone_mode=True)
        finally:
            sys.stdout.flush()   # what is still buffered fails here, not at interpreter exit
            stdout_guard.uninstall()
    except stdout_guard.StdoutUnwritable as exc:
        return stdout_guard.report(exc)
    except SystemExit as exc:  # standalone mode exits with click's code (0, usage error 2)
        if interrupts.is_interrupt(exc):   # typer turns KeyboardInterrupt into a silent exit 130
            return interrupts.report()
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except LocalspecError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return interrupts.report()
    except Exception as exc:
        # a Ctrl-C that an extension module turned into its own error while it was being imported
        # (numpy: "ImportError: numpy._core.umath failed to import") is still a Ctrl-C
        if interrupts.is_interrupt(exc.__cause__ or exc.__context__):
            return interrupts.report()
        raise
    return 0
