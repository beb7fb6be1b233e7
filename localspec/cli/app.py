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


def version_line() -> str:
    """``localspec X (llama-cpp-python Y)``: localspec's version and the llama.cpp binding it runs on."""
    from importlib import metadata

    from .. import __version__

    try:
        binding = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        binding = "not installed"
    return f"localspec {__version__} (llama-cpp-python {binding})"


def _print_version(value: bool) -> None:
    if value:
        print(version_line())
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", callback=_print_version,
                                 is_eager=True),
) -> None:
    """EAGLE-3 speculative decoding for local models on llama.cpp."""
