"""Which files a model name means: a created or pulled model, a catalog entry, the embedded
default, or a GGUF path (in that order; see :mod:`localspec.store.registry`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from ..core.errors import LocalspecError
from ..core.names import is_model_name
from ..core.paths import embedded_target, package_data, user_dir, writable_dir
from ..formats.modelfile import PARAMETERS, SPEC_PARAMETERS
from . import registry

DEFAULT_MODEL = "smollm2-135m"
# The trained drafter for the embedded target ships in localspec/data once it exists.
DEFAULT_DRAFTER_FILE = "smollm2-135m-eagle3.1.gguf"
# The default target runs as Q4_0, made once from the shipped Q4_1: llama.cpp's CPU kernels batch
# Q4_0 (repacked GEMM) so verifying several drafted tokens costs less than k single steps, and
# plain decoding is faster too (docs/design-notes.md, note 8).
DEFAULT_TARGET_QUANT = "q4_0"


@dataclass
class ModelSpec:
    name: str
    target: Path
    drafter: Path | None = None
    parameters: dict = field(default_factory=dict)   # generation defaults (Modelfile PARAMETERs)
    system: str | None = None
    template: str | None = None                      # Modelfile TEMPLATE (None: the GGUF's own)
    messages: list = field(default_factory=list)     # Modelfile MESSAGEs: [(role, content), ...]
    license: list = field(default_factory=list)
    draft_params: dict = field(default_factory=dict)  # draft_max, draft_policy, draft_tree, draft_p_min


def default_target() -> Path:
    """The embedded target as the project runs it: Q4_0, derived once into the user directory."""
    from ..formats.quantize import requantize

    shipped = embedded_target()
    derived = user_dir() / "models" / f"SmolLM2-135M-Instruct.{DEFAULT_TARGET_QUANT.upper()}.gguf"
    if not derived.is_file() or derived.stat().st_mtime < shipped.stat().st_mtime:
        writable_dir(derived.parent)
        requantize(shipped, derived, DEFAULT_TARGET_QUANT)   # atomic: a kill leaves no model file
    return derived


def default_model() -> ModelSpec:
    drafter = package_data(DEFAULT_DRAFTER_FILE)
    return ModelSpec(DEFAULT_MODEL, default_target(), drafter if drafter.is_file() else None)


def _from_record(record: registry.UserModel) -> ModelSpec:
    params = dict(record.parameters)
    draft_params = {k: params.pop(k) for k in list(params) if k in SPEC_PARAMETERS}
    return ModelSpec(record.name, Path(record.target), Path(record.drafter) if record.drafter else None,
                     parameters=params, system=record.system, template=record.template,
                     messages=[tuple(m) for m in record.messages], license=list(record.license),
                     draft_params=draft_params)


def _from_catalog(name: str, entry: registry.CatalogEntry) -> ModelSpec:
    if not entry.embedded:
        raise LocalspecError(f"model '{name}' is in the catalog but not downloaded: run `localspec pull {name}`")
    model = default_model()
    model.name = name
    params = dict(entry.parameters)
    model.draft_params = {k: params.pop(k) for k in list(params) if k in SPEC_PARAMETERS}
    model.parameters = params
    model.system, model.template = entry.system, entry.template
    return model


def resolve(name: str | None = None, *, target: str | Path | None = None,
            draft: str | Path | None = None) -> ModelSpec:
    """The model to run from a MODEL argument and --target/--draft overrides.

    A name is looked up in the user's models (``create``/``pull``), then the catalog
    (``models.toml``), then taken as the embedded default or a GGUF path.
    """
    if target is not None:
        model = ModelSpec(Path(target).name, Path(target).expanduser())
    elif name is None:
        model = default_model()
    elif (record := registry.load(name)) is not None:
        model = _from_record(record)
    elif is_model_name(name) and (entry := registry.catalog_entry(name)) is not None:
        model = _from_catalog(name, entry)
    elif name == DEFAULT_MODEL:
        model = default_model()
    elif name.endswith(".gguf") or Path(name).expanduser().is_file():
        model = ModelSpec(Path(name).name, Path(name).expanduser())
    else:
        raise LocalspecError(f"unknown model '{name}' (see `localspec list`; give a .gguf path, "
                             f"or omit it for {DEFAULT_MODEL})")
    if draft is not None:
        model.drafter = Path(draft).expanduser()
    return model


def apply_model_defaults(model: ModelSpec, options: dict, is_default) -> dict:
    """``options`` (CLI values by option name) with the model's PARAMETERs filled in wherever
    ``is_default(option_name)`` says the user did not give the option. Keeps the dict's order."""
    out = dict(options)
    for param, value in {**model.parameters, **model.draft_params}.items():
        entry = PARAMETERS.get(param)
        opt = entry.cli if entry is not None else None
        if opt is None or opt not in out or not is_default(opt):
            continue
        if value in entry.automatic and not isinstance(value, bool):
            continue   # Ollama's -1/-2 (no limit), 0 threads (automatic): keep localspec's default
        current = out[opt]
        if param == "stop":
            value = list(value)
        elif param == "draft_tree":             # a Modelfile bool: trees always, or chains only
            value = type(current)("on" if value else "off")
        elif isinstance(current, Enum):
            value = type(current)(value)       # e.g. the CLI's Policy enum
        out[opt] = value
    return out
