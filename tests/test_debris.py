"""What a killed or damaged run leaves behind: partial files, damaged records, orphaned drafters,
and user directories localspec cannot write. Each gives one Error line or is cleaned up."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.core import atomic

from localspec.store import registry
from localspec.core.errors import LocalspecError

from cli_run import run_cli
from tiny_models import build_drafter, build_target


def cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """In this process (fd 1 and 2 captured: llama.cpp's own lines count)."""
    return run_cli(*args, env=dict(os.environ, COLUMNS="200", **(env or {})), **kw)


def one_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return lines[0]


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# --------------------------------------------------------------------------------------------
# the atomic-write helper


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "f.json"
    atomic.atomic_write(path, "old")
    with pytest.raises(RuntimeError):
        with atomic.atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("writer failed")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
    atomic.atomic_write(path, "new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_stale_partials_of_dead_processes_are_removed(tmp_path):
    dead, alive = dead_pid(), os.getppid()
    stale = [tmp_path / f".x.gguf.partial-{dead}", tmp_path / f".x.gguf.staging-{dead}.partial-{dead}",
             tmp_path / f".x.gguf.{dead}.tmp", tmp_path / f".y.gguf.partial-{dead}"]
    # a live writer's file, a file of ours, and an older release's temp file for another name
    kept = [tmp_path / f".x.gguf.partial-{alive}", tmp_path / "x.gguf", tmp_path / f".y.gguf.{dead}.tmp"]
    for p in stale + kept:
        p.write_bytes(b"?")
    removed = atomic.clean_stale(tmp_path, "x.gguf")
    assert sorted(removed) == sorted(stale)
    assert all(p.exists() for p in kept)
    atomic.atomic_write(tmp_path / "y.gguf", b"new")   # a writer cleans its own name's older debris too
    assert not (tmp_path / f".y.gguf.{dead}.tmp").exists()


def test_user_dir_debris_is_cleaned_when_any_command_starts(isolated_home):
    dead = dead_pid()
    models, drafters = isolated_home / "models", isolated_home / "drafters"
    models.mkdir()
    drafters.mkdir()
    debris = [models / f".SmolLM2-135M-Instruct.Q4_0.gguf.partial-{dead}", drafters / f".a.gguf.partial-{dead}",
              models / f".a.json.partial-{dead}"]
    for p in debris:
        p.write_bytes(b"x" * 1000)
    mine = models / f".b.json.partial-{os.getpid()}"   # a live writer's file stays
    mine.write_bytes(b"x")
    proc = cli("list")
    assert proc.returncode == 0, proc.stderr
    assert not any(p.exists() for p in debris) and mine.exists()


# --------------------------------------------------------------------------------------------
# damaged records and orphans


@pytest.fixture
def tiny_pair(tmp_path):
    target = build_target(tmp_path / "target.gguf")
    return target, build_drafter(tmp_path / "drafter.gguf", target)


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8 \x80", b"{not json", b'{"format": 1, "name": 7}',
                                     b"", b"[models]\nnot = 'toml either'\n"])
def test_damaged_records_are_listed_and_removable(content, isolated_home, tiny_pair):
    models = isolated_home / "models"
    models.mkdir()
    (models / "broken.json").write_bytes(content)
    (isolated_home / "drafters").mkdir()
    (isolated_home / "drafters" / "broken.gguf").write_bytes(tiny_pair[1].read_bytes())

    line = one_error(cli("show", "broken"))
    assert "damaged model record" in line and "localspec rm broken" in line
    line = one_error(cli("generate", "broken", "--prompt", "hi"))
    assert "damaged model record" in line

    listing = cli("list")
    assert listing.returncode == 0 and "broken" in listing.stdout and "damaged record" in listing.stdout

    proc = cli("rm", "broken")
    assert proc.returncode == 0, proc.stderr
    assert not (models / "broken.json").exists()
    assert not (isolated_home / "drafters" / "broken.gguf").exists()   # the drafter it owned by name
    assert "no models yet" in cli("list").stderr


def test_create_over_a_damaged_record_replaces_it(isolated_home, tiny_pair, tmp_path):
    target, drafter = tiny_pair
    (isolated_home / "models").mkdir()
    (isolated_home / "models" / "m.json").write_bytes(b"\xff")
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {target}\nDRAFT {drafter}\n")
    proc = cli("create", "m", "-f", str(mf))
    assert proc.returncode == 0, proc.stderr
    assert registry.load("m").drafter == str(drafter)


def test_orphaned_drafter_is_listed_and_removable_and_others_are_kept(isolated_home, tiny_pair, tmp_path):
    target, drafter = tiny_pair
    drafters = isolated_home / "drafters"
    drafters.mkdir()
    (drafters / "lost.gguf").write_bytes(drafter.read_bytes())
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {target}\nDRAFT {drafters / 'shared.gguf'}\n")
    (drafters / "shared.gguf").write_bytes(drafter.read_bytes())
    assert cli("create", "keep", "-f", str(mf)).returncode == 0   # uses drafters/shared.gguf

    listing = cli("list").stdout
    assert "lost" in listing and "orphaned" in listing
    assert "shared.gguf" in listing and listing.count("orphaned") == 1
    assert cli("rm", "lost").returncode == 0
    assert sorted(p.name for p in drafters.iterdir()) == ["shared.gguf"]
    assert "model 'lost' not found" in one_error(cli("rm", "lost"))


# --------------------------------------------------------------------------------------------
# a user directory localspec cannot use


def test_home_that_is_a_file(tmp_path):
    home = tmp_path / "home"
    home.write_text("I am a file")
    for args in (("list",), ("generate", "--prompt", "hi"), ("pull", "smollm2-135m")):
        line = one_error(cli(*args, env={"LOCALSPEC_HOME": str(home)}))
        assert str(home) in line and "is a file" in line


def test_home_under_a_file(tmp_path):
    home = tmp_path / "file" / "home"
    home.parent.write_text("x")
    line = one_error(cli("list", env={"LOCALSPEC_HOME": str(home)}))
    assert str(home) in line


def _read_only(home: Path) -> list[str]:
    """A command prefix under which ``home`` is read-only: as root (whom permissions do not stop),
    a read-only tmpfs over it in a private mount namespace; otherwise mode 555 is enough."""
    if os.geteuid() != 0:
        os.chmod(home, 0o555)
        return []
    if shutil.which("unshare") is None:
        pytest.skip("running as root without unshare: cannot make a read-only directory")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro,size=1m none '{home}'"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here")
    return ["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o ro,size=1m none "$0" && exec "$@"', str(home)]


def test_read_only_home(tmp_path, tiny_pair):
    home = tmp_path / "ro"
    home.mkdir()
    prefix = _read_only(home)
    env = dict(os.environ, LOCALSPEC_HOME=str(home), COLUMNS="200")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*prefix, sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                              timeout=300, env=env)

    try:
        line = one_error(run("generate", "--prompt", "hi", "-n", "2"))   # the Q4_0 target cannot be derived
        assert str(home / "models") in line
        target, drafter = tiny_pair
        mf = tmp_path / "Modelfile"
        mf.write_text(f"FROM {target}\nDRAFT {drafter}\n")
        line = one_error(run("create", "m", "-f", str(mf)))   # nor its lock taken, nor a record written
        assert str(home / "locks") in line and ("Read-only" in line or "Permission denied" in line)
        proc = run("list")     # reading still works
        assert proc.returncode == 0 and "no models yet" in proc.stderr, proc.stderr
        proc = run("generate", "--target", str(target), "--prompt", "hi", "-n", "2", "--raw")
        assert proc.returncode == 0, proc.stderr   # nothing to write: it runs (the cost cache is skipped)
    finally:
        os.chmod(home, 0o755)


