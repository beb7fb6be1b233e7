"""``localspec create / list / show / rm / pull``: named target/drafter pairs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..formats import modelfile as mfmod
from ..store import registry
from ..core.errors import LocalspecError
from ..core.names import check_model_name
from ..core.paths import embedded_target, package_data
from ..core.units import format_size
from ..store.models import DEFAULT_DRAFTER_FILE, DEFAULT_MODEL
from .app import app

TimeoutOpt = typer.Option(None, "--timeout", show_default=False,
                          help="Seconds a Hub connection or read may wait (default: $LOCALSPEC_HUB_TIMEOUT or 20).")
HubVerboseOpt = typer.Option(False, "--verbose", help="Show huggingface_hub's retries and warnings.")


@app.command()
def create(
    name: str = typer.Argument(..., help="Name for the model."),
    file: Path = typer.Option(Path("Modelfile"), "--file", "-f", help="The Modelfile (default: ./Modelfile)."),
) -> None:
    """Create a model from a Modelfile (FROM target, DRAFT drafter, PARAMETERs, ...)."""
    registry.check_name(name)
    mf = mfmod.load(file)
    from ..store import install

    record = install.create(name, mf)
    drafter = f" + {Path(record.drafter).name}" if record.drafter else " (no drafter)"
    print(f"created {name}: {Path(record.target).name}{drafter}")


def _size(*paths: str | None) -> str:
    total = 0
    for p in paths:
        if p:
            try:
                total += Path(p).stat().st_size
            except OSError:
                pass
    return format_size(total)


@app.command("list")
def list_(
    catalog: bool = typer.Option(False, "--catalog", help="List the pairs `pull` can download instead."),
) -> None:
    """List the embedded default and your models (created or pulled)."""
    console = Console()
    if catalog:
        mine = {m.name for m in registry.list_models()}
        # CHECKED: repositories, file names and drafter configs checked against public sources
        # (yes / partly / no); the catalog's verified/unverified notes say what and where.
        table = Table("NAME", "TARGET", "DRAFTER", "CHECKED", "LOCAL", "DESCRIPTION")
        for name, entry in registry.load_catalog().items():
            target = "(embedded)" if entry.embedded else f"{entry.target.repo}"  # type: ignore[union-attr]
            draft = f"{entry.draft.repo} ({entry.draft.variant})" if entry.draft else "-"
            if entry.source == "mtp":
                draft = "mtp (the target's own heads)"
            if entry.embedded:
                draft = f"{DEFAULT_DRAFTER_FILE} (embedded)" if package_data(DEFAULT_DRAFTER_FILE).is_file() else "-"
            local = "embedded" if entry.embedded else ("pulled" if name in mine else "")
            table.add_row(name, target, draft, entry.checked, local, entry.description)
        console.print(table)
        return
    models, damaged, orphans = registry.scan()
    if not (models or damaged or orphans):
        print("no models yet besides the embedded default: `localspec create NAME -f Modelfile` or "
              "`localspec pull NAME` (`localspec list --catalog` shows what can be pulled)", file=sys.stderr)
    table = Table("NAME", "TARGET", "DRAFTER", "SIZE", "CREATED")
    _embedded_row(table)
    for m in models:
        drafter = _drafter_name(m.drafter) if m.drafter else ("mtp (the target's own heads)"
                                                          if m.origin.get("source") == "mtp" else "-")
        table.add_row(m.name, Path(m.target).name, drafter,
                      _size(m.target, m.drafter), m.created.replace("T", " ")[:16])
    for name, reason in damaged:
        table.add_row(name, f"damaged record ({reason})", "-", "-", f"`localspec rm {name}`")
    for path in orphans:
        table.add_row(path.stem, "orphaned drafter, no record", path.name, _size(str(path)),
                      f"`localspec rm {path.stem}`")
    console.print(table)


def _embedded_row(table: Table) -> None:
    """The embedded default (``chat`` with no MODEL runs it): shipped in the packages, nothing to create."""
    try:
        target = embedded_target()
    except LocalspecError:
        return   # the target's package is missing: `chat` says so itself
    drafter = package_data(DEFAULT_DRAFTER_FILE)
    drafter = drafter if drafter.is_file() else None
    table.add_row(DEFAULT_MODEL, f"{target.name} (embedded; runs as Q4_0)", drafter.name if drafter else "-",
                  _size(str(target), str(drafter) if drafter else None), "built in")


@app.command()
def show(
    name: str = typer.Argument(..., help="A model name."),
    modelfile: bool = typer.Option(False, "--modelfile", help="Print a Modelfile that recreates it."),
) -> None:
    """Show a model's files and settings."""
    from ..store.models import resolve

    record = registry.load(name)
    if record is not None:
        mf = record.to_modelfile()
    else:
        model = resolve(name)
        mf = mfmod.Modelfile(from_=str(model.target), draft=str(model.drafter) if model.drafter else None,
                             parameters={**model.parameters, **model.draft_params}, template=model.template,
                             system=model.system, messages=list(model.messages), license=list(model.license))
    if modelfile:
        sys.stdout.write(mfmod.dumps(mf, header=f"Modelfile for {name}, written by `localspec show --modelfile`\n"
                                                "To make a copy: localspec create NEWNAME -f <this file>"))
        return
    console = Console()
    table = Table(show_header=False, box=None)
    table.add_row("name", name)
    table.add_row("target", mf.from_)
    table.add_row("drafter", _drafter_name(mf.draft, full=True) if mf.draft else "-")
    if record is not None:
        for key, value in record.origin.items():
            table.add_row(f"origin.{key}", value)
        table.add_row("created", record.created)
    for key, value in mf.parameters.items():
        table.add_row(f"parameter {key}", ", ".join(map(repr, value)) if isinstance(value, list) else str(value))
    if mf.system is not None:
        table.add_row("system", mf.system)
    if mf.template is not None:
        table.add_row("template", mf.template)
    for role, content in mf.messages:
        table.add_row(f"message {role}", content)
    for text in mf.license:
        table.add_row("license", text.splitlines()[0] if text else "")
    console.print(table)


@app.command()
def rm(name: str = typer.Argument(..., help="The model to remove.")) -> None:
    """Remove a model (its record and any drafter localspec converted for it)."""
    registry.remove(name)
    print(f"deleted {name}")


@app.command()
def pull(
    name: str = typer.Argument(..., help="A catalog name (see `localspec list --catalog`)."),
    timeout: Optional[float] = TimeoutOpt,
    verbose: bool = HubVerboseOpt,
) -> None:
    """Download a curated target/drafter pair from the Hugging Face Hub and register it."""
    from ..store import hub

    hub.configure(timeout=timeout, verbose=verbose)
    record = registry_pull(name)
    if record is None:
        print(f"{name} ships with localspec: nothing to download")
        return
    drafter = f" + {Path(record.drafter).name}" if record.drafter else ""
    print(f"pulled {name}: {Path(record.target).name}{drafter}")


def registry_pull(name: str):
    from ..store import install

    if registry.catalog_entry(name) is None:
        check_model_name(name)
    return install.pull(name)


def _drafter_name(path: str, *, full: bool = False) -> str:
    """A drafter file's name (``full``: its path); a block drafter's kind beside it (dflash,
    dspark: the ``--source`` word it drafts under)."""
    from ..formats.gguf_info import read_gguf

    name = str(path) if full else Path(path).name
    try:
        info = read_gguf(path)
    except LocalspecError:   # gone or damaged: the name alone (rm and the checks say the rest)
        return name
    return f"{name} ({info.block_kind} block drafter)" if info.is_block_drafter else name
