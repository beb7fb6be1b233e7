"""localspec fit: plans checked against what llama.cpp allocates on the CPU, budgets, placement, CLI.

Tolerance: weights (mapped + CPU_REPACK buffers) within 2% + 1 MiB of llama.cpp's model buffers;
KV within 1% + 64 KiB of its KV buffers; compute exactly llama.cpp's own reserve figure (within
1% + 64 KiB); the load-time total within 3%.
"""

from __future__ import annotations

import json
import re
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from localspec.core.units import parse_size
from localspec.memory import planner
from localspec.memory.pair import plan_engine
from localspec.memory.live import memory_report
from localspec.formats import gguf_consts as K
from localspec.runtime.engine import Engine
from localspec.core.errors import LocalspecError
from localspec.formats.gguf_info import read_gguf
from localspec.store.models import ModelSpec

sys.path.insert(0, str(Path(__file__).parent))
from cli_run import run_cli  # noqa: E402
from tiny_models import build_drafter, build_target, drafter_weights, unit_embeddings  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("fit_tiny")
    t = build_target(d / "t.gguf", "random")
    return t, build_drafter(d / "d.gguf", t, "random")


@pytest.fixture(scope="module")
def real_pair(tmp_path_factory):
    """The default target (Q4_0, derived once) and a small drafter made for it (own embeddings and head)."""
    from localspec.converters.gguf_writer import write_drafter_gguf
    from localspec.store.models import default_target

    d = tmp_path_factory.mktemp("fit_real")
    os.environ.setdefault("LOCALSPEC_HOME", str(d))
    target = default_target()
    info = read_gguf(target)
    w = drafter_weights("random", target_hidden=info.n_embd, layers=(2, info.n_layer // 2, info.n_layer - 3))
    w.tensors[K.T_TOKEN_EMBD] = unit_embeddings(info.n_vocab).astype(np.float16)
    w.tensors[K.T_OUTPUT] = unit_embeddings(info.n_vocab, 3).astype(np.float16)
    return target, write_drafter_gguf(w, target, d / "drafter.gguf", outtype="f32")


def _check_against_llama(target, drafter, n_ctx):
    spec = ModelSpec("t", Path(target), Path(drafter))
    options = plan_engine(spec, n_ctx=n_ctx, n_threads=1)
    plan = options["memory_plan"]
    assert plan.fits and plan.n_ctx == n_ctx
    with Engine(target, drafter, n_threads=1, **options) as engine:
        report = memory_report(engine)
    actual, planned = report["actual"], report["planned"]
    for role in ("target", "drafter"):
        a, p = actual[role], planned[role]
        assert abs(a["weights_bytes"] - p["weights_bytes"]) <= 0.02 * p["weights_bytes"] + MiB, (role, a, p)
        assert abs(a["kv_bytes"] - p["kv_bytes"]) <= 0.01 * p["kv_bytes"] + 64 * 1024, (role, a, p)
        assert abs(a["compute_bytes"] - p["compute_bytes"]) <= 0.01 * p["compute_bytes"] + 64 * 1024, (role, a, p)
    # load-time buffers (the logits buffers grow later with the verify batch; they are planned on top)
    load_planned = sum(planned[r]["weights_bytes"] + planned[r]["kv_bytes"] + planned[r]["compute_bytes"]
                       for r in ("target", "drafter"))
    load_actual = sum(actual[r]["weights_bytes"] + actual[r]["kv_bytes"] + actual[r]["compute_bytes"]
                      for r in ("target", "drafter"))
    assert abs(load_actual - load_planned) <= 0.03 * load_planned
    return plan, report


def test_tiny_plan_matches_llama_cpp(tiny_pair):
    _check_against_llama(*tiny_pair, 2048)


@pytest.mark.parametrize("mmap", ["1", "0"])
def test_real_plan_matches_llama_cpp(real_pair, mmap, monkeypatch):
    """Mapped (LOCALSPEC_MMAP=1) Q4_0 weights are repacked into a second CPU copy on AVX2 / NEON
    CPUs; read into memory (the default on Linux) each repacked tensor is held once."""
    monkeypatch.setenv("LOCALSPEC_MMAP", mmap)
    plan, report = _check_against_llama(*real_pair, 2048)
    read = mmap == "0" and sys.platform.startswith("linux")
    assert plan.target.weights_bytes == planner.layout(read_gguf(real_pair[0])).weights_bytes
    if read:
        assert plan.target.repack_bytes == 0
    else:
        assert plan.target.repack_bytes > 0
    assert report["actual"]["target"]["kv_bytes"] == 30 * 2048 * 2 * 192 * 2  # 30 layers, 3 kv heads x 64, f16


def _layouts(pair):
    t, d = (planner.layout(read_gguf(p), {"avx2": True}) for p in pair)
    return t, d


def _fake_compute(n_ctx, kv, ngl, dngl):
    return 8 * MiB, 4 * MiB


def test_monotonic_in_budget_and_drafter_first(real_pair):
    t, d = _layouts(real_pair)
    ram = [planner.DeviceBudget("CPU", 64 << 30)]
    last = (-1, -1)
    for vram_mib in range(0, 1200, 25):
        devices = ram + [planner.DeviceBudget("GPU", vram_mib * MiB, True)]
        p = planner.plan_memory(t, d, devices, _fake_compute, n_ctx=2048, margins={"CPU": 0, "GPU": 0})
        assert p.fits
        placed = (p.drafter.gpu_layers, p.target.gpu_layers)
        assert placed[0] >= last[0] and placed[1] >= last[1], (vram_mib, placed, last)
        if p.target.gpu_layers > 0:
            assert p.drafter.gpu_layers == d.n_units  # the drafter went to the GPU first
        gpu = next(x for x in p.devices if x.is_gpu)
        assert gpu.used_bytes <= gpu.budget_bytes
        last = placed
    assert last == (d.n_units, t.n_units)


def test_ram_budget_degrades_kv_then_context(real_pair):
    t, d = _layouts(real_pair)
    full = planner.plan_memory(t, d, [planner.DeviceBudget("CPU", 64 << 30)], _fake_compute, n_ctx_max=8192,
                    margins={"CPU": 0})
    assert full.fits and full.n_ctx == 8192 and full.kv_type == "f16"
    tight = planner.plan_memory(t, d, [planner.DeviceBudget("CPU", full.total_bytes - 50 * MiB)], _fake_compute,
                     n_ctx_max=8192, margins={"CPU": 0})
    assert tight.fits and tight.total_bytes <= full.total_bytes - 50 * MiB
    assert (tight.kv_type, tight.n_ctx) != ("f16", 8192)


def test_impossible_budget(real_pair):
    t, d = _layouts(real_pair)
    p = planner.plan_memory(t, d, [planner.DeviceBudget("CPU", 10 * MiB), planner.DeviceBudget("GPU", 10 * MiB, True)],
                 _fake_compute)
    assert not p.fits and "needs" in p.reason and p.total_bytes > 10 * MiB


def test_parse_size():
    assert parse_size("12G") == 12 << 30
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("800M") == 800 * MiB
    assert parse_size("4096") == 4096
    for bad in ("12XB", "", "G", "-1G"):
        with pytest.raises(LocalspecError):
            parse_size(bad)


def _cli(*args):
    return run_cli(*args)


def test_cli_fit_json(real_pair):
    target, drafter = real_pair
    r = _cli("fit", "--target", str(target), "--draft", str(drafter), "--vram", "1G", "--ram", "4G", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("fits", "budget_bytes", "total_bytes", "n_ctx", "kv_type", "draft_max"):
        assert key in out
    for role in ("target", "drafter"):
        for key in ("weights_bytes", "kv_bytes", "gpu_layers"):
            assert key in out[role]
    assert out["fits"] and out["drafter"]["gpu_layers"] == 2

    r = _cli("fit", "--target", str(target), "--ram", "20M", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["fits"] is False

    for bad in (["--vram", "12XB"], ["--target", "/no/such.gguf"]):
        r = _cli("fit", *bad)
        assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and r.stderr.startswith("Error:")


def test_cli_fit_table_heads_with_the_default_depth_and_one_offload_wording(real_pair):
    target, drafter = real_pair
    wide = {**os.environ, "COLUMNS": "250"}
    r = run_cli("fit", "--target", str(target), "--draft", str(drafter), "--vram", "1G", "--ram", "4G", env=wide)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "draft-max auto / 16" in text and "draft-max 4" not in text
    assert re.search(r"\d+/\d+ layers on the GPU", text), text
    r = run_cli("fit", "--target", str(target), "--draft", str(drafter), "--ram", "4G", "--draft-max", "6", env=wide)
    assert "draft-max 6" in " ".join(r.stdout.split())