def test_atomic_path_names_an_unwritable_directory(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    with pytest.raises(LocalspecError, match="cannot write .*blocker/out.gguf"):
        atomic.atomic_write(blocker / "out.gguf", b"data")


@pytest.mark.parametrize("content", [b"\xff\xfe", b"[models\nbroken"])
def test_damaged_user_catalog_is_one_line_and_rm_still_works(content, isolated_home):
    (isolated_home / "models.toml").write_bytes(content)
    (isolated_home / "models").mkdir()
    (isolated_home / "models" / "x.json").write_bytes(b"{")
    for args in (("list", "--catalog"), ("generate", "x", "--prompt", "hi"), ("pull", "x")):
        line = one_error(cli(*args))
        assert str(isolated_home / "models.toml") in line or "damaged model record" in line
    assert cli("rm", "x").returncode == 0


# --------------------------------------------------------------------------------------------
# native log lines


def test_bad_gguf_header_gives_only_the_error_line(tmp_path, tiny_pair):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)   # tensor count far beyond the file
    target, _ = tiny_pair
    for args in (("generate", "--target", str(bad), "--prompt", "hi"), ("inspect", str(bad)),
                 ("generate", "--target", str(target), "--draft", str(bad), "--prompt", "hi"),
                 ("fit", "--target", str(bad))):
        line = one_error(cli(*args))   # ggml's own parser lines are not printed before it
        assert "not a valid GGUF file" in line and "number of tensors" in line, line
    verbose = cli("generate", "--target", str(bad), "--prompt", "hi", "--verbose")
    assert verbose.returncode == 1 and "gguf_init_from_reader" in verbose.stderr   # --verbose shows them
    assert verbose.stderr.strip().splitlines()[-1].startswith("Error: ")
