"""A drafter whose config.json understates its head width (AngelSlim's Qwen3-4B drafter: config 80,
weights 128) converts to exactly the drafter its weights describe, through `pull` as well; a config
the weights cannot explain is still refused by the converter.

The checkpoints are tiny EAGLE-3 drafters with real vLLM/AngelSlim key names, written by
test_convert's writer; the target is a tiny random GGUF.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localspec.formats import gguf_consts as K  # noqa: E402
from localspec.store import registry  # noqa: E402
from localspec.store.checkpoint_repair import consistent_head_dim, weights_head_dim  # noqa: E402
from localspec.cli import main  # noqa: E402
from localspec.converters.canonical import DrafterConfig  # noqa: E402
from localspec.converters.convert import convert_checkpoint  # noqa: E402
from localspec.converters.reference import EagleReference  # noqa: E402
from localspec.core.errors import LocalspecError  # noqa: E402
from localspec.llama.gguf_native import GGUFHeader  # noqa: E402
from checkpoints import H, FF, N_LAYER, NH, NKV, VOCAB, write_checkpoint  # noqa: E402
from tiny_models import N_EMBD, build_target  # noqa: E402

WIDE = 32          # the weights' head width; H // NH = 16 is what a config derived from hidden_size says


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return build_target(tmp_path_factory.mktemp("target") / "target.gguf", "random", n_layer=N_LAYER)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    """(honest config, config saying head_dim = hidden/heads) over the same 32-wide weights."""
    cfg = DrafterConfig(
        hidden_size=H, intermediate_size=FF, num_heads=NH, num_kv_heads=NKV, head_dim=WIDE, rms_eps=1e-5,
        rope_theta=10000.0, max_position=4096, target_hidden_size=N_EMBD, target_layers=(1, 3, 6),
        vocab_size=VOCAB, variant=K.VARIANT_EAGLE3,
    )
    torch.manual_seed(3)
    ref = EagleReference(cfg, draft_vocab=600)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name else torch.randn_like(p) * 0.2)
        ids = torch.sort(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:600]).values
        ref.d2t.copy_(ids - torch.arange(600))
    root = tmp_path_factory.mktemp("ckpt")
    honest = write_checkpoint("vllm", ref, root / "honest")
    angelslim = root / "angelslim"
    shutil.copytree(honest, angelslim)
    config = json.loads((angelslim / "config.json").read_text())
    assert config["head_dim"] == WIDE
    config["head_dim"] = H // NH
    (angelslim / "config.json").write_text(json.dumps(config))
    return honest, angelslim


def _tensors(path: Path) -> dict[str, np.ndarray]:
    from gguf import GGUFReader

    return {t.name: np.array(t.data) for t in GGUFReader(str(path)).tensors}


def test_weights_decide_the_head_width(checkpoints, target, tmp_path):
    honest, angelslim = checkpoints
    assert weights_head_dim(honest) is None
    assert weights_head_dim(angelslim) == (H // NH, WIDE)

    # as released, the converter refuses it (q_proj has 4 x 32 rows, the config promises 4 x 16)
    with pytest.raises(LocalspecError, match=r"q_proj.weight has shape \[128, 128\], expected \[64, 128\]"):
        convert_checkpoint(angelslim, target, tmp_path / "refused.gguf", outtype="f32")

    convert_checkpoint(honest, target, tmp_path / "honest.gguf", outtype="f32")
    with consistent_head_dim(angelslim) as (fixed, note):
        assert fixed != angelslim and "head_dim 16" in note and "32 wide" in note
        convert_checkpoint(fixed, target, tmp_path / "repaired.gguf", outtype="f32")
    assert not fixed.exists()                        # the temporary copy is gone
    assert json.loads((angelslim / "config.json").read_text())["head_dim"] == H // NH   # source untouched

    a, b = _tensors(tmp_path / "honest.gguf"), _tensors(tmp_path / "repaired.gguf")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    ha, hb = GGUFHeader(tmp_path / "honest.gguf"), GGUFHeader(tmp_path / "repaired.gguf")
    keys = [k for k in ha.kv if k.endswith(("key_length", "value_length", "rope.dimension_count"))]
    assert keys and all(ha.kv[k] == hb.kv[k] == WIDE for k in keys)


def test_inconsistent_weights_are_left_to_the_converter(checkpoints, tmp_path):
    _, angelslim = checkpoints
    odd = tmp_path / "odd"
    shutil.copytree(angelslim, odd)
    config = json.loads((odd / "config.json").read_text())
    config["num_key_value_heads"] = 1                # k_proj rows (2 x 32) no longer fit any width
    (odd / "config.json").write_text(json.dumps(config))
    assert weights_head_dim(odd) is None
    with consistent_head_dim(odd) as (fixed, note):
        assert fixed == odd and note is None


def test_pull_converts_the_angelslim_style_drafter(listing_hub, checkpoints, target, capsys):
    _, angelslim = checkpoints
    listing_hub.add("test/tiny-GGUF", "tiny-Q8_0.gguf", target.read_bytes())
    for f in ("config.json", "model.safetensors"):
        listing_hub.add("test/angelslim-eagle3", f, (angelslim / f).read_bytes())
    registry.user_catalog_path().write_text(
        'schema = 1\n[models.hd]\ndescription = "head_dim 16 in config, 32 in weights"\n'
        '[models.hd.target]\nrepo = "test/tiny-GGUF"\nfile = "tiny-Q8_0.gguf"\n'
        '[models.hd.draft]\nrepo = "test/angelslim-eagle3"\nfiles = ["config.json", "pytorch_model.bin"]\n',
        encoding="utf-8")
    assert main(["pull", "hd"]) == 0
    err = capsys.readouterr().err
    assert "pytorch_model.bin -> model.safetensors" in err
    assert "test/angelslim-eagle3: config.json says head_dim 16, but the attention weights are 32 wide" in err
    record = registry.load("hd")
    header = GGUFHeader(Path(record.drafter))
    assert any(k.endswith("attention.key_length") and v == WIDE for k, v in header.kv.items())
