"""The command line: JSON contracts, one-line errors. In this process (``run_cli``, fd 1 and 2
captured) but for one whole run, a usage error and a value that would crash llama.cpp, which run
as a subprocess, as a user runs them."""

from __future__ import annotations

import json

import pytest

from cli_run import cli, run_cli
from tiny_models import build_drafter, build_target


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("clipair")
    target = build_target(d / "t.gguf", "noisy", noise=0.006)
    return target, build_drafter(d / "d.gguf", target, "repeat")


GENERATE_FIELDS = {"text", "n_tokens", "tokens_per_second", "drafted", "accepted", "acceptance_rate",
                   "tokens_per_cycle", "spec"}
BENCH_FIELDS = {"plain_tokens_per_second", "spec_tokens_per_second", "speedup", "greedy_identical",
                "acceptance_rate", "tokens_per_cycle"}


def test_generate_json_contract_with_a_drafter(pair):
    target, drafter = pair
    proc = run_cli("generate", "--target", str(target), "--draft", str(drafter), "--prompt", "The quick brown fox",
                   "--raw", "--policy", "fixed", "--draft-max", "3", "--max-tokens", "24", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert GENERATE_FIELDS <= set(out)
    assert out["spec"] is True and out["n_tokens"] == 24 and out["drafted"] > 0
    assert 0 <= out["accepted"] <= out["drafted"]
    assert out["tokens_per_cycle"] >= 1.0
    assert out["warmup_seconds"] > 0            # the first decode's one-time costs, not prompt time


def test_generate_with_draft_trees(pair):
    target, drafter = pair
    out = {}
    for tree in ("on", "off"):
        proc = run_cli("generate", "--target", str(target), "--draft", str(drafter), "--prompt", "The quick brown fox",
                       "--raw", "--policy", "fixed", "--draft-max", "3", "--tree", tree, "--max-tokens", "24", "--json")
        assert proc.returncode == 0, proc.stderr
        out[tree] = json.loads(proc.stdout)
    assert out["on"]["text"] == out["off"]["text"]
    assert "tree" in out["on"]["sources"] and "tree" not in out["off"]["sources"]
    proc = run_cli("generate", "--target", str(target), "--prompt", "x", "--tree", "sometimes")
    assert proc.returncode == 2
    proc = run_cli("generate", "--target", str(target), "--prompt", "x", "--p-min", "2")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "--p-min" in proc.stderr


def test_generate_no_spec_and_streaming(pair):
    target, drafter = pair
    proc = run_cli("generate", "--target", str(target), "--draft", str(drafter), "--prompt", "Hello", "--raw",
                   "--no-spec", "--max-tokens", "8", "--json")
    assert json.loads(proc.stdout)["spec"] is False
    proc = run_cli("generate", "--target", str(target), "--prompt", "Hello", "--raw", "--max-tokens", "8")
    assert proc.returncode == 0
    assert "tok/s" in proc.stderr


def test_generate_on_the_embedded_default_model():
    proc = cli("generate", "--prompt", "Say hi.", "--max-tokens", "8", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"] == "smollm2-135m" and out["n_tokens"] >= 1 and out["text"]


def test_bench_json_contract(pair, tmp_path):
    target, drafter = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p, "category": c}) for p, c in
                                 [("The quick brown fox", "a"), ("Once upon a time", "b")]) + "\n")
    proc = run_cli("bench", "--target", str(target), "--draft", str(drafter), "--prompts", str(prompts),
                   "--max-tokens", "24", "--policy", "fixed", "--draft-max", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert BENCH_FIELDS <= set(out)
    assert out["prompts"] == 2 and len(out["per_prompt"]) == 2
    assert out["greedy_identical"] is True
    assert out["tokens_per_cycle"] > 1.0
    proc = run_cli("bench", "--target", str(target), "--draft", str(drafter), "--prompts", str(prompts),
                   "--max-tokens", "16")
    assert proc.returncode == 0 and "speedup" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["generate", "--prompt", "x", "--target", "/nonexistent.gguf"], "no such file"),
    (["generate", "--prompt", "x", "--max-tokens", "0"], "max tokens"),
    (["generate", "--prompt", "x", "--draft-max", "99"], "draft-max"),
    (["generate", "--prompt", "x", "--temperature", "-1"], "temperature"),
    (["bench", "--prompts", "/nonexistent.jsonl"], "no such prompts file"),
])
def test_errors_are_one_line(args, message):
    proc = run_cli(*args)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("Error:") and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_rejects_bad_prompt_files(pair, tmp_path):
    target, drafter = pair
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    proc = run_cli("bench", "--target", str(target), "--draft", str(drafter), "--prompts", str(bad))
    assert proc.returncode == 1 and f"{bad}:2:" in proc.stderr
    proc = run_cli("bench", "--target", str(target), "--prompts", str(bad))
    assert proc.returncode == 1


