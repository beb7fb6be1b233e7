"""Adaptive thread count: the controller's decisions from a scripted CPU-usage source (what other
processes used), its hook in the engine, and llama.cpp's thread change on a real tiny model."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from localspec import DoneEvent, Engine, GenerationConfig, PolicyConfig
from localspec.llama.llama_model import Context, Model
from localspec.runtime import threads as T
from tiny_models import build_drafter, build_target


class Scripted:
    """Other processes' CPU use, reading by reading, as /proc/stat would report it."""

    def __init__(self, readings):
        self.readings = list(readings)

    def sample(self):
        return self.readings.pop(0) if self.readings else None


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def controller(readings, n_max=2, cores=2):
    applied, clock = [], Clock()
    ctl = T.ThreadController(n_max, applied.append, Scripted(readings), cores=cores, clock=clock)
    return ctl, applied, clock


def ticks(ctl, clock, n, every=0.31):
    for _ in range(n):
        clock.t += every
        ctl.tick()


def test_a_busy_core_lowers_the_count_and_its_end_raises_it_again():
    # readings of (other processes' cores, seconds): a busy loop takes a core, later it stops
    ctl, applied, clock = controller([(0.05, 0.3)] * 3 + [(0.9, 0.3)] * 4 + [(1.0, 0.3)] * 3
                                     + [(0.02, 0.3)] * 3 + [(0.5, 0.3)] + [(0.02, 0.3)] * 8)
    ticks(ctl, clock, 3)
    assert applied == []                       # idle: all cores
    ticks(ctl, clock, 2)
    assert applied == [1] and ctl.n == 1       # two readings in a row agree: one thread
    ticks(ctl, clock, 5)
    assert applied == [1]                      # stays while the core is taken
    ticks(ctl, clock, 4)
    assert applied == [1]                      # quiet for a moment, then busy again: stays
    ticks(ctl, clock, 5)
    assert applied == [1]                      # quiet for 1.5 s: not yet
    ticks(ctl, clock, 3)
    assert applied == [1, 2] and ctl.n == 2    # quiet for 2 s: the other process left


def test_one_busy_reading_or_a_middling_load_changes_nothing():
    ctl, applied, clock = controller([(0.05, 0.3), (1.0, 0.3), (0.05, 0.3), (0.2, 0.3), (0.25, 0.3), (0.2, 0.3)])
    ticks(ctl, clock, 6)
    assert applied == []
    # at one thread, a middling load (inside the band) does not raise it either
    ctl, applied, clock = controller([(1.0, 0.3), (1.0, 0.3), (0.2, 0.3), (0.2, 0.3), (0.25, 0.3)] * 3)
    ticks(ctl, clock, 15)
    assert applied == [1]


def test_a_long_reading_decides_alone_and_readings_are_rate_limited():
    ctl, applied, clock = controller([(1.2, 5.0), (0.1, 5.0)])   # e.g. gaps between chat turns
    ticks(ctl, clock, 1)
    assert applied == [1]
    ticks(ctl, clock, 1)
    assert applied == [1, 2]
    ctl, applied, clock = controller([(1.0, 0.3)] * 10)
    ticks(ctl, clock, 10, every=0.01)                   # 0.1 s of cycles: no reading yet
    assert applied == [] and len(ctl.usage.readings) == 10


def test_more_cores_keep_the_threads_that_fit():
    assert T.fitting(8, 0.05, T.LOWER_ABOVE, 8) == 8
    assert T.fitting(8, 2.5, T.LOWER_ABOVE, 8) == 5
    assert T.fitting(8, 2.5, T.LOWER_ABOVE, 4) == 4     # never above the starting count
    assert T.fitting(2, 3.0, T.LOWER_ABOVE, 2) == 1     # never below one


def test_proc_stat_usage_excludes_this_process(tmp_path):
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    usage = T.ProcStatUsage()
    x = 0
    for i in range(3_000_000):   # this process keeps one core busy for a while
        x += i
    other, span = usage.sample()
    assert span > 0 and 0.0 <= other <= os.cpu_count()
    fake = tmp_path / "stat"
    fake.write_text("not a stat file\n")
    assert T.ProcStatUsage(str(fake)).sample() is None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("threads")
    target = build_target(d / "noisy.gguf", "noisy", noise=0.006)
    return target, build_drafter(d / "drafter.gguf", target, "repeat")


