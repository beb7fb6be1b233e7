"""Installing models: ``create`` (a Modelfile) and ``pull`` (a catalog entry) fetch or find the
files, convert a drafter checkpoint when needed, check the pair, and write the record last.

The layer above the others in ``localspec.store``: it reads names through :mod:`.models`
(resolution), fetches through :mod:`.hub` (downloads only) and writes through :mod:`.registry`
(storage). None of those imports this module.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import LocalspecError, NotFound
from ..formats.chat_format import check_template
from ..formats.gguf_info import check_pair, check_target, mtp_heads, read_gguf
from ..formats.modelfile import Modelfile
from . import hub, registry
from .checkpoint_repair import consistent_head_dim
from .locks import name_lock
from .models import ModelSpec, resolve
from .registry import DamagedRecord, UserModel, check_name, drafters_dir


def convert_drafter(src: Path, target: Path, out: Path) -> Path:
    """Convert a drafter checkpoint directory to ``out`` (GGUF) for ``target``; atomic."""
    try:
        from ..converters.convert import convert_checkpoint
    except ImportError:   # the converter is an optional part of the installation, not a circle
        raise LocalspecError("converting drafter checkpoints needs the converter (not available)") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    try:   # the converter writes ``out`` atomically (one partial file beside it)
        convert_checkpoint(src, target, out, outtype="f16", force=True)
    except LocalspecError:
        raise
    except Exception as exc:  # a converter bug must not leave a traceback
        raise LocalspecError(f"converting {src} failed ({type(exc).__name__}: {exc})") from None
    return out


# --------------------------------------------------------------------------------------------
# create


def _is_pathlike(value: str) -> bool:
    return (value.endswith(".gguf") or value.startswith((".", "/", "~")) or "/" in value or os.sep in value)


def _validate(target: Path, drafter: Path | None, mf: Modelfile) -> None:
    try:
        t = read_gguf(target)
        check_target(t)
    except LocalspecError as exc:
        raise mf.error("FROM", str(exc)) from None
    if drafter is not None:
        try:
            d = read_gguf(drafter)
            check_pair(t, d)
        except LocalspecError as exc:
            raise mf.error("DRAFT", str(exc)) from None


def _resolve_target(mf: Modelfile) -> tuple[Path, ModelSpec | None]:
    """FROM: (the target GGUF, the model it names when FROM is a model name, else None)."""
    ref = hub.parse_hf_ref(mf.from_)
    if ref is not None:
        if ref.path is None or not ref.path.endswith(".gguf"):
            raise mf.error("FROM", f"'{mf.from_}': a Hugging Face target must name a .gguf file "
                                   "(hf.co/OWNER/REPO/FILE.gguf)")
        try:
            return hub.download(ref.repo, ref.path, revision=ref.revision), None
        except LocalspecError as exc:
            raise mf.error("FROM", str(exc)) from None
    if _is_pathlike(mf.from_) or mf.resolve_path(mf.from_).exists():
        target = mf.resolve_path(mf.from_)
        if target.is_dir():
            raise mf.error("FROM", f"{target} is a directory; localspec needs a GGUF target file")
        if not target.is_file():
            raise mf.error("FROM", f"{target}: no such file (expected a target .gguf)")
        return target, None
    try:
        base = resolve(mf.from_)
    except LocalspecError as exc:
        raise mf.error("FROM", f"'{mf.from_}' is neither a file nor a known model ({exc})") from None
    return base.target, base


def create(name: str, mf: Modelfile) -> UserModel:
    """Resolve a parsed Modelfile into a stored model named ``name``."""
    check_name(name)
    if mf.template is not None:   # before any download: a Go template would fail every chat later
        try:
            check_template(mf.template)
        except LocalspecError as exc:
            raise mf.error("TEMPLATE", str(exc)) from None
    # the name stays locked from the conversion to the record: `rm NAME` meanwhile is refused, and
    # `list` does not take the drafter being converted for an orphan
    with name_lock(name, what="create", wait=True):
        return _create(name, mf)


def _create(name: str, mf: Modelfile) -> UserModel:
    target, base = _resolve_target(mf)

    drafter: Path | None = base.drafter if base is not None else None
    owned: list[str] = []
    if mf.draft is not None:
        drafter, made = _resolve_draft(name, mf, target)
        owned = [str(drafter)] if made else []

    try:   # the record is written last, after its files; anything before it undoes the conversion
        _validate(target, drafter, mf)
        record = _record(name, mf, target, drafter, base, owned)
        try:
            old = registry.load(name)
        except DamagedRecord:   # a damaged record is simply replaced
            old = None
        registry.save(record)
    except BaseException:   # an error or a Ctrl-C: the drafter converted for this model goes too
        for f in owned:
            Path(f).unlink(missing_ok=True)
        raise
    if old is not None:   # replaced: drop files the old version owned and the new one does not
        for f in old.owned:
            if f not in owned and Path(f).resolve().parent == drafters_dir().resolve():
                Path(f).unlink(missing_ok=True)
    return record


def _record(name: str, mf: Modelfile, target: Path, drafter: Path | None, base: ModelSpec | None,
            owned: list[str]) -> UserModel:
    """The record of a created model: the Modelfile's settings over those of the model it is FROM."""
    parameters = dict(base.parameters) if base is not None else {}
    if base is not None:
        parameters.update(base.draft_params)
    parameters.update(mf.parameters)
    return UserModel(
        name=name,
        target=str(Path(target).absolute()),
        drafter=str(Path(drafter).absolute()) if drafter is not None else None,
        parameters=parameters,
        template=mf.template if mf.template is not None else (base.template if base else None),
        system=mf.system if mf.system is not None else (base.system if base else None),
        messages=list(mf.messages) if mf.messages else (list(base.messages) if base else []),
        license=list(mf.license) if mf.license else (list(base.license) if base else []),
        origin={k: v for k, v in {"from": mf.from_, "draft": mf.draft,
                                   "modelfile": str(Path(mf.path).absolute()) if mf.base_dir else None}.items() if v},
        owned=owned,
    )


