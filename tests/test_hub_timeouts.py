"""`pull` and `convert` of a Hub repo id against endpoints that fail: bounded waits, one Error line.

Two stand-ins on 127.0.0.1: a socket that accepts connections and never answers, and a port that
nothing listens on. The CLI runs as a subprocess with HF_ENDPOINT pointed at them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from cli_run import default_sigint

CATALOG = ('schema = 1\n[models.tiny]\ndescription = "tiny test pair"\n'
           '[models.tiny.target]\nrepo = "test/tiny-GGUF"\nfile = "tiny-target.gguf"\n'
           '[models.tiny.draft]\nrepo = "test/tiny-eagle3"\nfile = "tiny-drafter.gguf"\n')


@pytest.fixture
def silent_server():
    """Accepts every connection, reads nothing, answers nothing."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    thread.join(timeout=2)
    for c in held:
        c.close()
    srv.close()


@pytest.fixture
def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # nothing listens there now
    return f"http://127.0.0.1:{port}"


def _run(args, endpoint, tmp_path, isolated_home, **env):
    (isolated_home / "models.toml").write_text(CATALOG, encoding="utf-8")
    full = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0", **env)
    full.pop("HF_HUB_CACHE", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                          timeout=60, env=full)
    return proc, time.monotonic() - t0


def _one_error_line(proc) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr
    return lines[0]


def test_pull_from_a_server_that_never_answers_stops_at_the_timeout(silent_server, tmp_path, isolated_home):
    proc, secs = _run(["pull", "tiny", "--timeout", "2"], silent_server, tmp_path, isolated_home)
    line = _one_error_line(proc)
    assert "no answer within 2 s" in line and "--timeout" in line and "LOCALSPEC_HUB_TIMEOUT" in line
    assert secs < 20, secs


def test_hub_timeout_env_var(silent_server, tmp_path, isolated_home):
    proc, secs = _run(["pull", "tiny"], silent_server, tmp_path, isolated_home, LOCALSPEC_HUB_TIMEOUT="1.5")
    assert "no answer within 1.5 s" in _one_error_line(proc)
    assert secs < 20, secs
    proc, _ = _run(["pull", "tiny"], silent_server, tmp_path, isolated_home, LOCALSPEC_HUB_TIMEOUT="soon")
    assert "LOCALSPEC_HUB_TIMEOUT must be a number" in _one_error_line(proc)
    proc, _ = _run(["pull", "tiny", "--timeout", "0"], silent_server, tmp_path, isolated_home)
    assert "--timeout must be" in _one_error_line(proc)


def test_pull_from_a_closed_port_is_quick_and_quiet(closed_port, tmp_path, isolated_home):
    proc, secs = _run(["pull", "tiny"], closed_port, tmp_path, isolated_home)
    line = _one_error_line(proc)   # no retry warnings before it
    assert "cannot reach the Hugging Face Hub" in line and "127.0.0.1" in line
    assert secs < 15, secs


def test_convert_of_a_hub_repo_id_is_bounded(silent_server, tmp_path, isolated_home):
    pytest.importorskip("torch")
    from tiny_models import build_target

    target = build_target(tmp_path / "t.gguf")
    proc, secs = _run(["convert", "someone/eagle3-drafter", "--target", str(target), "-o", str(tmp_path / "d.gguf"),
                       "--timeout", "2"], silent_server, tmp_path, isolated_home)
    line = _one_error_line(proc)
    assert "someone/eagle3-drafter" in line and "no answer within 2 s" in line
    assert secs < 25, secs
    assert not list(tmp_path.glob("*d.gguf*"))


def test_ctrl_c_while_pull_waits_for_the_hub(silent_server, tmp_path, isolated_home):
    import signal

    (isolated_home / "models.toml").write_text(CATALOG, encoding="utf-8")
    env = dict(os.environ, HF_ENDPOINT=silent_server, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="0")
    proc = subprocess.Popen([sys.executable, "-m", "localspec", "pull", "tiny", "--timeout", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=default_sigint)
    time.sleep(4)   # started, and waiting on the server (it never answers)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and err.strip().splitlines() == ["Interrupted."], err
    assert not (isolated_home / "models" / "tiny.json").exists()