def test_llama_thread_change_keeps_the_logits(tiny):
    model = Model(tiny[0])
    ctx = Context(model, n_ctx=256, n_threads=2)
    try:
        tokens = [1, 5, 9, 13, 2, 7, 11, 3]
        ctx.decode(tokens, 0, all_logits=True)
        two = np.array([ctx.logits(i) for i in range(len(tokens))])
        ctx.seq_rm(0)
        ctx.set_threads(1)
        assert ctx.n_threads == 1
        ctx.decode(tokens, 0, all_logits=True)
        one = np.array([ctx.logits(i) for i in range(len(tokens))])
        assert np.array_equal(one, two)   # ggml splits work by output rows, no sum across threads
    finally:
        ctx.close()
        model.close()


def test_engine_adapts_only_without_a_user_count(tiny, monkeypatch):
    monkeypatch.delenv("LOCALSPEC_THREADS", raising=False)
    with Engine(tiny[0], tiny[1], n_ctx=512, n_threads=2) as engine:
        assert isinstance(engine.threads, T.FixedThreads)      # the user's count stays
    monkeypatch.setenv("LOCALSPEC_THREADS", "2")
    with Engine(tiny[0], n_ctx=512) as engine:
        assert isinstance(engine.threads, T.FixedThreads)
    monkeypatch.delenv("LOCALSPEC_THREADS")
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nothing to adapt")
    with Engine(tiny[0], tiny[1], n_ctx=512) as engine:
        ctl = engine.threads
        assert isinstance(ctl, T.ThreadController) and engine.ctx.n_threads == ctl.n_max
        ctl.usage, ctl.interval, ctl._next = Scripted([(0.0, 2.0)] * 1000), 0.0, 0.0  # an idle machine first
        cfg = GenerationConfig(max_tokens=60, policy=PolicyConfig("auto", 8), record_margins=True)
        plain = [e for e in engine.generate("1, 2, 3, 4, 5,", GenerationConfig(max_tokens=60, spec=False))][-1]
        assert "-t%d-gpu" % ctl.n_max in engine.cost_model().key    # calibrated on all cores
        # the machine gets busy during the next generation: the engine drops to one thread, and
        # the drafter and the cost model follow
        # (readings due at once: a warm engine generates 60 tokens within the first interval)
        ctl.usage, ctl.interval, ctl._next = Scripted([(float(ctl.cores), 2.0)] * 1000), 0.0, 0.0
        spec = [e for e in engine.generate("1, 2, 3, 4, 5,", cfg)][-1]
        assert isinstance(spec, DoneEvent) and ctl.changes >= 1
        assert engine.ctx.n_threads == 1 and engine.drafter.ctx.n_threads == 1
        assert "-t1-gpu" in engine.cost.key
        assert spec.tokens == plain.tokens


def test_a_generation_start_reads_at_once():
    ctl, applied, clock = controller([(1.0, 2.0)])
    clock.t += 0.1
    ctl.tick()
    assert applied == []                       # between cycles: not yet time for a reading
    ctl.tick(start=True)
    assert applied == [1]                      # a generation starts: read now (a long span decides)
    ctl.tick(start=True)
    assert len(ctl.usage.readings) == 0 and applied == [1]


def test_a_generation_ticks_between_cycles_and_counts_the_time(tiny):
    """The controller is asked once per step of the scheduler that drives the generation (the
    prompt's one step, then one per cycle) and once as the generation starts, and its time is
    generation time: a slow reading of /proc/stat slows what the user sees, so bench must see it."""
    calls = []

    class Slow:
        changes = 0
        adapts = True

        def tick(self, *, start=False):
            calls.append(start)
            time.sleep(0.002)

    with Engine(tiny[0], n_ctx=512, n_threads=1) as engine:
        engine.threads = Slow()
        done = [e for e in engine.generate("1, 2, 3,", GenerationConfig(max_tokens=12, spec=False))][-1]
    stats = done.stats
    assert calls[0] is True and calls[1:] == [False] * (1 + stats.cycles)
    assert stats.generation_seconds >= 0.002 * stats.cycles
    assert stats.overhead_seconds >= 0.002 * stats.cycles   # outside llama.cpp: Python's share
