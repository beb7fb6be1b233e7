"""Storage of named models: the curated catalog (``models.toml``) and the user's own records
(made by ``create`` / ``pull``); nothing here downloads, converts or resolves a name.

Catalog
    The canonical catalog ships inside the package as ``localspec/data/models.toml`` (found with
    :mod:`importlib.resources`, so it works from a wheel); ``models.toml`` at the repository root is
    a documentation copy that a test keeps byte-identical. A user may add or override entries in
    ``<user dir>/models.toml`` (same schema). The schema is validated with pydantic; a bad entry is
    one error naming the file and the key.

User models
    ``localspec create`` and ``localspec pull`` (:mod:`localspec.store.install`) store one JSON
    record per model in ``<user dir>/models/NAME.json``, written by :mod:`localspec.core.atomic`. A record
    holds absolute paths (the target GGUF, the drafter GGUF), the Modelfile settings, and where the
    files came from. Drafters that localspec converted live in ``<user dir>/drafters/`` and are
    removed with the model; files in the Hugging Face cache are left to ``hf cache``.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..core.atomic import atomic_write
from ..core.errors import LocalspecError, NotFound
from ..formats.modelfile import Modelfile, check_parameter
from ..core.names import check_model_name, is_model_name, shown
from ..core.paths import user_dir, writable_dir
from .locks import is_busy, name_lock

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
CATALOG_FILE = "models.toml"
RECORD_FORMAT = 1


def check_name(name: str) -> str:
    """``name`` when it follows the one name rule (:mod:`localspec.core.names`), else one error."""
    return check_model_name(name)


def _check_parameters(params: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key == "stop":
            values = value if isinstance(value, list) else [value]
            out[key] = [check_parameter(key, v) for v in values]
        else:
            out[key.lower()] = check_parameter(key, value)
    return out


# --------------------------------------------------------------------------------------------
# catalog schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HubFile(_Strict):
    """One GGUF file in a Hugging Face repository."""

    repo: str
    file: str
    revision: Optional[str] = None       # commit hash (preferred), tag or branch; default: main
    sha256: Optional[str] = None         # of the file; verified after download when given
    size: Optional[int] = Field(default=None, gt=0)
    parts: list[str] = Field(default_factory=list)   # further parts of a split GGUF (same folder)
    alternatives: list[str] = Field(default_factory=list)   # other names of the file (tried first)

    @field_validator("parts", "alternatives")
    @classmethod
    def _parts(cls, v: list[str]) -> list[str]:
        for part in v:
            cls._gguf(part)
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not REPO_RE.fullmatch(v):
            raise ValueError(f"'{v}' is not a repository id (expected OWNER/NAME)")
        return v

    @field_validator("sha256")
    @classmethod
    def _sha(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not SHA256_RE.match(v):
            raise ValueError("expected 64 lower-case hex digits")
        return v

    @field_validator("file")
    @classmethod
    def _gguf(cls, v: str) -> str:
        if not v.endswith(".gguf"):
            raise ValueError(f"'{v}' is not a .gguf file")
        return v


class DraftSource(_Strict):
    """The drafter: a GGUF file (``file``) or a checkpoint to convert (``files``)."""

    repo: str
    file: Optional[str] = None
    files: Optional[list[str]] = None
    alternatives: list[str] = Field(default_factory=list)   # other names of file / the weights file
    revision: Optional[str] = None
    sha256: Optional[str | dict[str, str]] = None     # one digest for ``file``, a table for ``files``
    variant: Literal["eagle3", "eagle3.1", "dflash", "dspark"] = "eagle3"   # dflash / dspark: a block drafter

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        return HubFile._repo(v)

    @model_validator(mode="after")
    def _shape(self) -> "DraftSource":
        if (self.file is None) == (self.files is None):
            raise ValueError("give either file (a drafter .gguf) or files (a checkpoint to convert)")
        for alt in self.alternatives:
            if self.file is not None and not alt.endswith(".gguf"):
                raise ValueError(f"alternative '{alt}' of a drafter .gguf is not a .gguf")
            if self.file is None and not alt.endswith((".safetensors", ".bin", ".json")):
                raise ValueError(f"alternative '{alt}' is not a checkpoint file (.safetensors, .bin or .json)")
        if self.file is not None:
            if not self.file.endswith(".gguf"):
                raise ValueError(f"file '{self.file}' is not a .gguf (use files = [...] for a checkpoint)")
            if self.sha256 is not None and not (isinstance(self.sha256, str) and SHA256_RE.match(self.sha256)):
                raise ValueError("sha256 of a drafter file must be 64 lower-case hex digits")
        else:
            assert self.files is not None
            if not self.files or "config.json" not in self.files:
                raise ValueError("a checkpoint's files must include config.json")
            if self.sha256 is not None:
                if not isinstance(self.sha256, dict):
                    raise ValueError("sha256 of a checkpoint must be a table {file = digest}")
                for key, digest in self.sha256.items():
                    if key not in self.files:
                        raise ValueError(f"sha256 names '{key}', which is not in files")
                    if not SHA256_RE.match(digest):
                        raise ValueError(f"sha256 of '{key}' must be 64 lower-case hex digits")
        return self

    def digest(self, filename: str) -> Optional[str]:
        if isinstance(self.sha256, dict):
            return self.sha256.get(filename)
        return self.sha256 if filename == self.file else None


class CatalogEntry(_Strict):
    description: str
    embedded: bool = False                 # the target ships with localspec (no download)
    target: Optional[HubFile] = None
    draft: Optional[DraftSource] = None
    # "mtp": the target GGUF carries its own MTP (NextN) heads and drafts with them: no [draft] table
    # (`pull` checks the file has them; localspec.speculation.mtp)
    source: Optional[Literal["mtp"]] = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    system: Optional[str] = None
    template: Optional[str] = None
    license: Optional[str] = None          # the target's license, informational
    # what was checked against public sources, what was not, and where (informational; shown by
    # `localspec list --catalog` as the CHECKED column)
    verified: Optional[str] = None
    unverified: Optional[str] = None
    sources: list[str] = Field(default_factory=list)

    @property
    def checked(self) -> str:
        """``yes`` (all verified), ``partly`` or ``no`` (nothing checked against a source)."""
        if self.embedded and not self.unverified:
            return "yes"
        if not self.verified:
            return "no"
        return "partly" if self.unverified else "yes"

    @field_validator("parameters")
    @classmethod
    def _params(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_parameters(v)

    @model_validator(mode="after")
    def _source(self) -> "CatalogEntry":
        if self.embedded == (self.target is not None):
            raise ValueError("give either embedded = true or a [target] table")
        if self.source == "mtp" and self.draft is not None:
            raise ValueError('source = "mtp" drafts with the target\'s own heads: give no [draft] table')
        return self


class Catalog(_Strict):
    schema_version: Literal[1] = Field(alias="schema")
    models: dict[str, CatalogEntry]

    @field_validator("models")
    @classmethod
    def _names(cls, v: dict[str, CatalogEntry]) -> dict[str, CatalogEntry]:
        for name in v:
            if not is_model_name(name):
                raise ValueError(f"invalid model name '{shown(name)}'")
        return v


def _format_validation(path: str, exc: ValidationError) -> LocalspecError:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if p not in ("function-after",) and not str(p).startswith("function"))
    msg = err["msg"].removeprefix("Value error, ")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return LocalspecError(f"{path}: {loc}: {msg}{more}" if loc else f"{path}: {msg}{more}")


def parse_catalog(text: str, path: str = CATALOG_FILE) -> Catalog:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LocalspecError(f"{path}: not valid TOML ({exc})") from None
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        raise _format_validation(path, exc) from None


def shipped_catalog_text() -> str:
    return resources.files("localspec").joinpath("data", CATALOG_FILE).read_text(encoding="utf-8")


def user_catalog_path() -> Path:
    return user_dir() / CATALOG_FILE


def load_catalog() -> dict[str, CatalogEntry]:
    """The shipped catalog with the user's ``models.toml`` entries laid over it."""
    entries = dict(parse_catalog(shipped_catalog_text(), f"localspec/data/{CATALOG_FILE}").models)
    extra = user_catalog_path()
    if extra.is_file():
        try:
            text = extra.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else (exc.strerror or type(exc).__name__)
            raise LocalspecError(f"{extra}: cannot read your catalog ({why}); fix or delete it") from None
        entries.update(parse_catalog(text, str(extra)).models)
    return entries


