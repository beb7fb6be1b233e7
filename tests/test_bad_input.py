"""Bad input, as a user types it: the CLI as a subprocess gives exactly one ``Error:`` line on stderr,
exit 1 (2 for usage), no traceback, no native crash, and the next run works (issue 15).

One test per class of input; localspec.core.options holds the ranges these probes hit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import gguf
import pytest

from localspec import LocalspecError

from localspec.core import options
from localspec.formats.chat_format import ChatFormatter
from localspec.runtime.engine import GenerationConfig
from localspec.formats.gguf_info import check_pair, read_gguf
from localspec.runtime.sampling import SamplingParams
from localspec.speculation.policy import PolicyConfig
from cli_run import assert_one_error, cli_batch, one_error_cli as cli, works
from tiny_models import HEAD_DIM, build_target, repeat_pair, rewrite_gguf

U32 = gguf.GGUFValueType.UINT32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    return d, *repeat_pair(d)


# -- values: one table, every entry point ----------------------------------------------------------------
BAD_FLAGS = [
    (["--temperature", "nan"], "temperature must be a finite number"),
    (["--temperature", "inf"], "temperature must be a finite number"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--seed", "-5"], "seed must be between 0 and 4294967295"),
    (["--seed", str(2**32)], "seed must be between 0 and 4294967295"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--top-p", "nan"], "top_p must be a finite number"),
    (["--min-p", "1.5"], "min_p must be in [0, 1]"),
    (["--top-k", "-1"], "top_k must be between 0"),
    (["--max-tokens", "0"], "max tokens must be between 1"),
    (["--max-tokens", "99999999999999999999"], "max tokens must be between 1 and 2147483647"),
    (["--draft-max", "33"], "draft_max must be between 1 and 32"),
    (["--p-min", "nan"], "p_min must be a finite number"),
    (["--ctx", "1"], "n_ctx must be between 16"),
    (["--ctx", "8"], "n_ctx must be between 16"),
    (["--ctx", "99999999999999999999"], "n_ctx must be between 16 and 2147483647"),
    (["--ctx", "1000000000"], "above the 4096 tokens"),
    (["--threads", "513"], "threads must be between 1 and 512"),
    (["--gpu-layers", "-2"], "gpu_layers must be between -1"),
    (["--stop", "\udcff"], "stop string is not valid UTF-8"),
]


def test_every_bad_value_flag_is_one_error_line_before_any_model_loads(tiny):
    d, target, _ = tiny
    procs = cli_batch(*(["generate", "--target", str(target), "-p", "hi", *flags] for flags, _ in BAD_FLAGS))
    for (flags, message), proc in zip(BAD_FLAGS, procs):
        line = assert_one_error(proc, contains=message)
        assert proc.seconds < 60, (flags, "checked late")
        assert line.endswith(")") or "trained for" in line or "UTF-8" in line, line  # names the flag
    works(target)


def test_context_too_small_or_huge_never_reaches_llama_cpp(tiny, tmp_path):
    """--ctx below ~9 aborted natively in the memory planner (GGML_ASSERT n_outputs_max); 1e20 wrapped
    to ~1.7e9 and allocated until the OOM killer came; 1e9 took a minute to fail."""
    d, target, drafter = tiny
    small = [[*cmd, "--target", str(target), "--ctx", ctx] for ctx in ("1", "4", "15")
             for cmd in (["bench", "--prompts", str(tmp_path / "none.jsonl")], ["fit"], ["chat"])]
    huge = [["fit", "--target", str(target), "--draft", str(drafter), "--ctx", ctx]
            for ctx in ("99999999999999999999", "1000000000", "4097")]
    procs = cli_batch(*small, *huge)
    for proc in procs[:len(small)]:
        assert_one_error(proc, contains="n_ctx must be between 16")
    for proc in procs[len(small):]:
        assert_one_error(proc)
        assert proc.seconds < 30
    # a Modelfile's num_ctx goes through the same check (at create)
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {target}\nPARAMETER num_ctx 4\n")
    assert_one_error(cli("create", "small", "-f", str(mf)), contains="PARAMETER num_ctx must be between 16")
    works(target, "--ctx", "16")
    # the smallest context runs with a drafter and the auto policy too (calibration fits its batch)
    proc = cli("generate", "--target", str(target), "--draft", str(drafter), "-p", "hi", "--raw", "-n", "30",
               "--ctx", "16", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["finish_reason"] in ("length", "context")
    assert_one_error(cli("chat", "--resume", "99999999999999999999"), contains="no conversation with id")


def test_the_planner_never_asks_llama_cpp_about_a_context_beyond_the_budget(tiny):
    """A context whose weights and KV alone exceed every device's memory is not reserved in llama.cpp
    (reserving allocates its cell bookkeeping for real), and plan_engine refuses rather than allocate."""
    from localspec.memory import pair, planner
    from localspec.store.models import ModelSpec

    d, target, drafter = tiny
    info = read_gguf(target)
    tl = planner.layout(info)
    asked = []

    def compute(n_ctx, kv, ngl, dngl):
        asked.append(n_ctx)
        return 0, 0

    budget = [planner.DeviceBudget("CPU", tl.weights_bytes + 64 * 1024, False)]
    plan = planner.plan_memory(tl, None, budget, compute, n_ctx=4096)
    assert not plan.fits and asked == []
    with pytest.raises(LocalspecError, match="n_ctx must be between 16"):
        planner.plan_memory(tl, None, budget, compute, n_ctx=4)
    with pytest.raises(LocalspecError, match="does not fit the memory budget"):
        pair.plan_engine(ModelSpec("t", target), n_ctx=4096, ram=tl.weights_bytes + 64 * 1024)
    with pytest.raises(LocalspecError, match="above the 4096 tokens"):
        pair.plan_files(target, None, n_ctx=1 << 30)


def test_python_api_checks_the_same_table():
    for make, message in [
        (lambda: SamplingParams(temperature=float("nan")), "temperature must be a finite number"),
        (lambda: SamplingParams(seed=-5), "seed must be between 0 and 4294967295"),
        (lambda: SamplingParams(top_k=2.5), "top_k must be an integer"),
        (lambda: SamplingParams(min_p=True), "min_p must be a number"),
        (lambda: GenerationConfig(max_tokens=0), "max tokens must be between 1"),
        (lambda: GenerationConfig(stop=["ok", 7]), "stop strings must be text"),
        (lambda: PolicyConfig(draft_max=0), "draft_max must be between 1 and 32"),
        (lambda: PolicyConfig(p_min=float("inf")), "p_min must be a finite number"),
        (lambda: PolicyConfig(tree="maybe"), "tree setting must be auto, on or off"),
        (lambda: PolicyConfig(tree_nodes=99), "tree nodes must be between 1 and 32"),
    ]:
        with pytest.raises(LocalspecError, match=message.replace("(", r"\(").replace("[", r"\[")):
            make()
    assert SamplingParams(seed=-1).seed is None           # -1: a random seed, as llama.cpp
    assert SamplingParams(min_p=1.0).min_p == 1.0         # one rule for min_p everywhere: [0, 1]
    assert GenerationConfig(stop=["", "x"]).stop == ("x",)
    assert options.OPTIONS["repeat_penalty"].rule.startswith("in (0, 10]")   # SamplingParams checks its penalties here too


def test_modelfile_parameters_use_the_same_table(tiny, tmp_path):
    d, target, _ = tiny
    cases = [
        ("PARAMETER temperature inf", "PARAMETER temperature must be a finite number, got inf"),
        ("PARAMETER temperature nan", "PARAMETER temperature must be a finite number"),
        ("PARAMETER seed -5", "PARAMETER seed must be between 0 and 4294967295 (-1: random), got -5"),
        ("PARAMETER top_p 1e999", "PARAMETER top_p must be a finite number"),
        ("PARAMETER num_thread 9999", "PARAMETER num_thread must be between 1 and 512"),
        ("PARAMETER mirostat_eta inf", "PARAMETER mirostat_eta must be a finite number"),
    ]
    for i, (line, _) in enumerate(cases):
        (tmp_path / f"Modelfile{i}").write_text(f"FROM {target}\n{line}\n")
    procs = cli_batch(*(["create", "m1", "-f", str(tmp_path / f"Modelfile{i}")] for i in range(len(cases))), ["list"])
    for (_, message), proc in zip(cases, procs):
        assert_one_error(proc, contains=message)
    assert procs[-1].returncode == 0
    mf = tmp_path / "Modelfile"
    mf.write_text(f"FROM {target}\nPARAMETER seed -1\nPARAMETER temperature 0\n")
    proc = cli("create", "m1", "-f", str(mf))
    assert proc.returncode == 0, proc.stderr
    proc = cli("generate", "m1", "-p", "hi", "--raw", "-n", "2", "--no-spec")
    assert proc.returncode == 0, proc.stderr


def test_mmap_environment_is_checked_and_both_loads_work(tiny):
    d, target, _ = tiny
    args = ("generate", "--target", str(target), "-p", "hi", "--raw", "-n", "3", "--no-spec")
    assert_one_error(cli(*args, env={"LOCALSPEC_MMAP": "maybe"}), contains="LOCALSPEC_MMAP must be 1 or 0")
    for value in ("1", "0"):
        proc = cli(*args, env={"LOCALSPEC_MMAP": value})
        assert proc.returncode == 0, proc.stderr[-2000:]


def test_threads_above_the_core_count_warn():
    assert options.threads_warning(1) is None
    many = options.threads_warning(512)
    assert many and many.startswith("warning: 512 threads on") and "--threads" in many


# -- GGUF files --------------------------------------------------------------------------------------
def test_drafter_rope_dimensions_beyond_its_head_are_refused(tiny, tmp_path):
    """GGML_ASSERT(n_dims <= ne0) used to abort the process."""
    d, target, drafter = tiny
    bad = rewrite_gguf(drafter, tmp_path / "rope.gguf", {"eagle3.rope.dimension_count": (2 * HEAD_DIM, U32)})
    with pytest.raises(LocalspecError, match="rope.dimension_count 32 must be even, positive and at most the head size 16"):
        check_pair(read_gguf(target), read_gguf(bad))
    assert_one_error(cli("generate", "--target", str(target), "--draft", str(bad), "-p", "hi", "-n", "2"),
                     contains="rope.dimension_count")
    works(target, "--draft", str(drafter))


@pytest.mark.parametrize("changes, message", [
    ({"eagle3.attention.head_count_kv": (3, U32)}, "cannot be shared by 3 KV heads"),
    ({"eagle3.attention.head_count": (0, U32)}, "missing or zero eagle3.attention.head_count"),
    ({"eagle3.attention.head_count_kv": (0, U32)}, "cannot be shared by 0 KV heads"),
    ({"eagle3.rope.dimension_count": (15, U32)}, "must be even"),
    ({"eagle3.rope.dimension_count": (0, U32)}, "must be even, positive"),   # made llama.cpp spin
    ({"eagle3.attention.key_length": (0, U32)}, "key_length must be a positive integer"),
    ({"eagle3.embedding_length": (0, U32)}, "zero embedding size"),
    ({"eagle3.block_count": (2, U32)}, "has one layer"),
    ({"eagle3.embedding_length": ("wide", gguf.GGUFValueType.STRING)}, "must be an integer"),
    ({"eagle3.target_layers": ("0,1,3", gguf.GGUFValueType.STRING)}, "must be a list of integers"),
    ({"eagle3.context_length": (-5, gguf.GGUFValueType.INT32)}, "must not be negative"),
])
def test_drafter_size_checks(tiny, tmp_path, changes, message):
    d, target, drafter = tiny
    bad = rewrite_gguf(drafter, tmp_path / "bad.gguf", changes)
    with pytest.raises(LocalspecError, match=message) as info:
        check_pair(read_gguf(target), read_gguf(bad))
    assert "\n" not in str(info.value)


def test_target_head_checks(tiny, tmp_path):
    d, target, _ = tiny
    bad = rewrite_gguf(target, tmp_path / "t.gguf", {"llama.attention.head_count": (5, U32),
                                                      "llama.attention.head_count_kv": (5, U32)})
    assert_one_error(cli("generate", "--target", str(bad), "-p", "hi", "-n", "2"),
                     contains="not a multiple of its 5 attention heads")


def _without_read_override() -> list[str]:
    """A command prefix under which file permissions apply: root reads anything unless it gives up
    CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH (setpriv drops them from the bounding set)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permissions cannot be tested")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]


