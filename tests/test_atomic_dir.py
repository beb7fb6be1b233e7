"""Directories written as a whole (``export``): core.atomic.atomic_dir, and the sweep of what a
killed writer left (its partial directory, and the ``.NAME.export-PID`` ones of older releases)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from localspec.core import atomic


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_atomic_dir_appears_whole_replaces_whole_or_not_at_all(tmp_path):
    out = tmp_path / "ckpt"
    with atomic.atomic_dir(out) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".ckpt.partial-")
        (tmp / "config.json").write_text("{}")
        assert not out.exists()                       # nothing at the destination while writing
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]

    with pytest.raises(RuntimeError):
        with atomic.atomic_dir(out) as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]    # the old directory, intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]       # no partial directory left

    with atomic.atomic_dir(out) as tmp:
        (tmp / "model.safetensors").write_bytes(b"new")
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]   # replaced, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_partial_directories_of_dead_writers_are_swept(tmp_path):
    dead, alive = dead_pid(), os.getppid()
    stale = [tmp_path / f".ckpt.export-{dead}", tmp_path / f".ckpt.old-{dead}",
             tmp_path / f".ckpt.partial-{dead}", tmp_path / f".ckpt.partial-{dead}.old",
             tmp_path / f".other.partial-{dead}"]
    kept = [tmp_path / f".ckpt.partial-{alive}", tmp_path / f".other.export-{dead}"]
    for d in stale + kept:
        d.mkdir()
        (d / "model.safetensors").write_bytes(b"?")
    with atomic.atomic_dir(tmp_path / "ckpt") as tmp:
        (tmp / "config.json").write_text("{}")
    assert not any(d.exists() for d in stale)
    assert all(d.exists() for d in kept)
