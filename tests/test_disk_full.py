"""A full disk while localspec writes (issue 29): deriving the embedded target's Q4_0 says the disk
is full and names the directory, instead of "could not quantize", and leaves no partial file. A
real small filesystem (tmpfs; needs the right to mount, else skipped)."""

from __future__ import annotations

import subprocess

import pytest

from localspec import LocalspecError
from localspec.formats.quantize import requantize
from cli_run import assert_one_error, one_error_cli as cli
from tiny_models import build_target


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_quantizing_onto_a_full_disk_says_so(small_disk, tmp_path):
    src = build_target(tmp_path / "t.gguf")   # ~6 MiB of F16 embeddings: more than the disk holds
    out = small_disk / "models" / "t.q4_0.gguf"
    with pytest.raises(LocalspecError, match="the disk is full") as info:
        requantize(src, out, "q4_0")
    assert str(out.parent) in str(info.value) and "\n" not in str(info.value)
    assert list(out.parent.iterdir()) == []   # no partial file left


def test_first_run_on_a_full_disk_is_one_line(small_disk):
    home = small_disk / "home"
    proc = cli("generate", "-p", "hi", "-n", "2", env={"LOCALSPEC_HOME": str(home)})
    line = assert_one_error(proc, contains="the disk is full")
    assert str(home / "models") in line
    assert [p.name for p in (home / "models").iterdir()] == []
