"""A drafter checkpoint whose ``config.json`` states a ``head_dim`` its own weights contradict.

AngelSlim released its Qwen3-4B EAGLE-3 drafter with ``"head_dim": 80`` (hidden_size 2560 / 32
heads, "to suit SGLang/vLLM", AngelSlim issue #5) while the weights are 32 heads of 128
(``q_proj`` is [4096, 5120], SafeAILab/EAGLE issue #315); a later revision of the repository says
128. The weights decide: when the attention projections are consistent with one other head width
(q rows = heads x d, k rows = kv heads x d, o columns = heads x d, d even), ``pull`` converts a copy
of the checkpoint whose config says d, and says so. Anything else is left to the converter, which
refuses a tensor whose shape disagrees with the config.

Shapes come from the safetensors headers (no tensor is read, torch is not needed); pickled ``.bin``
checkpoints are left as they are.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

_MAX_HEADER = 64 << 20


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    with path.open("rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        if not 0 < n <= _MAX_HEADER:
            return {}
        header = json.loads(fh.read(n))
    return {k: v.get("shape", []) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def _attention_shapes(src: Path) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for f in sorted(src.glob("*.safetensors")):
        try:
            shapes.update(_safetensors_shapes(f))
        except (OSError, ValueError):
            return {}        # unreadable: the converter reports it
    return {k: v for k, v in shapes.items() if k.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                           "self_attn.o_proj.weight"))}


def _layer_config(config: dict) -> dict:
    """The dict holding the attention hyperparameters (speculators nest them)."""
    nested = config.get("transformer_layer_config")
    return nested if isinstance(nested, dict) else config


def weights_head_dim(src: Path) -> tuple[int, int] | None:
    """(config's head_dim, the weights' head_dim) when they disagree and the weights are consistent."""
    try:
        config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    hp = _layer_config(config) if isinstance(config, dict) else {}
    try:
        n_head = int(hp["num_attention_heads"])
        n_kv = int(hp.get("num_key_value_heads") or n_head)
        hidden = int(hp["hidden_size"])
        stated = int(hp.get("head_dim") or hidden // n_head)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    shapes = _attention_shapes(src)
    q = next((v for k, v in shapes.items() if k.endswith("q_proj.weight")), None)
    k = next((v for k, v in shapes.items() if k.endswith("k_proj.weight")), None)
    o = next((v for k, v in shapes.items() if k.endswith("o_proj.weight")), None)
    if not (q and k and o) or len(q) != 2 or len(k) != 2 or len(o) != 2 or n_head <= 0:
        return None
    if q[0] == n_head * stated or q[0] % n_head:
        return None
    real = q[0] // n_head
    if real % 2 or k[0] != n_kv * real or o[1] != n_head * real:
        return None
    return stated, real


@contextmanager
def consistent_head_dim(src: Path) -> Iterator[tuple[Path, str | None]]:
    """``src``, or a temporary copy (config rewritten, weights linked) whose head_dim fits the weights.

    Yields (directory to convert, a note for the user or None).
    """
    found = weights_head_dim(src)
    if found is None:
        yield src, None
        return
    stated, real = found
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    _layer_config(config)["head_dim"] = real
    with tempfile.TemporaryDirectory(prefix="localspec-ckpt-") as tmp:
        fixed = Path(tmp) / src.name
        fixed.mkdir()
        for f in src.iterdir():
            if f.name != "config.json" and f.is_file():
                os.symlink(f.resolve(), fixed / f.name)
        (fixed / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        yield fixed, (f"config.json says head_dim {stated}, but the attention weights are "
                      f"{real} wide (as in AngelSlim's Qwen3-4B drafter, AngelSlim issue #5): converted "
                      f"with head_dim {real}")
