"""GPU-shaped costs: the curves measured on an H200 (tests/data/gpu_costs_h200.json, made by
bench/gpu_costs.py, docs/gpu.md) fed to the cost model and the policy, and the bench itself run on
this CPU with a tiny random model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from localspec.speculation.costmodel import CostModel
from localspec.speculation.policy import EAGLE, DraftPolicy, PolicyConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "tests" / "data" / "gpu_costs_h200.json").read_text())
ROWS = list(range(1, 17)) + [24, 32, 48, 64, 96, 128]
TARGETS = ["smollm2-135m/Q4_0", "smollm2-135m/F16", "llama3-8b/Q4_0", "llama3-8b/Q4_K_M", "llama3-8b/F16"]
DRAFTERS = {"smollm2-135m": "drafter-135m/F16", "llama3-8b": "drafter-8b/F16"}
# test_costmodel.py's CPU curve (SmolLM2-135M Q4_0, 2 cores), seconds
CPU = {1: 0.005, 2: 0.0087, 3: 0.0105, 4: 0.010, 5: 0.016, 6: 0.018, 7: 0.016, 8: 0.014, 9: 0.015,
       12: 0.019, 16: 0.022, 24: 0.032, 32: 0.040, 48: 0.058, 64: 0.075, 96: 0.110, 128: 0.145}


def gpu_seconds(label: str, fa: str = "fa_on") -> dict[int, float]:
    return {int(k): ms / 1e3 for k, ms in DATA["models"][label][fa]["verify_ms"].items()}


def test_the_h200_file_holds_every_curve():
    assert set(DATA["models"]) == set(TARGETS) | set(DRAFTERS.values())
    assert "H200" in DATA["machine"]["gpu"] and "CUDA" in DATA["machine"]["system_info"]
    for label in DATA["models"]:
        for fa in ("fa_on", "fa_off"):
            run = DATA["models"][label][fa]
            assert sorted(int(k) for k in run["verify_ms"]) == ROWS
            assert all(0 < ms < 100 for ms in run["verify_ms"].values())
            assert {(s, r) for s, r, _ in run["multi_seq_ms"]} == {(s, r) for s in (1, 2, 4, 8, 16) for r in (1, 5, 9)}
            assert {(d, r) for d, r, _ in run["depth_ms"]} == {(d, r) for d in (1024, 4096) for r in (1, 8)}


@pytest.mark.parametrize("label", ["llama3-8b/Q4_0", "llama3-8b/Q4_K_M", "llama3-8b/F16"])
def test_rows_are_nearly_free_on_the_gpu_and_not_on_the_cpu(label):
    gpu = CostModel(gpu_seconds(label))
    cpu = CostModel(CPU)
    # on the H200 a verify of 16 rows costs about 2 one-token steps of an 8B model, 64 rows under 3.5;
    # on the 2-core CPU 16 rows cost 4.4 steps and 64 rows 15
    assert gpu.verify(16) / gpu.verify(1) < 2.3 < cpu.verify(16) / cpu.verify(1)
    assert gpu.verify(64) / gpu.verify(1) < 3.5 < cpu.verify(64) / cpu.verify(1)


@pytest.mark.parametrize("label", ["llama3-8b/Q4_0", "llama3-8b/Q4_K_M", "llama3-8b/F16"])
def test_a_batch_of_sequences_costs_what_its_total_rows_cost(label):
    """What issue 26's scheduler may rely on: S slots of r rows in one decode cost what one
    sequence of S*r rows costs (measured for S up to 16, r = 1, 5, 9: 1+k for k = 0, 4, 8)."""
    run = DATA["models"][label]["fa_on"]
    cm = CostModel({int(k): ms for k, ms in run["verify_ms"].items()})
    for seqs, rows, ms in run["multi_seq_ms"]:
        assert 0.9 < ms / cm.verify(seqs * rows) < 1.2, (seqs, rows)


@pytest.mark.parametrize("label", TARGETS)
def test_gpu_curves_make_the_policy_draft_where_the_cpu_curve_does_not(label):
    """From the drafter's prior alone (no acceptance learned yet), with the drafter step measured
    for a drafter of the target's width (about a tenth of a target step on the H200; the CPU
    curve gets the same ratio): the CPU curve keeps decoding plain, every H200 curve drafts 2+."""
    drafter = gpu_seconds(DRAFTERS[label.split("/")[0]])[1]

    def plan(curve: dict[int, float], step: float) -> tuple:
        return DraftPolicy(PolicyConfig(), CostModel(curve, drafter_step=step), eagle=True).plan(16, backlog=1)

    gpu = gpu_seconds(label)
    assert drafter < 0.12 * gpu[1]
    assert plan(CPU, CPU[1] * drafter / gpu[1]) == (None, 0)
    source, depth = plan(gpu, drafter)
    assert source == EAGLE and depth >= 2


def test_the_bench_measures_a_tiny_model_on_this_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_costs", ROOT / "bench" / "gpu_costs.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    f16, q4 = tmp_path / "t-f16.gguf", tmp_path / "t-q4_0.gguf"
    bench.main(["make", "--shape", "tiny", "--out", str(f16), "--q4_0", str(q4), "--threads", "1"])
    out = tmp_path / "costs.json"
    for model in (f16, q4):
        bench.main(["measure", "--model", str(model), "--rows", "1-3,8", "--seqs", "1,2", "--seq-rows", "1,3",
                    "--depths", "64", "--reps", "2", "--threads", "1", "--flash-attn", "on,off",
                    "--json", str(out)])
    data = json.loads(out.read_text())
    assert set(data["models"]) == {"t-f16", "t-q4_0"}
    entry = data["models"]["t-q4_0"]
    assert entry["n_layer"] == 2 and entry["desc"].endswith("Q4_0") and data["models"]["t-f16"]["desc"].endswith("F16")
    for fa in ("fa_on", "fa_off"):
        run = entry["runs"][fa]
        assert list(run["verify_ms"]) == ["1", "2", "3", "8"] and all(ms > 0 for ms in run["verify_ms"].values())
        assert [(m["seqs"], m["rows_per_seq"], m["total_rows"]) for m in run["multi_seq"]] == [
            (1, 1, 1), (1, 3, 3), (2, 1, 2), (2, 3, 6)]
        assert [(d["depth"], d["rows"]) for d in run["depth"]] == [(64, 1), (64, 8)]
    with pytest.raises(SystemExit):
        bench.main(["measure", "--model", str(q4), "--rows", "0", "--json", str(out)])
