"""No request waits for a calibration: on a fresh LOCALSPEC_HOME the cost model is measured in the
background while the engine is idle (localspec.runtime.calibrator), a generation that arrives
meanwhile takes the engine back at the calibration's next decode and plans with a guess, and the
calibration completes (and is cached) once the engine is idle again.

The real SmolLM2-135M target (F16, as shipped) with a small context: its calibration takes long
enough (seconds of decodes) that a request reliably arrives in the middle of it."""

from __future__ import annotations

import json
import threading
import time

import pytest

from localspec import DoneEvent, Engine, GenerationConfig, TokenEvent
from localspec.core.errors import LocalspecError
from localspec.core.paths import user_dir
from localspec.speculation import cost_measure
from localspec.speculation.policy import PolicyConfig

pytestmark = pytest.mark.usefixtures("background_calibration")   # the suite turns it off elsewhere (conftest)

CTX = 96   # calibrated up to 48 rows (a short calibration: seconds)


def _recording(engine: Engine) -> tuple[list[str], threading.Event]:
    log: list[str] = []
    running = threading.Event()

    def changed(state: str) -> None:
        log.append(state)
        if state == "running":
            running.set()
    engine.calibrator.listeners.append(changed)
    return log, running


def test_the_first_reply_starts_while_the_calibration_runs_and_the_calibration_completes_after(smollm2, patient_calibration):
    assert not (user_dir() / "calibration.json").exists()   # a fresh home
    with Engine(smollm2, n_ctx=CTX, n_threads=1) as engine:
        log, running = _recording(engine)
        engine.calibrate_in_background()
        assert engine.calibrator.state == "waiting"
        assert running.wait(60), log                      # the calibration holds the engine now
        order: list[str] = []
        config = GenerationConfig(max_tokens=12, policy=PolicyConfig("auto", source="lookup"))
        events = []
        for event in engine.generate("Repeat after me: one two three, one two three, one two three,", config):
            if isinstance(event, TokenEvent) and not order:
                order.append("first token")
                at_first = (engine.calibrator.state, list(log), engine.cost)
            events.append(event)
        state, before, cost = at_first
        # the reply started before any calibration completed: it planned with a provisional model
        assert "done" not in before and state != "done", before
        assert cost is not None and cost.provisional and not cost.cacheable
        assert isinstance(events[-1], DoneEvent) and events[-1].stats.generated_tokens == 12
        assert not (user_dir() / "calibration.json").exists()   # nothing cached from the guess
        # once idle, the calibration starts again and completes: cached, and the engine's model
        assert engine.calibrator.wait(120), log
        assert log.index("running") < log.index("interrupted") < len(log) - 1, log
        assert log.count("running") >= 2, log                   # paused for the request, then again
        assert log[-1] == "done" and not engine.cost.provisional and engine.cost.cacheable, log
        key = engine.cost.key
    entries = json.loads((user_dir() / "calibration.json").read_text())["entries"]
    assert key in entries
    # a later engine on the same files reads it at load: no calibration at all
    with Engine(smollm2, n_ctx=CTX, n_threads=1) as engine:
        log, running = _recording(engine)
        engine.calibrate_in_background()
        assert engine.calibrator.state == "cached" and not engine.cost.provisional and log == []
        done = list(engine.generate("Hi", GenerationConfig(max_tokens=4)))[-1]
        assert isinstance(done, DoneEvent) and not running.is_set()


def test_a_generation_alone_never_calibrates_inline_and_close_stops_the_calibration(smollm2):
    """Engine.generate without calibrate_in_background (the Python API): the first auto request
    plans with the guess at once and starts the background calibration; closing the engine
    during that calibration stops it at its next decode (no native crash, nothing cached)."""
    engine = Engine(smollm2, n_ctx=CTX, n_threads=1)
    try:
        log, running = _recording(engine)
        done = list(engine.generate("Hello", GenerationConfig(max_tokens=4)))[-1]
        assert isinstance(done, DoneEvent)
        assert engine.cost is not None and engine.cost.provisional
        assert engine.calibrator.busy
        assert running.wait(60), log
    finally:
        engine.close()
    assert engine.calibrator.state in ("interrupted", "running"), log
    assert not (user_dir() / "calibration.json").exists()


def test_cost_model_waits_for_the_background_calibration(smollm2):
    """bench asks for the calibrated model before it times anything: cost_model() waits for the
    background one rather than measuring a second time beside it."""
    with Engine(smollm2, n_ctx=CTX, n_threads=1) as engine:
        log, running = _recording(engine)
        engine.calibrate_in_background()
        assert running.wait(60)
        model = engine.cost_model()
        assert engine.calibrator.state in ("done", "budget") and log.count("running") == 1, log
        assert model is engine.cost and not model.provisional


def test_the_calibration_stays_off_when_the_environment_says_so(smollm2, monkeypatch, tmp_path):
    """``LOCALSPEC_CALIBRATION=off``: no thread, no measurement; the generation plans with the guess
    and nothing is cached. A value that is neither is one error naming the variable."""
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "off")
    with Engine(smollm2, n_ctx=CTX, n_threads=1) as engine:
        engine.calibrate_in_background()
        done = [e for e in engine.generate("The capital of France is", GenerationConfig(max_tokens=4))
                if isinstance(e, DoneEvent)]
        assert done and done[0].stats.generated_tokens == 4
        assert engine.calibrator.state == "off" and engine.calibrator.runs == 0 and not engine.calibrator.busy
        assert engine.cost is not None and engine.cost.provisional   # the guess its cycles correct
    assert not (user_dir() / "calibration.json").exists()
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "sometimes")
    with Engine(smollm2, n_ctx=CTX, n_threads=1) as engine:
        with pytest.raises(LocalspecError, match="LOCALSPEC_CALIBRATION must be 'background' or 'off'"):
            engine.calibrate_in_background()


def test_a_calibration_on_a_busy_machine_serves_uncached_and_is_taken_again(smollm2, background_calibration,
                                                                            monkeypatch):
    """One judged taken on a busy machine (here: every one, UNSETTLED below zero) is the engine's
    model at once, measured figures rather than a guess, never cached; the calibrator takes it
    again after BUSY_RETRY_SECONDS, BUSY_TRIES times in all, and ``wait`` returns at the first."""
    from localspec.runtime import calibrator
    monkeypatch.setattr(cost_measure, "BUDGET_SECONDS", 3.0)   # whichever ends it: untrusted
    monkeypatch.setattr(cost_measure, "UNSETTLED", -1.0)
    monkeypatch.setattr(calibrator, "BUSY_RETRY_SECONDS", 1.0)
    monkeypatch.setattr(calibrator, "BUSY_TRIES", 2)
    with Engine(smollm2, n_ctx=40, n_threads=1) as engine:   # sizes up to 19: a short calibration
        log, running = _recording(engine)
        engine.calibrate_in_background()
        assert engine.calibrator.wait(60) and log[-1] == "budget", log
        cost = engine.cost
        assert cost is not None and not cost.cacheable and not cost.provisional and cost.verify(1) > 0
        assert engine.calibrator.describe() == "calibrated on a busy machine (not cached)"
        deadline = time.monotonic() + 60
        while log.count("budget") < 2 and time.monotonic() < deadline:   # the retry, then it gives up
            time.sleep(0.1)
        time.sleep(1.5)
        assert log == ["waiting", "running", "budget", "running", "budget"], log
    assert not (user_dir() / "calibration.json").exists()
