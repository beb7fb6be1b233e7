"""The Typer application every subcommand module registers on (``from .app import app``).

A module of its own so that the subcommands do not import the package that imports them;
``localspec.cli.main`` imports it (and typer) inside its Ctrl-C handling.
"""

import typer
from typer.core import TyperOption

_type_label = TyperOption.display_type_rich


def _flag_without_type(self, ctx):
    """Help shows a value's type (``<int>``) but none on a flag, which takes no value (typer 0.29
    labels flags ``<bool>``, ``--help`` included)."""
    return None if self.is_flag else _type_label(self, ctx)


TyperOption.display_type_rich = _flag_without_type

app = typer.Typer(
    name="localspec",
    help="EAGLE-3 speculative decoding for local models on llama.cpp.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def version_line() -> str:
    """``localspec X (llama-cpp-python Y, host loop: C)``: localspec's version, the llama.cpp
    binding it runs on, and whether its C host loop was built (docs/install.md)."""
    from importlib import metadata

    from ..core import __version__, options

    try:
        binding = metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        binding = "not installed"
    try:   # the C module alone: importing llama.hostloop would load llama.cpp
        from ..llama import _hostloop  # noqa: F401
        host = "numpy" if options.env_choice("LOCALSPEC_HOSTLOOP", ("c", "numpy"), "c") == "numpy" else "C"
    except ImportError:
        host = "numpy"
    return f"localspec {__version__} (llama-cpp-python {binding}, host loop: {host})"


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
