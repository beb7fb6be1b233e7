"""The Typer application every subcommand module registers on (``from .app import app``).

A module of its own so that the subcommands do not import the package that imports them;
``localspec.cli.main`` imports it (and typer) inside its Ctrl-C handling.
"""

import typer

app = typer.Typer(
    name="localspec",
    help="EAGLE-3 speculative decoding for local models on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