def test_unreadable_gguf_is_one_line(tiny, tmp_path):
    """An unreadable GGUF as MODEL, --target, --draft or a Modelfile's FROM / DRAFT: one Error line."""
    d, target, drafter = tiny
    locked = tmp_path / "locked.gguf"
    locked.write_bytes(target.read_bytes())
    locked.chmod(0)
    prefix = _without_read_override()

    def run(*args):
        return subprocess.run([*prefix, sys.executable, "-m", "localspec", *args], capture_output=True, text=True,
                              timeout=120)

    try:
        proc = run("generate", str(locked), "-p", "hi")
        assert_one_error(proc, contains="cannot read (Permission denied)")
        assert_one_error(run("generate", "--target", str(locked), "-p", "hi"), contains="cannot read")
        assert_one_error(run("generate", "--target", str(target), "--draft", str(locked), "-p", "hi"),
                         contains="cannot read")
        assert_one_error(run("fit", "--target", str(locked)), contains="cannot read")
        mf = tmp_path / "Modelfile"
        for text in (f"FROM {locked}\n", f"FROM {target}\nDRAFT {locked}\n"):
            mf.write_text(text)
            assert_one_error(run("create", "locked", "-f", str(mf)), contains="cannot read")
        proc = run("generate", "--target", str(target), "-p", "hi", "--raw", "-n", "2", "--no-spec")
        assert proc.returncode == 0, proc.stderr   # the next run works
    finally:
        locked.chmod(0o644)


