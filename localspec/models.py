"""Which files a model name means: the embedded default, a GGUF path, or (see registry) a named pair."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import LocalspecError
from .paths import embedded_target, package_data

DEFAULT_MODEL = "smollm2-135m"
# The trained drafter for the embedded target ships in localspec/data once it exists.
DEFAULT_DRAFTER_FILE = "smollm2-135m-eagle3.1.gguf"


@dataclass
class ModelSpec:
    name: str
    target: Path
    drafter: Path | None = None
    parameters: dict = field(default_factory=dict)   # generation defaults (Modelfile PARAMETERs)
    system: str | None = None


def default_model() -> ModelSpec:
    drafter = package_data(DEFAULT_DRAFTER_FILE)
    return ModelSpec(DEFAULT_MODEL, embedded_target(), drafter if drafter.is_file() else None)


def resolve(name: str | None = None, *, target: str | Path | None = None,
            draft: str | Path | None = None) -> ModelSpec:
    """The model to run from a MODEL argument and --target/--draft overrides."""
    if target is not None:
        spec = ModelSpec(Path(target).name, Path(target).expanduser())
    elif name is None or name == DEFAULT_MODEL:
        spec = default_model()
    elif name.endswith(".gguf") or Path(name).expanduser().is_file():
        spec = ModelSpec(Path(name).name, Path(name).expanduser())
    else:
        raise LocalspecError(f"unknown model '{name}' (give a .gguf path, or omit it for {DEFAULT_MODEL})")
    if draft is not None:
        spec.drafter = Path(draft).expanduser()
    return spec