def test_usage_errors_exit_2():
    proc = cli("generate")
    assert proc.returncode == 2 and "--prompt" in proc.stderr


def test_bench_modes_profile_and_json(pair, tmp_path):
    target, drafter = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a b c a b c a b", "category": "copy"}) + "\n")
    proc = run_cli("bench", "--target", str(target), "--draft", str(drafter), "--prompts", str(prompts),
                   "--max-tokens", "16", "--modes", "lookup,fixed1..2,lookup4,tree3,chain,llama-lookup", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert BENCH_FIELDS <= set(out) and out["tree"] == "auto"
    assert set(out["modes"]) == {"plain", "auto", "lookup", "fixed1", "fixed2", "lookup4", "tree3", "chain",
                                 "llama-lookup"}
    assert out["modes"]["tree3"]["policy_choices"]["tree"] > 0
    for name in ("auto", "lookup", "fixed1", "fixed2", "lookup4", "tree3", "chain"):
        m = out["modes"][name]
        assert m["greedy_identical"] and {"bound", "speedup_over_bound", "time_split"} <= set(m)
    assert set(out["per_prompt"][0]["modes"]) == set(out["modes"])
    proc = run_cli("bench", "--target", str(target), "--prompts", str(prompts), "--max-tokens", "8",
                   "--modes", "fixed2,lookup", "--profile")
    assert proc.returncode == 0, proc.stderr
    assert "fixed2: skipped (no drafter)" in proc.stdout and "bound" in proc.stdout
    proc = run_cli("bench", "--target", str(target), "--prompts", str(prompts), "--modes", "nope")
    assert proc.returncode == 1 and "unknown bench mode" in proc.stderr


def test_chat_leaves_a_core_to_the_ui(monkeypatch):
    """The chat's default thread count is every core but one; LOCALSPEC_THREADS still wins."""
    import os

    from localspec.llama.llama_model import default_threads

    monkeypatch.delenv("LOCALSPEC_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert (default_threads(), default_threads(reserve=1)) == (4, 3)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert default_threads(reserve=1) == 1
    monkeypatch.setenv("LOCALSPEC_THREADS", "2")
    assert default_threads(reserve=1) == 2


def test_thread_count_out_of_range_is_one_line(pair):
    """ggml indexes fixed arrays by thread: an out-of-range count is refused before llama.cpp sees it
    (100000 threads reaching ggml end the process with a segmentation fault: a subprocess)."""
    target, _ = pair
    for threads in ("100000", "-1"):
        proc = cli("generate", "--target", str(target), "-p", "hi", "-n", "2", "--threads", threads)
        assert proc.returncode == 1 and proc.stderr.strip().startswith("Error: threads must be between 1 and 512")
        assert "Traceback" not in proc.stderr


def test_version_and_help_without_type_placeholders_on_flags():
    from localspec import __version__

    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"localspec {__version__} (llama-cpp-python 0.3.36, host loop: C)"
    proc = run_cli("--version", env={**__import__("os").environ, "LOCALSPEC_HOSTLOOP": "numpy"})
    assert proc.stdout.strip().endswith("host loop: numpy)")
    proc = run_cli("--version", env={**__import__("os").environ, "LOCALSPEC_HOSTLOOP": "nump"})
    assert proc.returncode == 1 and proc.stderr.strip() == "Error: LOCALSPEC_HOSTLOOP must be 'c' or 'numpy' (got 'nump')"
    for command in ([], ["generate"], ["serve"], ["chat"], ["bench"], ["list"], ["fit"], ["train"]):
        proc = run_cli(*command, "--help", env={**__import__("os").environ, "COLUMNS": "200"})
        assert proc.returncode == 0 and "<bool>" not in proc.stdout, (command, proc.stdout)
        assert "--help" in proc.stdout
    assert "<int>" in run_cli("serve", "--help").stdout            # a value still shows its type


def test_list_shows_the_embedded_default(isolated_home):
    import os

    env = {**os.environ, "COLUMNS": "250", "LOCALSPEC_HOME": str(isolated_home)}
    proc = run_cli("list", env=env)
    assert proc.returncode == 0 and "no models yet besides the embedded default" in proc.stderr
    row = next(line for line in proc.stdout.splitlines() if "smollm2-135m" in line)
    assert "SmolLM2-135M-Instruct.Q4_1.gguf (embedded" in row and "smollm2-135m-eagle3.1.gguf" in row
    catalog = run_cli("list", "--catalog", env=env).stdout
    header = next(line for line in catalog.splitlines() if "NAME" in line)
    assert [c.strip() for c in header.strip("┃│ ").split("┃" if "┃" in header else "│")] == \
           ["NAME", "TARGET", "DRAFTER", "CHECKED", "LOCAL", "DESCRIPTION"]
    row = next(line for line in catalog.splitlines() if " smollm2-135m " in line)
    assert "smollm2-135m-eagle3.1.gguf (embedded)" in row and " embedded " in row