def test_unreadable_gguf_read_error_is_a_localspec_error(tmp_path, monkeypatch):
    """As root chmod does not stop reading: the OSError path itself, through read_gguf."""
    import builtins

    p = tmp_path / "x.gguf"
    p.write_bytes(b"GGUF" + bytes(60))
    real_open = builtins.open

    def deny(path, *a, **kw):
        if Path(path) == p:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", deny)
    with pytest.raises(LocalspecError, match="cannot read \\(Permission denied\\)"):
        read_gguf(p)


# -- text and files ----------------------------------------------------------------------------------
def test_prompt_and_system_with_invalid_utf8(tiny):
    d, target, _ = tiny
    for args in ([b"-p", b"\xff"], [b"-p", b"hi", b"--system", b"caf\xe9"], [b"-p", b"ok\xc3", b"--raw"]):
        proc = subprocess.run([sys.executable, "-m", "localspec", "generate", "--target", str(target), *args],
                              capture_output=True, text=True, errors="replace", timeout=120)
        assert_one_error(proc, contains="is not valid UTF-8 text")
    works(target)


def test_bench_files(tiny, tmp_path):
    d, target, _ = tiny
    cases = {
        "latin1.jsonl": ('{"prompt": "caf\xe9"}\n'.encode("latin-1"), "not a UTF-8 text file"),
        "surrogate.jsonl": (b'{"prompt": "\\ud800"}\n', "is not valid UTF-8 text"),
        "system7.jsonl": (b'{"prompt": "hi", "system": 7}\n', '"system" must be a string'),
        "list.jsonl": (b'[1, 2]\n', 'expected an object with a non-empty "prompt"'),
        "number.jsonl": (b'{"prompt": "hi"}\n7\n', ':2: expected an object'),
        "deep.jsonl": (b"[" * 100000 + b"]" * 100000 + b"\n", "not valid JSON"),
        "category.jsonl": (b'{"prompt": "hi", "category": ["a"]}\n', '"category" must be a string'),
    }
    for name, (data, _) in cases.items():
        (tmp_path / name).write_bytes(data)
    procs = cli_batch(*(["bench", "--target", str(target), "--prompts", str(tmp_path / name), "-n", "2"]
                        for name in cases))
    for (_, message), proc in zip(cases.values(), procs):
        assert_one_error(proc, contains=message)
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "hi", "system": "Be brief."}\n')
    proc = cli("bench", "--target", str(target), "--prompts", str(good), "-n", "2", "--json")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("content", ["[]", '{"version": 2, "entries": []}', '{"version": 2, "entries": {"k": 1}}',
                                     "\xff\xfe", "{"])
