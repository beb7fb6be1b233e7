"""Real chat templates of tool-calling families, read from the pinned llama-cpp-python sdist's
``vendor/llama.cpp/models/templates`` (llama.cpp's own test data; each from its model's Hub
repository, under that model's license), fetched once with pip into a cache, as the benches fetch
the sdist. Not copied into this repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("LOCALSPEC_TEST_CACHE", Path.home() / ".cache" / "localspec-tests"))
MEMBER = "vendor/llama.cpp/models/templates/"


def sdist_archive() -> Path:
    """The installed llama-cpp-python's sdist (downloaded into the cache on first use). Without a
    registry the tests that need it are skipped, except in CI, where they fail."""
    pinned = version("llama-cpp-python")
    archive = CACHE / f"llama_cpp_python-{pinned}.tar.gz"
    if archive.is_file():
        return archive
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                           "-d", str(CACHE), f"llama-cpp-python=={pinned}"], capture_output=True, text=True)
    if done.returncode != 0 or not archive.is_file():
        message = f"the llama-cpp-python {pinned} sdist could not be fetched: {done.stderr.strip()[-300:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return archive


def templates_dir() -> Path:
    """The unpacked templates of the installed llama-cpp-python's sdist (downloaded on first use)."""
    pinned = version("llama-cpp-python")
    out = CACHE / f"templates-{pinned}"
    if out.is_dir() and any(out.glob("*.jinja")):
        return out
    archive = sdist_archive()
    partial = out.with_name(out.name + f".partial-{os.getpid()}")
    partial.mkdir(exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = member.name.split("/", 1)[-1]
            if member.isfile() and name.startswith(MEMBER) and name.endswith(".jinja"):
                (partial / Path(name).name).write_bytes(tar.extractfile(member).read())
    if out.exists():   # another process unpacked it meanwhile
        shutil.rmtree(partial)
    else:
        partial.replace(out)
    return out
