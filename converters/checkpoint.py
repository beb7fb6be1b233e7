"""Open a drafter checkpoint: a local directory or file, or a Hugging Face repo id.

A :class:`Checkpoint` holds the parsed ``config.json`` and a lazy table of tensors (name -> loader),
so layout detection looks only at names and shapes, and a broken file is reported with its path
in one line. Formats:
- ``*.safetensors`` (one or sharded), read with ``safetensors`` (torch framework: bf16 works);
- ``*.bin`` / ``*.pt`` / ``*.pth`` PyTorch pickles, loaded with ``torch.load(weights_only=True)``:
  tensors only, no code from the file is ever executed;
- a Hugging Face repo id (``org/name``): its config and weight files, fetched by the ``download``
  the caller passes (``localspec convert`` passes :func:`localspec.store.hub.download_repo`: the HF
  cache, ``HF_HUB_OFFLINE``, timeouts and progress bars apply). The converters sit below the store
  (docs/architecture.md): they download nothing themselves.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from localspec.core.errors import LocalspecError
from localspec.core.userfile import CONFIG_LIMIT, read_bytes

from .provenance import provenance

WEIGHT_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a declared extra
        raise LocalspecError("converting checkpoints needs torch: pip install 'localspec[torch]'") from exc
    return torch


@dataclass
class Checkpoint:
    source: str                           # what the user gave (path or repo id)
    root: Path                            # directory holding config.json (or the file's directory)
    config: dict[str, Any]
    # what a converted GGUF records: repo id (and revision) or the base name, never a local path
    provenance: str = ""
    revision: str = ""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    _loaders: dict[str, Callable[[], Any]] = field(default_factory=dict, repr=False)

    def names(self) -> list[str]:
        return list(self.shapes)

    def tensor(self, name: str) -> np.ndarray:
        """One tensor as numpy: floats as float32, integers as int64, bools as bool."""
        torch = _torch()
        try:
            t = self._loaders[name]()
        except LocalspecError:
            raise
        except Exception as exc:
            raise LocalspecError(f"{self.files[name]}: cannot read tensor {name} ({_one_line(exc)})") from exc
        if t.dtype == torch.bool:
            return t.numpy().astype(bool)
        if t.is_floating_point():
            return t.to(torch.float32).numpy()
        return t.to(torch.int64).numpy()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def _read_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise LocalspecError(f"{path.parent}: no config.json (a drafter checkpoint needs its config)")
    raw = read_bytes(path, "the checkpoint's config", CONFIG_LIMIT)   # its size checked before it is read
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise LocalspecError(f"{path}: not valid JSON ({_one_line(exc)})") from None
    if not isinstance(data, dict):
        raise LocalspecError(f"{path}: expected a JSON object")
    check_config_values(data, path)
    return data


# Every config.json value a layout reads as a number, a text or a sub-config, by kind, at any depth
# (speculators nests the layer's config): checked once, here, so a layout never meets "tiny" where
# an epsilon belongs, a string where rope_scaling's object belongs, or 1e30 positions (the GGUF
# field is 32 bits). One error type, one line, naming the key.
_CONFIG_COUNTS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                  "vocab_size", "target_hidden_size", "draft_vocab_size", "max_position_embeddings",
                  "original_max_position_embeddings")
_CONFIG_REALS = ("rms_norm_eps", "rope_theta", "fc_norm_eps", "factor", "low_freq_factor", "high_freq_factor")
_CONFIG_OBJECTS = ("rope_scaling", "rope_parameters", "eagle_config", "transformer_layer_config", "localspec")
_CONFIG_LISTS = ("architectures", "eagle_aux_hidden_state_layer_ids", "layer_types")
_CONFIG_COUNT_MAX = (1 << 31) - 1


def check_config_values(config: dict, path: Path) -> None:
    """Raise one LocalspecError for the first known key whose value is not of its kind."""
    def bad(key: str, what: str, value: Any) -> LocalspecError:
        shown = json.dumps(value)[:60]
        return LocalspecError(f"{path}: '{key}' must be {what} (got {shown})")

    todo = [config]
    while todo:
        node = todo.pop()
        for key, value in node.items():
            if isinstance(value, dict):
                todo.append(value)
            if value is None:
                continue
            if key in _CONFIG_COUNTS and not (isinstance(value, int) and not isinstance(value, bool)
                                              and 0 < value <= _CONFIG_COUNT_MAX):
                raise bad(key, f"a positive integer of at most {_CONFIG_COUNT_MAX}", value)
            if key in _CONFIG_REALS and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                             and math.isfinite(value) and value > 0):
                raise bad(key, "a positive finite number", value)
            if key in _CONFIG_OBJECTS and not isinstance(value, dict):
                raise bad(key, "an object", value)
            if key in _CONFIG_LISTS and not isinstance(value, list):
                raise bad(key, "a list", value)


def _add_safetensors(ckpt: Checkpoint, path: Path) -> None:
    from safetensors import safe_open

    try:
        handle = safe_open(str(path), framework="pt")
        keys = list(handle.keys())
        size = path.stat().st_size
        for key in keys:
            sl = handle.get_slice(key)
            ckpt.shapes[key] = tuple(int(x) for x in sl.get_shape())
            ckpt.dtypes[key] = str(sl.get_dtype())
        # safetensors checks the header against the file size lazily on some versions: check here
        with path.open("rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            meta = json.loads(fh.read(header_len))
        end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"), default=0)
    except Exception as exc:
        raise LocalspecError(f"{path}: not a readable safetensors file ({_one_line(exc)})") from None
    if 8 + header_len + end > size:
        raise LocalspecError(f"{path}: file is truncated ({size} bytes, its header needs {8 + header_len + end})")
    for key in keys:
        if key in ckpt.files:
            raise LocalspecError(f"{path}: tensor {key} also appears in {ckpt.files[key].name}")
        ckpt.files[key] = path
        ckpt._loaders[key] = (lambda h=handle, k=key: h.get_tensor(k))


def _add_pickle(ckpt: Checkpoint, path: Path) -> None:
    torch = _torch()
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise LocalspecError(
            f"{path}: cannot load as a PyTorch state dict without executing code ({_one_line(exc)})"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise LocalspecError(f"{path}: expected a dict of tensors, found {type(state).__name__}")
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        ckpt.shapes[key] = tuple(value.shape)
        ckpt.dtypes[key] = str(value.dtype).replace("torch.", "")
        ckpt.files[key] = path
        ckpt._loaders[key] = (lambda v=value: v)


def _weight_files(root: Path) -> list[Path]:
    safetensors = sorted(root.glob("*.safetensors"))
    if safetensors:
        return safetensors
    return sorted(p for suffix in _PICKLE_SUFFIXES for p in root.glob(f"*{suffix}")
                  if not p.name.startswith(("optimizer", "scheduler", "training_args", "rng_state", "eagle3_meta")))


# fetches a Hub repository's files matching the patterns; the directory holding them
Download = Callable[[str, list[str]], Path]


# where NeMo Automodel's checkpointer puts the HF-style drafter inside ``epoch_E_step_S/``
_NESTED = ("model/consolidated", "model", "consolidated")


def _checkpoint_subdir(path: Path) -> Path:
    """``path``, or the nested directory holding config.json and weights when ``path`` has none."""
    if (path / "config.json").is_file() or _weight_files(path):
        return path
    for sub in _NESTED:
        cand = path / sub
        if (cand / "config.json").is_file() and _weight_files(cand):
            return cand
    return path


def _looks_like_path(text: str) -> bool:
    """A local path, not a repo id: it starts with '.', '/' or '~', has more than one separator, or
    its parent directory exists here (``ckpts/eagle`` beside an existing ``ckpts/``)."""
    if text.startswith((".", "/", "~")) or text.count(os.sep) > 1 or (os.altsep and os.altsep in text):
        return True
    return os.sep in text and Path(text).expanduser().parent.is_dir()


def open_checkpoint(src: str | Path, download: Download | None = None) -> Checkpoint:
    """Resolve ``src`` (directory, weight file, or HF repo id: fetched with ``download``) and index
    its tensors."""
    text = str(src)
    path = Path(text).expanduser()
    from_hub = False
    if not path.exists():
        if _looks_like_path(text):
            raise LocalspecError(f"{text}: no such file or directory")
        if _REPO_ID.match(text) and download is not None:
            path = download(text, WEIGHT_PATTERNS)
            from_hub = True
        elif _REPO_ID.match(text):
            raise LocalspecError(f"{text}: no such file or directory (a Hugging Face repo id is fetched by "
                                 "`localspec convert`, or pass download=localspec.store.hub.download_repo)")
        else:
            raise LocalspecError(f"{text}: no such file or directory (nor a Hugging Face repo id)")
    given = path
    if path.is_dir():
        path = _checkpoint_subdir(path)
        root, files = path, _weight_files(path)
        if not files:
            raise LocalspecError(f"{path}: no weights (*.safetensors or *.bin) in this directory")
    else:
        root, files = path.parent, [path]
        if not path.name.endswith((".safetensors",) + _PICKLE_SUFFIXES):
            raise LocalspecError(f"{path}: not a checkpoint file (expected .safetensors, .bin, .pt or .pth)")
    label, revision = provenance(text, given.resolve(), repo_id=from_hub)
    ckpt = Checkpoint(source=text, root=root, config=_read_config(root / "config.json"),
                      provenance=label, revision=revision)
    for f in files:
        if f.name.endswith(".safetensors"):
            _add_safetensors(ckpt, f)
        else:
            _add_pickle(ckpt, f)
    if not ckpt.shapes:
        raise LocalspecError(f"{root}: the checkpoint holds no tensors")
    return ckpt