def test_calibration_cache_of_the_wrong_shape_counts_as_absent(tmp_path, content):
    from localspec.speculation import cost_cache, costmodel

    cache = tmp_path / "calibration.json"
    cache.write_bytes(content.encode("latin-1"))
    notes = []
    calls = []

    def calibrate():
        calls.append(1)
        return {1: 0.01, 2: 0.015}, 0.002, 1.5, True

    model = costmodel.load_or_calibrate("k", cache, calibrate, note=notes.append)
    assert calls == [1] and model.verify(1) == pytest.approx(0.01)
    assert json.loads(cache.read_text())["entries"]["k"]["verify"]["1"] == pytest.approx(0.01)  # replaced
    # a broken entry under the right key: recalibrated, with a note for --verbose
    cache.write_text(json.dumps({"version": cost_cache.CACHE_VERSION,
                                 "entries": {"k": {"verify": {"1": "fast"}, "drafter_step": None}}}))
    costmodel.load_or_calibrate("k", cache, calibrate, note=notes.append)
    assert len(calls) == 2 and any("bad verify figure" in n for n in notes)


def test_train_inputs(tiny, tmp_path):
    pytest.importorskip("torch")
    d, target, _ = tiny
    binary = tmp_path / "data.jsonl"
    binary.write_bytes(bytes(range(256)) * 4)
    assert_one_error(cli("train", "--target", str(target), "-o", str(tmp_path / "o.gguf"), "--data", str(binary)),
                     contains="not a dataset")
    gz = tmp_path / "data.jsonl.gz"
    gz.write_bytes(b"not gzip at all")
    assert_one_error(cli("train", "--target", str(target), "-o", str(tmp_path / "o.gguf"), "--data", str(gz)),
                     contains="cannot read the dataset")
    existing = tmp_path / "exists.gguf"
    existing.write_bytes(b"keep me")
    assert_one_error(cli("train", "--target", str(target), "-o", str(existing), "--data", str(binary)),
                     contains="exists (use --force to overwrite)")
    assert existing.read_bytes() == b"keep me"


