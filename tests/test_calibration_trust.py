"""A cached calibration that is wrong is corrected on a real engine (tiny GGUF models built here):
one calibrated under load (every figure 3x), a corrupted one (V(4) tiny, V(8) huge, not
monotone) and one of absurd values; and no number printed with --json is NaN or Infinity."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from localspec import CycleEvent, DoneEvent, Engine, GenerationConfig, Message
from localspec.core.paths import user_dir
from localspec.speculation import cost_measure, costmodel
from localspec.speculation.cost_cache import file_key, machine_key
from engine_checks import seed_calibration
from tiny_models import build_target

# the suite turns background calibrations off elsewhere (conftest); each test here needs one cached,
# whatever the other test worker does meanwhile (patient_calibration)
pytestmark = pytest.mark.usefixtures("background_calibration", "patient_calibration")

CTX = 256   # calibrated up to 96 rows; one explicit thread: one cache key whatever the load


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_target(tmp_path_factory.mktemp("trust") / "t.gguf", "repeat")


def generate(engine: Engine) -> DoneEvent:
    events = list(engine.generate("Hello world", GenerationConfig(max_tokens=64)))
    assert isinstance(events[-1], DoneEvent)
    return events[-1]


def cached(key: str) -> dict[int, float]:
    entry = json.loads((user_dir() / "calibration.json").read_text())["entries"][key]
    return {int(b): sec for b, sec in entry["verify"].items()}


def write_entry(key: str, verify: dict) -> None:
    cache = user_dir() / "calibration.json"
    data = json.loads(cache.read_text())
    data["entries"][key]["verify"] = {str(b): sec for b, sec in verify.items()}
    cache.write_text(json.dumps(data))


def calibrated_key(target) -> tuple[str, dict[int, float]]:
    """The engine's cache key and its calibration, cached (also when a busy machine made the
    calibration run past its time budget, which is then not cached by itself)."""
    with Engine(target, n_ctx=CTX, n_threads=1) as engine:
        cm = engine.cost_model()
        costmodel.CostModel({int(b): v for b, v in cm.live()["verify"].items()}, key=cm.key,
                            cache=user_dir() / "calibration.json").save()
        key = cm.key
    return key, cached(key)


def within(x: float, y: float, factor: float) -> bool:
    return abs(math.log(x / y)) <= math.log(factor)


COPY = [Message("user", "Repeat the following line five times: the quick brown fox jumps over the lazy dog")]


def timed_verifies(engine: Engine, prompt=COPY) -> list[tuple[int, float]]:
    """(rows, seconds) of each target verify of one generation, in order."""
    out, seen = [], {}
    for event in engine.generate(prompt, GenerationConfig(max_tokens=64)):
        if isinstance(event, CycleEvent):
            now = {b: tuple(v) for b, v in event.stats.verify_by_batch.items()}
            for b, (n, seconds) in now.items():
                n0, s0 = seen.get(b, (0, 0.0))
                if n > n0:
                    out.append((b, seconds - s0))
            seen = now
    return out


def test_a_calibration_taken_under_load_follows_live_timings_and_is_written_back(smollm2):
    """On the real model (the tiny ones decode in a fraction of a millisecond: on a busy machine
    their timings are the scheduler's)."""
    key, truth = calibrated_key(smollm2)
    write_entry(key, {b: 3 * sec for b, sec in truth.items()})   # calibrated while 3x slower
    with Engine(smollm2, n_ctx=CTX, n_threads=1) as engine:
        cm = engine.cost_model()
        assert cm.verify(1) == pytest.approx(3 * truth[1])
        verifies = [v for _ in range(3) for v in timed_verifies(engine)]
        # every band of sizes verified lately (1, 2-3, 4-7, ...) is priced within 2x of the median
        # of its last verifies (one verify on a busy machine can take any time)
        bands: dict[int, list[float]] = {}
        for b, seconds in verifies[-40:]:
            bands.setdefault(costmodel._band(b), []).append(seconds / cm.verify(b))
        checked = [cost_measure.median(r) for r in bands.values() if len(r) >= 3]
        assert checked and all(within(m, 1.0, 2.0) for m in checked), bands
        level = cm.verify(1)
    saved = cached(key)                      # written back at close: the live figures, not 3x
    assert saved[1] == pytest.approx(level, rel=0.01) and cost_measure.check_curve(saved) is None


@pytest.mark.parametrize("damage", ["corrupted", "absurd"])
def test_a_cached_curve_that_cannot_be_a_measurement_is_calibrated_again(target, damage, capsys):
    key, truth = calibrated_key(target)
    if damage == "corrupted":                # V(4) tiny, V(8) huge: not monotone
        bad = truth | {4: truth[4] / 50, 8: truth[8] * 50}
    else:
        bad = {b: 1e308 for b in truth}
    write_entry(key, bad)
    capsys.readouterr()
    with Engine(target, n_ctx=CTX, n_threads=1, verbose=True) as engine:
        cm = engine.cost_model()
        assert "is not a plausible" in capsys.readouterr().err       # dropped, and why (--verbose)
        assert cost_measure.check_curve({b: cm.verify(b) for b in truth}) is None
        assert cm.verify(8) != pytest.approx(bad[8]) and cm.verify(4) != pytest.approx(bad[4])
        generate(engine)
    saved = cached(key)                      # the fresh calibration replaced it
    assert cost_measure.check_curve(saved) is None and saved[8] != pytest.approx(bad[8])


def strict_json(text: str) -> dict:
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ})


@pytest.mark.parametrize("value", [1e308, float("nan"), "fast"])
def test_json_output_is_strict_json_whatever_the_cache_holds(target, tmp_path, value):
    """--json is read by programs: a cache of absurd figures (NaN and Infinity written as Python's
    json writes them) is dropped and calibrated again, and what is printed parses as strict JSON."""
    key = "|".join((machine_key(1, 0), "kv=f16", file_key(target), file_key(None)))   # the CLI's (1 thread)
    cache = user_dir() / "calibration.json"
    seed_calibration(cache, key)
    data = json.loads(cache.read_text())
    for entry in data["entries"].values():
        entry["verify"] = {b: value for b in entry["verify"]}
        entry["drafter_step"] = value
    cache.write_text(json.dumps(data))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    for args in (("generate", "--target", str(target), "-p", "hi", "--raw", "-n", "8", "--json"),
                 ("bench", "--target", str(target), "--prompts", str(prompts), "-n", "4", "--json")):
        proc = cli(*args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        out = strict_json(proc.stdout.strip().splitlines()[-1])
        if args[0] == "bench":
            assert out["calibration"]["verify_ms"] and all(0 < ms < 1e5 for ms in out["calibration"]["verify_ms"])
    # dropped at the first read; calibrated again, finite (or, if the machine was too busy to
    # trust that calibration, not cached at all)
    entries = json.loads(cache.read_text())["entries"]
    assert entries.get(key, {}).get("drafter_step") != value
    for entry in entries.values():
        assert cost_measure.check_curve({int(b): v for b, v in entry["verify"].items()}) is None


def test_non_finite_figures_print_as_null():
    from localspec.core import jsonout
    text = jsonout.dumps({"rate": float("inf"), "x": [1.0, float("nan"), {"y": -float("inf")}], "ok": 2.5})
    assert strict_json(text) == {"rate": None, "x": [1.0, None, {"y": None}], "ok": 2.5}
