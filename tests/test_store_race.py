"""Creating, removing and listing one model name from several processes at once (issue 29): `rm
NAME` while `create NAME` converts a DRAFT checkpoint used to take the drafter being written for an
orphan and delete it; create then exited 0 with a record naming the deleted file. Each process is
the real CLI; ``tests/pause_child.py`` holds create at a known point while the others run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")   # the checkpoint writer of the tests

from checkpoints import N_LAYER, make_reference, write_checkpoint  # noqa: E402
from localspec.store import registry  # noqa: E402
from cli_run import assert_one_error, one_error_cli as cli  # noqa: E402
from tiny_models import build_target  # noqa: E402

PAUSE_CHILD = str(Path(__file__).with_name("pause_child.py"))


@pytest.fixture(scope="module")
def modelfile(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("race")
    build_target(d / "target.gguf", "random", n_layer=N_LAYER)
    write_checkpoint("specforge", make_reference(), d / "ckpt", ids=(0, 2, 4))
    mf = d / "Modelfile"
    mf.write_text("FROM ./target.gguf\nDRAFT ./ckpt\n")
    return mf


def start_create(name: str, mf: Path, pause: str) -> subprocess.Popen:
    """`create NAME`, held at ``pause`` (until SIGUSR1, at most 60 s); returns once it is there."""
    proc = subprocess.Popen([sys.executable, PAUSE_CHILD, f"{pause}@60", "create", name, "-f", str(mf)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    assert line.strip() == f"localspec-test-pause: {pause}", line + proc.stderr.read()
    return proc


def assert_consistent(name: str) -> None:
    """A record names files that exist; a drafter of ours without a record is gone."""
    record = registry.load(name)
    own = registry.drafters_dir() / f"{name}.gguf"
    if record is not None:
        assert record.drafter and Path(record.drafter).is_file(), record
    else:
        assert not own.exists()
    models, damaged, orphans = registry.scan()
    assert not damaged and not orphans, (damaged, orphans)


# the conversion writing the drafter (its partial file), and the record written after it (the drafter
# in place, no record yet: the window where rm used to take it for an orphan)
@pytest.mark.parametrize("pause", ["write:race.gguf", "write:race.json"])
def test_rm_while_create_converts_is_refused_and_create_completes(modelfile, pause):
    create = start_create("race", modelfile, pause)
    try:
        listed = cli("list")
        assert listed.returncode == 0 and "orphan" not in listed.stdout, listed.stdout
        rm = cli("rm", "race")
        assert_one_error(rm, contains="another localspec is creating or removing it")
    finally:
        create.send_signal(signal.SIGUSR1)
        out, err = create.communicate(timeout=120)
    assert create.returncode == 0, err[-2000:]
    assert "created race" in out
    record = registry.load("race")
    assert record is not None and Path(record.drafter).is_file()
    assert_consistent("race")
    assert cli("rm", "race").returncode == 0     # and once create is done, rm works
    assert registry.load("race") is None and not Path(record.drafter).exists()
    assert_consistent("race")


def test_a_second_create_of_the_name_waits_for_the_first(modelfile):
    first = start_create("twice", modelfile, "write:twice.json")
    second = subprocess.Popen([sys.executable, "-m", "localspec", "create", "twice", "-f", str(modelfile)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:   # the second waits on the lock while the first is held
        second.wait(timeout=8)
    except subprocess.TimeoutExpired:
        pass
    assert second.returncode is None, "the second create did not wait"
    first.send_signal(signal.SIGUSR1)
    out1, err1 = first.communicate(timeout=120)
    out2, err2 = second.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, (err1[-1000:], err2[-1000:])
    assert_consistent("twice")
    assert cli("rm", "twice").returncode == 0
    assert_consistent("twice")