def catalog_entry(name: str) -> CatalogEntry | None:
    return load_catalog().get(name)


# --------------------------------------------------------------------------------------------
# user models


class UserModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal[1] = RECORD_FORMAT
    name: str
    target: str                                   # absolute path of the target GGUF
    drafter: Optional[str] = None                 # absolute path of the drafter GGUF
    parameters: dict[str, Any] = Field(default_factory=dict)
    template: Optional[str] = None
    system: Optional[str] = None
    messages: list[tuple[str, str]] = Field(default_factory=list)
    license: list[str] = Field(default_factory=list)
    origin: dict[str, str] = Field(default_factory=dict)    # "from", "draft", "modelfile", "catalog", "source"
    owned: list[str] = Field(default_factory=list)          # files localspec made (removed by rm)
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not is_model_name(v):
            raise ValueError(f"invalid model name '{shown(v)}'")
        return v

    @field_validator("parameters")
    @classmethod
    def _params(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_parameters(v)

    @field_validator("messages")
    @classmethod
    def _roles(cls, v: list[tuple[str, str]]) -> list[tuple[str, str]]:
        for role, _ in v:
            if role not in ("system", "user", "assistant"):
                raise ValueError(f"unknown message role '{role}'")
        return v

    def to_modelfile(self) -> Modelfile:
        return Modelfile(from_=self.target, draft=self.drafter, parameters=dict(self.parameters),
                         template=self.template, system=self.system, messages=list(self.messages),
                         license=list(self.license), path=self.name)


def models_dir() -> Path:
    return user_dir() / "models"


def drafters_dir() -> Path:
    return writable_dir(user_dir() / "drafters")


def record_path(name: str) -> Path:
    return models_dir() / f"{check_name(name)}.json"


def save(model: UserModel) -> Path:
    path = record_path(model.name)
    atomic_write(path, json.dumps(model.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n")
    return path


class DamagedRecord(LocalspecError):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: damaged model record ({reason}); remove it with `localspec rm {path.stem}`")
        self.reason = reason


def _read_record(path: Path) -> UserModel:
    """A record, or DamagedRecord naming the damage (not UTF-8, not JSON, wrong fields, unreadable)."""
    try:
        return UserModel.model_validate_json(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        reason = "not UTF-8 text"
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"]
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    raise DamagedRecord(path, reason)


def load(name: str) -> UserModel | None:
    """The user's model ``name``, or None if there is none."""
    if not is_model_name(name):
        return None
    path = models_dir() / f"{name}.json"
    if not path.is_file():
        return None
    return _read_record(path)


def list_models() -> list[UserModel]:
    return scan()[0]


def scan() -> tuple[list[UserModel], list[tuple[str, str]], list[Path]]:
    """(valid records, damaged records as (name, reason), orphaned drafters): what ``list`` shows.

    An orphan is a file in the drafters folder that no record uses, e.g. a drafter converted by a
    ``create`` that was interrupted before it wrote the record (records are written last)."""
    d = models_dir()
    models: list[UserModel] = []
    damaged: list[tuple[str, str]] = []
    if d.is_dir():
        for path in sorted(d.glob("*.json")):
            if path.name.startswith("."):
                continue
            try:
                models.append(_read_record(path))
            except DamagedRecord as exc:
                damaged.append((path.stem, exc.reason))
    used = {str(Path(f).resolve()) for m in models for f in [*m.owned, m.drafter] if f}
    drafters = user_dir() / "drafters"
    damaged_names = {n for n, _ in damaged}
    orphans = [p for p in sorted(drafters.glob("*.gguf")) if not p.name.startswith(".")
               and str(p.resolve()) not in used and p.stem not in damaged_names
               and not is_busy(p.stem)] if drafters.is_dir() else []   # (busy: a create under way)
    return models, damaged, orphans


def remove(name: str) -> UserModel | None:
    """Remove model ``name``: its record (damaged or not) and the drafter localspec converted for it;
    also an orphaned ``drafters/NAME.gguf`` without a record. The record, when it was readable.
    Refused while another process creates (or removes) the same name."""
    check_name(name)
    with name_lock(name, what="remove", wait=False):
        return _remove(name)


def _remove(name: str) -> UserModel | None:
    path = models_dir() / f"{name}.json"
    drafters = user_dir() / "drafters"
    own_drafter = drafters / f"{name}.gguf"
    model: UserModel | None = None
    if path.is_file():
        try:
            model = _read_record(path)
            owned = [Path(f) for f in model.owned]
        except DamagedRecord:   # damaged: the drafter it owned can only be the conventional one
            owned = [own_drafter]
    elif own_drafter.is_file():
        owned = [own_drafter]   # an orphan left by an interrupted create
    else:
        raise NotFound(f"model '{name}' not found (see `localspec list`)")
    others, _, _ = scan()
    in_use = {str(Path(f).resolve()) for m in others if m.name != name for f in [*m.owned, m.drafter] if f}
    try:
        if path.is_file():
            path.unlink()
        base = drafters.resolve()
        for p in owned:   # only files localspec made for it, and no other model uses
            if p.resolve().parent == base and p.is_file() and str(p.resolve()) not in in_use:
                p.unlink()
    except OSError as exc:
        raise LocalspecError(f"cannot remove model '{name}': {exc.strerror or exc} ({exc.filename})") from None
    return model
