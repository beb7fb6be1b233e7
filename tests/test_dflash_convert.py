"""``localspec convert`` of DFlash / DSpark checkpoints against llama.cpp's own converter: for a tiny
random checkpoint in each published layout (z-lab's DFlash, DeepSeek's DSpark, the speculators
format's DSparkSpeculator; tests/dflash_models.py), the pinned sdist's ``convert_hf_to_gguf.py``
(with ``--target-model-dir``, a tiny Hugging Face llama target with SmolLM2's tokenizer) and
``localspec convert`` (with that target converted to GGUF by the same script) write GGUFs that
the ``gguf`` reader finds equal key for key (names, order, types, values) and tensor for tensor
(names, order, types, shapes, data), in F32 and in F16.

llama.cpp's converter needs ``transformers`` and ``sentencepiece`` (the ``test`` extra installs
them); without them these tests are skipped."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from dflash_models import hf_target, tiny_checkpoint


def _converter_requirements() -> None:
    for module in ("transformers", "sentencepiece", "torch", "safetensors"):
        pytest.importorskip(module, reason=f"llama.cpp's convert_hf_to_gguf.py needs {module} (the test extra)")


CASES = {"zlab": "f32", "deepseek": "f16", "speculators": "f16"}   # layout: outtype
# one interpreter runs every conversion (torch and transformers imported once): argv lists
_DRIVER = """import json, os, runpy, sys
script, runs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, os.path.dirname(script))
for argv in runs:
    sys.argv = [script] + argv
    runpy.run_path(script, run_name="__main__")
"""


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """The tiny HF target's GGUF, and each layout's checkpoint with its GGUF, as the pinned sdist's
    convert_hf_to_gguf.py writes them."""
    _converter_requirements()
    from sdist_templates import sdist_archive

    d = tmp_path_factory.mktemp("dflash_convert")
    prefix = f"llama_cpp_python-{version('llama-cpp-python')}/vendor/llama.cpp/"
    with tarfile.open(sdist_archive()) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix) and
                   m.name[len(prefix):].startswith(("convert_hf_to_gguf.py", "conversion/", "gguf-py/"))]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(d / "llama.cpp", members=members, filter="data")
    target = hf_target(d / "target")
    runs = [[str(target), "--outfile", str(d / "target.gguf"), "--outtype", "f32"]]
    out = {"target": d / "target.gguf"}
    for layout, outtype in CASES.items():
        ckpt = tiny_checkpoint(d / f"{layout}_draft", layout)
        out[layout] = (ckpt, d / f"{layout}.llama_cpp.gguf")
        runs.append([str(ckpt), "--outfile", str(out[layout][1]), "--outtype", outtype, "--target-model-dir", str(target)])
    done = subprocess.run([sys.executable, "-c", _DRIVER, str(d / "llama.cpp" / "convert_hf_to_gguf.py"), json.dumps(runs)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _keys(reader) -> list[tuple[str, tuple, object]]:
    out = []
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        value = field.contents()
        out.append((name, tuple(int(t) for t in field.types), value))
    return out


def assert_same_gguf(mine: Path, theirs: Path) -> None:
    """Equal key for key and tensor for tensor, in the same order."""
    import gguf

    a, b = gguf.GGUFReader(str(mine)), gguf.GGUFReader(str(theirs))
    ka, kb = _keys(a), _keys(b)
    assert [k[0] for k in ka] == [k[0] for k in kb], ([k[0] for k in ka], [k[0] for k in kb])
    for x, y in zip(ka, kb):
        assert x == y, (x[0], str(x[1:])[:300], str(y[1:])[:300])
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for x, y in zip(a.tensors, b.tensors):
        assert (x.tensor_type, list(x.shape)) == (y.tensor_type, list(y.shape)), x.name
        assert np.array_equal(np.asarray(x.data), np.asarray(y.data)), x.name


@pytest.mark.parametrize("layout", CASES)
def test_convert_writes_llama_cpp_s_dflash_gguf_of_a_dflash_or_dspark_checkpoint(upstream, tmp_path, layout):
    """localspec's converter and llama.cpp's convert_hf_to_gguf.py agree on every key and tensor
    (the DSpark heads, the speculators format's reduced vocabulary and d2t, F16 matrices beside F32
    vectors, the target's tokenizer and the mask token) for each published layout."""
    from localspec.converters.convert import convert_checkpoint

    ckpt, theirs = upstream[layout]
    mine = tmp_path / "localspec.gguf"
    convert_checkpoint(str(ckpt), upstream["target"], mine, outtype=CASES[layout])
    assert_same_gguf(mine, theirs)


def _edit(ckpt: Path, config=None, tensors=None) -> Path:
    """``ckpt`` with its config updated by ``config`` and tensors added or replaced by ``tensors``."""
    from safetensors.torch import load_file, save_file

    if config:
        cfg = json.loads((ckpt / "config.json").read_text())
        for key, value in config.items():
            if isinstance(value, dict) and isinstance(cfg.get(key), dict):
                cfg[key] = {**cfg[key], **value}
            else:
                cfg[key] = value
        (ckpt / "config.json").write_text(json.dumps(cfg))
    if tensors:
        t = load_file(str(ckpt / "model.safetensors"))
        t.update(tensors)
        save_file(t, str(ckpt / "model.safetensors"))
    return ckpt


def test_convert_refuses_a_dflash_or_dspark_checkpoint_it_would_not_write_as_llama_cpp_does(tmp_path):
    """What llama.cpp's converter writes differently (DFlash2, sliding windows, RoPE scaling, a
    non-vanilla Markov head, a tensor outside the Qwen3 set) or refuses (a d2t out of range or
    repeated) is one error line, and no file: never a GGUF that differs from llama.cpp's."""
    pytest.importorskip("torch")
    import torch

    from localspec.core.errors import LocalspecError
    from localspec.converters.convert import convert_checkpoint
    from tiny_models import build_target

    target = build_target(tmp_path / "target.gguf", "noisy", noise=0.006)
    cases = {
        "dflash2": ("zlab", {"dflash_config": {"conv_kernel_size": 3}}, None, "DFlash2"),
        "swa": ("zlab", {"dflash_config": {"use_swa": True, "swa_window_size": 8}}, None, "sliding window"),
        "yarn": ("deepseek", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, None, "RoPE scaling 'yarn'"),
        "markov": ("deepseek", {"markov_head_type": "gated"}, None, "markov_head_type 'gated'"),
        "sinks": ("zlab", None, {"layers.0.self_attn.sinks": torch.zeros(4)}, "tensor model.layers.0.self_attn.sinks"),
        "d2t_range": ("speculators", None, {"d2t": torch.full((512,), 49152)}, "d2t target ids out of range"),
        "d2t_twice": ("speculators", None, {"d2t": -torch.arange(512)}, "duplicate target ids"),
    }
    for name, (layout, config, tensors, message) in cases.items():
        ckpt = _edit(tiny_checkpoint(tmp_path / name, layout), config, tensors)
        out = tmp_path / f"{name}.gguf"
        with pytest.raises(LocalspecError, match=re.escape(message)):
            convert_checkpoint(str(ckpt), target, out, outtype="f16")
        assert not out.exists() and not list(tmp_path.glob(f".{name}.gguf*")), name
