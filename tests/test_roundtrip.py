"""Round trips: an eagle3 GGUF -> a checkpoint in every supported layout, written the way that
layout's own exporter writes it (:mod:`layout_writers`) -> ``convert`` -> the same drafter.

Required: identical tensors up to the checkpoint's dtype (the GGUF's weights rounded to fp16/bf16
are what the checkpoint holds; fc_norm weights are powers of two, so splitting them off fc and
folding them back is exact), identical d2t, target layers and flags, and identical drafts on real
prompts (per-cycle drafted/accepted counts and tokens through the engine). Also ``localspec
export``, which is the speculators/SpecForge writer as a command, and the no-absolute-path rule
for every GGUF localspec writes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from localspec.formats import gguf_consts as K  # noqa: E402
from localspec.converters.convert import convert_checkpoint  # noqa: E402
from localspec.converters.export import export_drafter  # noqa: E402
from localspec.converters.gguf_reader import read_drafter_gguf  # noqa: E402
from localspec.converters.gguf_writer import write_drafter_gguf  # noqa: E402
from localspec.runtime.engine import Engine, GenerationConfig  # noqa: E402
from localspec.core.errors import LocalspecError  # noqa: E402
from localspec.core.events import CycleEvent, DoneEvent  # noqa: E402
from localspec.llama.gguf_native import GGUFHeader  # noqa: E402
from localspec.core.paths import embedded_target  # noqa: E402
from localspec.speculation.policy import PolicyConfig  # noqa: E402

from layout_writers import EAGLE31_LAYOUTS, through_dtype, write_layout  # noqa: E402
from cli_run import run_cli  # noqa: E402
from tiny_models import build_target, drafter_weights  # noqa: E402

N_LAYER = 8
SHIPPED = Path(__file__).resolve().parent.parent / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"
PROMPTS = ["The quick brown fox jumps over the lazy", "def fibonacci(n):"]
CHAT_PROMPTS = [[{"role": "user", "content": "Write two sentences about the sea."}],
                [{"role": "user", "content": "List three prime numbers and explain why they are prime."}]]
EXPECTED_LAYOUT = {"safeailab": "specforge", "specforge": "specforge", "specforge-hf": "specforge",
                   "angelslim": "vllm", "vllm": "vllm", "speculators": "speculators", "speculators-tf5": "speculators",
                   "modelopt": "modelopt", "automodel-raw": "automodel", "automodel-sglang": "automodel",
                   "automodel-vllm": "automodel"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("roundtrip")
    target = build_target(d / "target.gguf", "noisy", n_layer=N_LAYER)
    subset = np.sort(np.random.default_rng(5).choice(49152, 700, replace=False))
    out = {"target": target}
    specs = {  # default layers of an 8-layer target: (2, 4, 5)
        "d31": dict(variant=K.VARIANT_EAGLE31, layers=(2, 4, 5)),
        "d3": dict(variant=K.VARIANT_EAGLE3, layers=(2, 4, 5)),
        "d3_ids": dict(variant=K.VARIANT_EAGLE3, layers=(1, 3, 6)),
    }
    for name, kw in specs.items():
        w = drafter_weights("random", d2t=subset, seed=len(name), **kw)
        out[name] = write_drafter_gguf(w, target, d / f"{name}.gguf", outtype="f16")
    return out


def fc_norm_split(weights, seed: int = 0, exponents: tuple[int, int] = (-2, 3)) -> np.ndarray | None:
    """Non-trivial fc_norm weights (powers of two: dividing them off fc is exact, short of fp16
    subnormals; weights <= 1 only scale fc up, which keeps fp16 exact too)."""
    if not weights.config.fc_norm:
        return None
    rng = np.random.default_rng(seed)
    return (2.0 ** rng.integers(*exponents, size=(3, weights.config.target_hidden_size))).astype(np.float32)


def assert_same_drafter(back, expected, *, extra_embd: np.ndarray | None = None) -> None:
    a, b = back.config, expected.config
    for field in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "rms_eps", "rope_theta",
                  "target_hidden_size", "target_layers", "vocab_size", "variant", "norm_before_fc",
                  "norm_before_residual", "fc_norm", "fc_norm_eps", "norm_output", "rope_freq_factors"):
        assert getattr(a, field) == getattr(b, field), (field, getattr(a, field), getattr(b, field))
    want = dict(expected.tensors)
    if extra_embd is not None and K.T_TOKEN_EMBD not in want:
        want[K.T_TOKEN_EMBD] = extra_embd
    assert sorted(back.tensors) == sorted(want)
    for name, data in want.items():
        assert back.tensors[name].shape == data.shape, name
        assert np.array_equal(back.tensors[name], data), f"{name} differs"
    assert np.array_equal(back.d2t, expected.d2t)


def draft_trace(target: Path, drafter: Path, prompts, max_tokens: int = 24) -> list:
    """Per prompt: the (drafted, accepted) of every cycle and the tokens, greedy, EAGLE drafts only."""
    cfg = GenerationConfig(max_tokens=max_tokens, policy=PolicyConfig("fixed", 4, p_min=0.0, source="eagle", tree="off"))
    out = []
    with Engine(target, drafter, n_ctx=512) as eng:
        for prompt in prompts:
            cycles, done = [], None
            for e in eng.generate(prompt, cfg):
                if isinstance(e, CycleEvent):
                    cycles.append((e.drafted, e.accepted))
                elif isinstance(e, DoneEvent):
                    done = e
            out.append((cycles, done.tokens))
    return out


def target_embeddings(target: Path) -> np.ndarray:
    from localspec.converters.gguf_reader import tensor_values
    return tensor_values(GGUFHeader(target), "token_embd.weight")


CASES = [
    # (layout, drafter, checkpoint dtype, weight file)
    ("safeailab", "d3", "float16", "bin"),
    ("specforge", "d31", "bfloat16", "safetensors"),
    ("specforge", "d3_ids", "float32", "bin"),
    ("specforge-hf", "d31", "bfloat16", "safetensors"),
    ("angelslim", "d3_ids", "bfloat16", "bin"),
    ("vllm", "d31", "float16", "safetensors"),
    ("speculators", "d31", "float16", "safetensors"),
    ("speculators", "d3_ids", "float32", "safetensors"),
    ("speculators-tf5", "d31", "bfloat16", "safetensors"),
    ("modelopt", "d3_ids", "bfloat16", "safetensors"),
    ("modelopt", "d3", "float16", "safetensors"),
    ("automodel-raw", "d31", "bfloat16", "safetensors"),
    ("automodel-sglang", "d31", "bfloat16", "safetensors"),
    ("automodel-vllm", "d31", "float16", "safetensors"),
]


@pytest.mark.parametrize("layout,drafter,dtype,weight_format", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]}" for c in CASES])
def test_roundtrip_tiny(layout, drafter, dtype, weight_format, tiny, tmp_path):
    target = tiny["target"]
    original = read_drafter_gguf(tiny[drafter])
    embd = target_embeddings(target) if layout.startswith("automodel") else None
    split = fc_norm_split(original)
    ckpt = write_layout(layout, original, tmp_path / "ckpt", dtype=dtype, weight_format=weight_format,
                        fc_norm_weights=split, target_n_layer=N_LAYER, target_embeddings=embd)
    out = tmp_path / "back.gguf"
    summary = convert_checkpoint(ckpt, target, out, outtype="f32")
    assert summary.layout == EXPECTED_LAYOUT[layout]
    assert summary.target_layers == original.config.target_layers
    if layout == "automodel-raw":
        assert any(f"num_hidden_layers={N_LAYER}" in w for w in summary.warnings), summary.warnings
    expected = through_dtype(original, dtype, split)
    back = read_drafter_gguf(out)
    extra = through_dtype(type(original)(original.config, {K.T_TOKEN_EMBD: embd}, None), dtype).tensors[K.T_TOKEN_EMBD] \
        if embd is not None else None
    assert_same_drafter(back, expected, extra_embd=extra)
    # identical drafts: the rounded original (as a GGUF) against the round trip
    ref = write_drafter_gguf(expected, target, tmp_path / "ref.gguf", outtype="f32")
    assert draft_trace(target, out, PROMPTS) == draft_trace(target, ref, PROMPTS)


def test_automodel_training_checkpoint_directory(tiny, tmp_path):
    """Automodel's checkpointer nests the drafter as epoch_E_step_S/model/consolidated/; the recipe's
    eagle3_meta.pt beside draft_model.pt is not a weight file."""
    original = read_drafter_gguf(tiny["d31"])
    step = tmp_path / "epoch_0_step_100"
    write_layout("automodel-raw", original, step / "model" / "consolidated", dtype="bfloat16", target_n_layer=N_LAYER,
                 target_embeddings=target_embeddings(tiny["target"]))
    summary = convert_checkpoint(step, tiny["target"], tmp_path / "a.gguf")
    assert summary.layout == "automodel" and summary.target_layers == (2, 4, 5)
    assert _strings(tmp_path / "a.gguf")[K.KEY_LS_SOURCE] == "epoch_0_step_100"
    legacy = tmp_path / "legacy"
    write_layout("automodel-raw", original, legacy, dtype="bfloat16", weight_format="bin", target_n_layer=N_LAYER,
                 target_embeddings=target_embeddings(tiny["target"]))
    (legacy / "pytorch_model.bin").rename(legacy / "draft_model.pt")
    torch.save({"selected_token_ids": torch.arange(700)}, legacy / "eagle3_meta.pt")
    assert convert_checkpoint(legacy, tiny["target"], tmp_path / "b.gguf").layout == "automodel"


def test_layer_ids_follow_each_tools_convention(tiny, tmp_path):
    """The ids each layout writes for target layers (1, 3, 6), and that they come back the same."""
    original = read_drafter_gguf(tiny["d3_ids"])
    written = {}
    for layout in ("specforge", "angelslim", "speculators", "modelopt"):
        ckpt = write_layout(layout, original, tmp_path / layout, dtype="float32", target_n_layer=N_LAYER)
        cfg = json.loads((ckpt / "config.json").read_text())
        written[layout] = cfg.get("eagle_aux_hidden_state_layer_ids") or cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        assert convert_checkpoint(ckpt, tiny["target"], tmp_path / f"{layout}.gguf").target_layers == (1, 3, 6)
    assert written == {"specforge": [0, 2, 5], "angelslim": [1, 3, 6], "speculators": [1, 3, 6], "modelopt": [0, 2, 5]}


# ---------------------------------------------------------------------------------------------
# localspec export: the same writers as a command
# ---------------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    """The command in this process (fd 1 and 2 captured), as ``localspec ARGS`` prints it."""
    return run_cli(*args, env={**__import__("os").environ, "COLUMNS": "150"})


def _gguf_tensor_bytes(path: Path) -> dict[str, tuple[str, bytes]]:
    h = GGUFHeader(path)
    out = {}
    with open(path, "rb") as fh:
        for name, (_, kind, size, offset) in h.tensors.items():
            fh.seek(offset)
            out[name] = (GGUFHeader.type_name(kind), fh.read(size))
    return out


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_export_then_convert_is_the_same_gguf(fmt, tiny, tmp_path):
    src = tiny["d31"]
    out = tmp_path / "exported"
    verifier = ["--verifier", "HuggingFaceTB/SmolLM2-135M"] if fmt == "speculators" else []
    r = _cli("export", str(src), "--format", fmt, "-o", str(out), *verifier)
    assert r.returncode == 0, r.stderr
    assert "config.json" in r.stdout and "model.safetensors" in r.stdout
    assert ("vllm serve" if fmt == "speculators" else "--speculative-algorithm EAGLE3") in r.stdout
    cfg = json.loads((out / "config.json").read_text())
    if fmt == "speculators":
        # what vLLM's update_eagle3 reads (vllm/transformers_utils/configs/speculators/algos.py)
        for key in ("speculators_model_type", "transformer_layer_config", "draft_vocab_size", "target_hidden_size",
                    "norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
                    "eagle_aux_hidden_state_layer_ids", "speculators_config"):
            assert key in cfg, key
        # every key is a field of speculators 0.9.0's Eagle3SpeculatorConfig / SpeculatorModelConfig (read
        # from its wheel: the package itself needs transformers 5, datasets, torchvision, ...)
        fields = {"speculators_model_type", "speculators_version", "speculators_config", "architectures",
                  "transformer_layer_config", "draft_vocab_size", "norm_before_residual", "target_hidden_size",
                  "eagle_aux_hidden_state_layer_ids", "norm_before_fc", "fc_norm", "norm_output", "embed_requires_grad"}
        assert set(cfg) <= fields, set(cfg) - fields
        sc = cfg["speculators_config"]
        assert set(sc) <= {"algorithm", "proposal_methods", "default_proposal_method", "verifier"}
        assert set(sc["proposal_methods"][0]) <= {"proposal_type", "speculative_tokens", "verifier_accept_k",
                                                  "accept_tolerance"}
        assert set(sc["verifier"]) <= {"name_or_path", "architectures"}
        assert cfg["speculators_model_type"] == "eagle3" and cfg["transformer_layer_config"]["model_type"] == "llama"
        assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
        assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and cfg["fc_norm"] and cfg["norm_output"]
    else:
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
        assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
        assert cfg["fc_norm"] and cfg["norm_output"] and cfg["draft_vocab_size"] == 700
    from safetensors import safe_open
    with safe_open(str(out / "model.safetensors"), framework="numpy") as f:
        names = set(f.keys())
        assert np.all(f.get_tensor("fc_norm.0.weight") == 1.0)       # folded into fc: unit weights
        d2t = f.get_tensor("d2t")
        assert d2t.dtype == np.int64 and not np.array_equal(d2t, read_drafter_gguf(src).d2t)  # offsets
    layer = "layers.0." if fmt == "speculators" else "midlayer."
    assert {f"{layer}self_attn.q_proj.weight", "fc.weight", "lm_head.weight", "t2d"} <= names
    back = tmp_path / "back.gguf"
    r = _cli("convert", str(out), "--target", str(tiny["target"]), "-o", str(back), "--outtype", "f16")
    assert r.returncode == 0, r.stderr
    assert _gguf_tensor_bytes(back) == _gguf_tensor_bytes(src)
    assert draft_trace(tiny["target"], back, PROMPTS) == draft_trace(tiny["target"], src, PROMPTS)


def test_export_refusals(tiny, tmp_path):
    out = tmp_path / "dir"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    # speculators' loader reads the verifier's config and weights from its name: none, no export
    r = _cli("export", str(tiny["d3"]), "--format", "speculators", "-o", str(tmp_path / "nov"))
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "Error: --format speculators needs --verifier (the target's Hub id or local directory): "
        "speculators' loader reads the target's config and weights from it"]
    assert not (tmp_path / "nov").exists()
    r = _cli("export", str(tiny["d3"]), "--format", "speculators", "-o", str(out), "--verifier", "t")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [f"Error: {out} exists and is not empty (use --force to replace it)"]
    assert (out / "keep.txt").read_text() == "mine"
    r = _cli("export", str(tiny["target"]), "--format", "specforge", "-o", str(tmp_path / "x"))
    assert r.returncode == 1 and "not an EAGLE-3 drafter" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
    r = _cli("export", str(tiny["d3"]), "--format", "nope", "-o", str(tmp_path / "y"))
    assert r.returncode == 2
    # SpecForge/SGLang ids are layer outputs: a drafter reading layer 0's input cannot be written
    w = read_drafter_gguf(tiny["d3_ids"])
    w.config.target_layers = (0, 3, 6)
    g = write_drafter_gguf(w, tiny["target"], tmp_path / "l0.gguf", outtype="f16")
    with pytest.raises(LocalspecError, match="export --format speculators instead"):
        export_drafter(g, tmp_path / "z", "specforge")
    assert not (tmp_path / "z").exists()
    r = _cli("export", str(tiny["d3"]), "--format", "speculators", "-o", str(out), "--force", "--verifier", "t")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_export_keeps_quantized_values_exact(tiny, tmp_path):
    """A Q8_0 drafter exports as float32 holding exactly the dequantized values; converting back to
    q8_0 gives the same blocks."""
    q8 = tmp_path / "q8.gguf"
    write_drafter_gguf(read_drafter_gguf(tiny["d31"]), tiny["target"], q8, outtype="q8_0")
    export_drafter(q8, tmp_path / "ck", "speculators", verifier="HuggingFaceTB/SmolLM2-135M")
    back = tmp_path / "back.gguf"
    convert_checkpoint(tmp_path / "ck", tiny["target"], back, outtype="q8_0")
    assert _gguf_tensor_bytes(back) == _gguf_tensor_bytes(q8)


# ---------------------------------------------------------------------------------------------
# the shipped drafter (slower: the real SmolLM2 target, real prompts)
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_roundtrip_shipped_drafter(tmp_path):
    target = embedded_target()
    original = read_drafter_gguf(SHIPPED)
    assert original.config.fc_norm and original.config.norm_output and original.config.target_layers == (2, 15, 27)
    embd = target_embeddings(target)
    baseline = draft_trace(target, SHIPPED, CHAT_PROMPTS, max_tokens=32)
    assert sum(a for cycles, _ in baseline for _, a in cycles) > 0, "the shipped drafter should have drafts accepted"
    for layout in EAGLE31_LAYOUTS:
        ckpt = write_layout(layout, original, tmp_path / layout, dtype="float32", target_n_layer=30,
                            fc_norm_weights=fc_norm_split(original, seed=1, exponents=(-2, 1)),
                            target_embeddings=embd if layout.startswith("automodel") else None)
        out = tmp_path / f"{layout}.gguf"
        summary = convert_checkpoint(ckpt, target, out, outtype="f16")
        assert summary.target_layers == (2, 15, 27), layout
        got, want = _gguf_tensor_bytes(out), _gguf_tensor_bytes(SHIPPED)
        if layout.startswith("automodel"):
            got.pop(K.T_TOKEN_EMBD)   # Automodel always saves the (target's) embeddings
        assert got == want, layout
        if layout in ("specforge", "speculators", "automodel-raw"):
            assert draft_trace(target, out, CHAT_PROMPTS, max_tokens=32) == baseline, layout


# ---------------------------------------------------------------------------------------------
# provenance: no GGUF localspec writes records a local path
# ---------------------------------------------------------------------------------------------
def _strings(path: Path) -> dict[str, str]:
    return {k: v for k, v in GGUFHeader(path).kv.items() if isinstance(v, str) and not k.startswith("tokenizer.")}


def assert_no_paths(path: Path, *needles: str) -> None:
    for key, value in _strings(path).items():
        assert not value.startswith(("/", "~")) and "\\" not in value, (key, value)
        for needle in needles:
            assert needle not in value, (key, value)


def test_no_absolute_paths_in_written_ggufs(tiny, tmp_path):
    from localspec.formats.quantize import requantize
    from localspec.train.export import export_gguf
    from localspec.converters.reference import EagleReference

    original = read_drafter_gguf(tiny["d31"])
    ckpt = write_layout("specforge", original, tmp_path / "my-ckpt", dtype="float32", target_n_layer=N_LAYER)
    out = tmp_path / "converted.gguf"
    convert_checkpoint(ckpt, tiny["target"], out)
    assert _strings(out)[K.KEY_LS_SOURCE] == "my-ckpt"
    assert_no_paths(out, str(tmp_path))
    # a single weight file: its base name
    out_file = tmp_path / "file.gguf"
    convert_checkpoint(ckpt / "model.safetensors", tiny["target"], out_file)
    assert _strings(out_file)[K.KEY_LS_SOURCE] == "model.safetensors"
    assert_no_paths(out_file, str(tmp_path))
    # what `localspec train` writes
    cfg = original.config
    ref = EagleReference(cfg, draft_vocab=len(original.d2t))
    trained = tmp_path / "trained.gguf"
    export_gguf(ref.state_dict(), cfg, tiny["target"], trained, tmp_path / "work")
    assert_no_paths(trained, str(tmp_path))
    # llama.cpp's quantizer keeps the metadata it is given
    quantized = tmp_path / "q.gguf"
    requantize(out, quantized, "q8_0")
    assert_no_paths(quantized, str(tmp_path))
    # the shipped drafter
    assert_no_paths(SHIPPED, "/work", "/home")


def test_hub_cache_source_records_repo_and_revision(tiny, tmp_path):
    original = read_drafter_gguf(tiny["d3"])
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "hub" / "models--someone--tiny-eagle3" / "snapshots" / commit
    write_layout("speculators", original, snap, dtype="float32", target_n_layer=N_LAYER)
    out = tmp_path / "d.gguf"
    convert_checkpoint(snap, tiny["target"], out)
    s = _strings(out)
    assert s[K.KEY_LS_SOURCE] == "someone/tiny-eagle3" and s[K.KEY_LS_SOURCE_REVISION] == commit
    r = _cli("inspect", "--json", str(out))
    desc = json.loads(r.stdout)
    assert desc["source"] == "someone/tiny-eagle3" and desc["source_revision"] == commit


# ---------------------------------------------------------------------------------------------
# what convert and inspect say about runtimes
# ---------------------------------------------------------------------------------------------
def test_runtime_statement(tiny, tmp_path):
    r = _cli("inspect", str(tiny["d31"]))
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "needs localspec's runtime" in flat and "2-8%" in flat and "not stock llama.cpp" in flat
    r = _cli("inspect", "--json", str(tiny["d3"]))
    desc = json.loads(r.stdout)
    assert desc["runs_exactly_on"].startswith("localspec; stock llama.cpp")
    assert "needs localspec's runtime" not in _cli("inspect", str(tiny["d3"])).stdout
    original = read_drafter_gguf(tiny["d31"])
    ckpt = write_layout("speculators", original, tmp_path / "ck", dtype="float32", target_n_layer=N_LAYER)
    r = _cli("convert", str(ckpt), "--target", str(tiny["target"]), "-o", str(tmp_path / "o.gguf"))
    assert r.returncode == 0, r.stderr
    assert "needs localspec's runtime" in " ".join(r.stdout.split())