def _resolve_draft(name: str, mf: Modelfile, target: Path) -> tuple[Path, bool]:
    """The drafter GGUF for DRAFT, converting a checkpoint if needed: (path, made by us)."""
    assert mf.draft is not None
    ref = hub.parse_hf_ref(mf.draft)
    try:
        if ref is not None:
            if ref.path is not None and ref.path.endswith(".gguf"):
                return hub.download(ref.repo, ref.path, revision=ref.revision), False
            src = hub.download_checkpoint(ref.repo, revision=ref.revision, subfolder=ref.path)
            return convert_drafter(src, target, drafters_dir() / f"{name}.gguf"), True
        path = mf.resolve_path(mf.draft)
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise LocalspecError(f"{path} has no config.json (expected a drafter checkpoint directory)")
            return convert_drafter(path, target, drafters_dir() / f"{name}.gguf"), True
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                raise LocalspecError(f"{path} is not a .gguf (give the checkpoint's directory to convert it)")
            return path, False
        raise LocalspecError(f"{path}: no such file or directory "
                             "(expected a drafter .gguf, a checkpoint directory or hf.co/OWNER/REPO)")
    except LocalspecError as exc:
        raise mf.error("DRAFT", str(exc)) from None


# --------------------------------------------------------------------------------------------
# pull


def pull(name: str) -> UserModel | None:
    """Download a catalog pair, convert its drafter if needed, verify it and register it as ``name``."""
    entry = registry.catalog_entry(name)
    if entry is None:
        known = ", ".join(sorted(registry.load_catalog()))
        raise NotFound(f"'{name}' is not in the catalog (known: {known})")
    if entry.embedded:
        return None   # ships with localspec: nothing to download
    with name_lock(name, what="pull", wait=True):
        return _pull(name, entry)


def _pull(name: str, entry: registry.CatalogEntry) -> UserModel:
    assert entry.target is not None
    t = entry.target
    target, t_file = hub.fetch_gguf(t.repo, t.file, parts=t.parts, revision=t.revision, sha256=t.sha256,
                                    alternatives=t.alternatives)
    t_info = read_gguf(target)
    check_target(t_info)
    if entry.source == "mtp" and not mtp_heads(t_info):
        raise LocalspecError(f"{name}: the catalog says {t_file} drafts with its own MTP heads, but the file has none "
                             "(no nextn_predict_layers with nextn tensors): a build without them")

    drafter: Path | None = None
    owned: list[str] = []
    d = entry.draft
    d_file = d.file if d is not None else None
    if d is not None:
        if d.file is not None:
            drafter, d_file = hub.fetch_gguf(d.repo, d.file, revision=d.revision, sha256=d.digest(d.file),
                                             alternatives=d.alternatives)
        else:
            digests = d.sha256 if isinstance(d.sha256, dict) else {}
            src = hub.fetch_checkpoint(d.repo, d.files or [], revision=d.revision, digests=digests,
                                       alternatives=d.alternatives)
            with consistent_head_dim(src) as (fixed, note):
                if note:
                    hub.note(f"{d.repo}: {note}")
                drafter = convert_drafter(fixed, target, drafters_dir() / f"{name}.gguf")
            owned.append(str(drafter))
        try:
            check_pair(t_info, read_gguf(drafter))
        except LocalspecError:
            for f in owned:
                Path(f).unlink(missing_ok=True)
            raise

    record = UserModel(
        name=name, target=str(target), drafter=str(drafter) if drafter else None, parameters=dict(entry.parameters),
        template=entry.template, system=entry.system, license=[entry.license] if entry.license else [],
        origin={"catalog": name, "from": f"hf.co/{t.repo}/{t_file}" + (f"@{t.revision}" if t.revision else ""),
                **({"source": entry.source} if entry.source else {}),
                **({"draft": f"hf.co/{d.repo}" + (f"/{d_file}" if d.file else "")
                    + (f"@{d.revision}" if d.revision else "")} if d else {})},
        owned=owned,
    )
    registry.save(record)
    return record
