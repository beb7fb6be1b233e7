"""Standard output that cannot be written (issue 29): a full device, a closed descriptor, a reader
that went away. The CLI as a subprocess, since the descriptors are the point: one ``Error:`` line
(exit 1), or a quiet exit 141 for a closed pipe as Unix tools give; never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cli_run import assert_one_error
from tiny_models import build_drafter, build_target

FULL = "/dev/full"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("stdout")
    target = build_target(d / "t.gguf", "repeat")
    return target, build_drafter(d / "d.gguf", target, "repeat")


def commands(pair) -> dict[str, list[str]]:
    target, drafter = pair
    gen = ["generate", "--target", str(target), "--draft", str(drafter), "-p", "hi", "--raw", "-n", "40"]
    return {"generate": gen, "generate --json": [*gen, "--json"], "list": ["list", "--catalog"],
            "inspect": ["inspect", str(target)]}


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "localspec", *args], stderr=subprocess.PIPE, text=True,
                          errors="replace", timeout=120, **kwargs)


@pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full")
@pytest.mark.parametrize("name", ["generate", "generate --json", "list", "inspect"])
def test_a_full_standard_output_is_one_error_line(pair, name):
    with open(FULL, "w") as full:
        proc = run(commands(pair)[name], stdout=full)
    assert_one_error(proc, contains="cannot write to standard output: No space left on device")


@pytest.mark.parametrize("name", ["generate", "list"])
def test_a_closed_standard_output_is_one_error_line(pair, name):
    proc = run(commands(pair)[name], stdout=subprocess.DEVNULL, preexec_fn=lambda: os.close(1))
    assert_one_error(proc, contains="cannot write to standard output: it is closed")


@pytest.mark.parametrize("name", ["generate", "inspect"])
def test_a_reader_that_goes_away_ends_the_command_quietly(pair, name):
    """`localspec ... | head -0`: the pipe closes before the first write."""
    proc = subprocess.Popen([sys.executable, "-m", "localspec", *commands(pair)[name]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err[-2000:]
    assert "Traceback" not in err and "Exception ignored" not in err and "Error" not in err, err[-2000:]


def test_the_same_commands_work_on_a_writable_output(pair):
    for name, args in commands(pair).items():
        proc = run(args, stdout=subprocess.PIPE)
        assert proc.returncode == 0 and proc.stdout.strip(), (name, proc.stderr[-2000:])