def test_convert_of_a_missing_local_path_says_so(tiny, tmp_path, monkeypatch):
    d, target, _ = tiny
    (tmp_path / "ckpts").mkdir()
    monkeypatch.chdir(tmp_path)
    for src in ("./nope", "/no/such/dir", "a/b/c", "ckpts/eagle"):
        line = assert_one_error(cli("convert", src, "--target", str(target), "-o", str(tmp_path / "o.gguf")),
                                contains="no such file or directory")
        assert "Hugging Face" not in line, line


# -- chat templates ----------------------------------------------------------------------------------
RUNAWAY = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"


@pytest.mark.parametrize("template, message", [
    ("{{ 1/0 }}", "ZeroDivisionError"),
    ("{{ range(10**9)|list }}", "Range too big"),
    (RUNAWAY, "ran for more than"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}0123456789{% endfor %}{% endfor %}", "wrote more than"),
    ("{{ 'x' * 10**10 }}", "too large"),
    ("{{ [0] * 10**9 }}", "too large"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    ("{{ messages.__class__.__mro__ }}", "unsafe"),
    ("{% for %}", "does not parse"),
])
def test_chat_template_failures_are_one_line_and_bounded(template, message):
    t0 = time.perf_counter()
    with pytest.raises(LocalspecError, match=message) as info:
        ChatFormatter(template, name="the chat template of x.gguf").render([{"role": "user", "content": "hi"}])
    assert time.perf_counter() - t0 < 10
    assert str(info.value).startswith("the chat template of x.gguf") and "\n" not in str(info.value)


def test_runaway_template_does_not_hang_generate(tmp_path):
    target = build_target(tmp_path / "loop.gguf", "repeat", chat_template=RUNAWAY)
    t0 = time.perf_counter()
    assert_one_error(cli("generate", "--target", str(target), "-p", "hi", "-n", "2", "--no-spec"),
                     contains="the chat template of loop.gguf ran for more than")
    assert time.perf_counter() - t0 < 60
    works(target)   # --raw does not render the template
    bad = build_target(tmp_path / "div.gguf", "repeat", chat_template="{{ 1/0 }}")
    assert_one_error(cli("generate", "--target", str(bad), "-p", "hi", "-n", "2", "--no-spec"),
                     contains="ZeroDivisionError")
