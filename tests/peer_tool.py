"""Where llama.cpp's own ``llama-speculative-simple`` of the pinned sdist is: bench/peer_llamacpp.py
builds it into ``~/.cache/localspec/peer/llama.cpp-VERSION/build/bin``; ``LOCALSPEC_PEER_TOOL``
names another. The tests that compare drafts with it run only where it is built."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path


def native_tool() -> Path | None:
    """The built ``llama-speculative-simple``, or None."""
    named = os.environ.get("LOCALSPEC_PEER_TOOL")
    version = importlib.metadata.version("llama-cpp-python")
    tool = Path(named) if named else (Path.home() / ".cache" / "localspec" / "peer" / f"llama.cpp-{version}"
                                      / "build" / "bin" / "llama-speculative-simple")
    return tool if tool.is_file() else None
