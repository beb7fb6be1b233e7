"""``localspec inspect``: the same facts for drafters and targets, as a table or JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.cli.inspect import describe_gguf
from localspec.core.units import format_size as human_size
from localspec.formats.gguf_info import read_gguf

from cli_run import run_cli
from tiny_models import build_drafter, build_target

BIN = Path(sys.executable).parent / "localspec"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("inspect")
    target = build_target(d / "t.gguf", "random")
    import numpy as np
    drafter = build_drafter(d / "d.gguf", target, "random", variant="eagle3.1", d2t=np.arange(100, 400))
    return target, drafter


def test_describe_drafter(pair):
    _, drafter = pair
    desc = describe_gguf(read_gguf(drafter))
    assert desc["kind"] == "drafter" and desc["variant"] == "eagle3.1"
    assert desc["target_layers"] == [0, 1, 3] and desc["draft_vocab"] == 300 and desc["target_vocab"] == 49152
    assert desc["layout"] == "test" and desc["fc_norm"] and desc["norm_output"] and desc["dtype"] == "F32"
    assert desc["size_bytes"] == drafter.stat().st_size


def test_describe_target(pair):
    target, _ = pair
    desc = describe_gguf(read_gguf(target))
    assert desc["kind"] == "target" and desc["architecture"] == "llama" and desc["layers"] == 4
    assert desc["hidden_size"] == 64 and desc["vocab"] == 49152 and desc["eagle_features"] is True


def test_cli_table_and_json(pair):
    """The installed `localspec` script, with a bare environment; then the same command in-process."""
    target, drafter = pair
    r = subprocess.run([str(BIN), "inspect", str(drafter)], capture_output=True, text=True, timeout=60,
                       env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    for word in ("drafter", "eagle3.1", "0, 1, 3", "300", "F32", "MiB"):
        assert word in r.stdout, r.stdout
    r = run_cli("inspect", "--json", str(target))   # the rest in this process
    assert r.returncode == 0 and json.loads(r.stdout)["kind"] == "target"


def test_cli_missing_file(tmp_path):
    r = run_cli("inspect", str(tmp_path / "none.gguf"))
    assert r.returncode == 1 and r.stderr.strip() == f"Error: {tmp_path / 'none.gguf'}: no such file"


def test_human_size():
    assert human_size(512) == "512 B" and human_size(2048) == "2.0 KiB" and human_size(3 * 1024**3) == "3.0 GiB"
