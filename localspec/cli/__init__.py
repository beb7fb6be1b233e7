"""The ``localspec`` command line: one module per subcommand, errors turned into one line here."""

from __future__ import annotations

import sys

import typer

from ..errors import LocalspecError

app = typer.Typer(
    name="localspec",
    help="EAGLE-3 speculative decoding for local models on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # Imported for their @app.command side effect, in the order `--help` lists them.
    from . import generate, bench, chat, serve, models, fit, convert, export, inspect, train  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; usage errors are click's (exit 2), user errors one line (exit 1)."""
    _register()
    try:
        app(args=argv, standalone_mode=True)
    except SystemExit as exc:  # standalone mode exits with click's code (0, usage error 2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except LocalspecError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return 130
    return 0
