"""MTP heads inside the target GGUF as a draft source (localspec.speculation.mtp), on tiny step35
targets written with ``gguf`` (tests/mtp_models.py): recognised from the file's metadata with no
drafter file, lossless (greedy output equal to plain decoding; sampled output from the target's
distribution), named ``mtp`` in the stats and on ``--source``."""

from __future__ import annotations

import json

import pytest

from cli_run import run_cli
from engine_checks import assert_lossless
from localspec import Engine
from localspec.core.errors import LocalspecError
from localspec.core.events import DoneEvent
from localspec.formats.gguf_info import mtp_heads, read_gguf
from localspec.runtime.config import GenerationConfig
from localspec.speculation.policy import PolicyConfig
from mtp_models import build_mtp_target
from peer_tool import native_tool
from sampling_checks import assert_drafts_keep_the_distribution

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


@pytest.fixture(scope="module")
def mtp_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp")
    return {"one": build_mtp_target(d / "one.gguf", heads=1),
            "three": build_mtp_target(d / "three.gguf", heads=3, seed=5),
            "none": build_mtp_target(d / "none.gguf", heads=1, with_heads=False),
            "noisy": build_mtp_target(d / "noisy.gguf", heads=1, noise=0.009, seed=3)}


def _done(engine, prompt, cfg) -> DoneEvent:
    return [e for e in engine.generate(prompt, cfg) if isinstance(e, DoneEvent)][0]


def test_mtp_heads_are_recognised_from_the_target_s_metadata(mtp_files):
    assert mtp_heads(read_gguf(mtp_files["one"])) == 1
    assert mtp_heads(read_gguf(mtp_files["none"])) == 0
    proc = run_cli("inspect", str(mtp_files["one"]), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mtp_heads"] == 1
    for name, heads in (("one", 1), ("none", 0)):   # fit names them (their blocks count with the target)
        proc = run_cli("fit", "--target", str(mtp_files[name]), "--ctx", "256", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["mtp_heads"] == heads


@pytest.mark.parametrize("policy", [PolicyConfig("fixed", 4, tree="off"), PolicyConfig("fixed", 3, tree="on"),
                                    PolicyConfig("auto")], ids=["chain", "tree", "auto"])
def test_mtp_greedy_output_equals_plain_decoding(mtp_files, policy):
    with Engine(mtp_files["one"], n_ctx=512) as engine:
        assert engine.mtp_heads == 1 and engine.drafter is not None and engine.drafter.name == "mtp"
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=48, spec=False, record_margins=True))
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=48, policy=policy))
    assert_lossless(plain, spec)
    if policy.name == "fixed":
        drafts, drafted, accepted = spec.stats.sources["mtp"] if policy.tree == "off" else spec.stats.sources["tree"]
        assert drafted > 0 and 0 < accepted, spec.stats.sources


def test_mtp_chained_heads_load_and_draft_losslessly(mtp_files):
    """A step35 file with three heads, chained as llama.cpp chains them (head k drafts step k):
    no chain is deeper than the heads, and greedy output is plain decoding's."""
    assert mtp_heads(read_gguf(mtp_files["three"])) == 3
    with Engine(mtp_files["three"], n_ctx=256) as engine:
        assert engine.mtp_heads == 3
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=32, spec=False, record_margins=True))
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=32, policy=PolicyConfig("fixed", 6, tree="on")))
    assert_lossless(plain, spec)
    drafts, drafted, accepted = spec.stats.sources["mtp"]   # chains (trees are off with chained heads)
    assert drafted > 0 and accepted > 0 and len(spec.stats.drafted_per_position) <= 3, spec.stats


@pytest.mark.parametrize("heads", ["one", "three"])
def test_mtp_drafts_in_every_slot_of_a_parallel_engine(mtp_files, heads):
    """Two slots draft with their own sequences of the head's context in shared batches (each an
    MtpSequence: chained heads keep each slot's draft prefix apart); each answer is the one plain
    decoding gives alone."""
    from engine_checks import assert_slots_lossless

    cfg = GenerationConfig(max_tokens=24, policy=PolicyConfig("fixed", 3, source="mtp"))
    assert_slots_lossless(mtp_files[heads], None, [PROMPT, "One, two, three, four, five, six"], cfg, "mtp")


def test_mtp_sampled_output_follows_the_target_s_distribution(mtp_files):
    """Marginal distributions of generated tokens 3..6, plain vs MTP-drafted, over many seeds: the
    head proposes repeats the target often but not always makes, so drafts are accepted and
    rejected (and resampled)."""
    with Engine(mtp_files["noisy"], n_ctx=256) as engine:
        assert_drafts_keep_the_distribution(engine, dict(temperature=0.4, top_k=8, top_p=1.0, min_p=0.0))


def test_source_mtp_needs_heads_and_is_one_error_line(mtp_files):
    with pytest.raises(LocalspecError, match="no MTP heads"):
        Engine(mtp_files["none"], n_ctx=256, mtp=True)
    proc = run_cli("generate", "--target", str(mtp_files["none"]), "-p", "hi", "--source", "mtp", "-n", "4")
    assert proc.returncode == 1 and proc.stderr.startswith("Error:") and "no MTP heads" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("generate", "--target", str(mtp_files["one"]), "-p", "hi", "--source", "mtp", "-n", "8",
                   "--temperature", "0", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["mtp_heads"] == 1 and set(out["sources"]) <= {"mtp", "lookup"}, out


def test_mtp_chains_with_lookup_as_llama_cpp_chains_draft_mtp_ngram_mod(mtp_files):
    """``--source mtp,lookup``: the heads and n-gram lookup weighed against each other (auto), or
    the heads every cycle (fixed); greedy output is plain decoding's, and the CLI takes the list."""
    with Engine(mtp_files["one"], n_ctx=512) as engine:
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=48, spec=False, record_margins=True))
        runs = {}
        for name in ("auto", "fixed"):
            engine.clear_cache()
            policy = PolicyConfig(name, 4, source="mtp,lookup", tree="off")
            runs[name] = _done(engine, PROMPT, GenerationConfig(max_tokens=48, policy=policy))
            assert_lossless(plain, runs[name])
            assert set(runs[name].stats.sources) <= {"mtp", "lookup"}, runs[name].stats.sources
    assert runs["fixed"].stats.sources["mtp"][2] > 0, runs["fixed"].stats.sources
    proc = run_cli("generate", "--target", str(mtp_files["one"]), "-p", PROMPT, "--raw", "--source", "lookup,mtp",
                   "-n", "24", "--policy", "fixed", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["mtp_heads"] == 1 and out["sources"].get("mtp", {}).get("drafted", 0) > 0, out


def test_a_server_of_an_mtp_target_drafts_with_its_heads_and_names_them(mtp_files, tmp_path):
    """``serve`` on a target with heads and no drafter file: the official client's answer is plain
    decoding's text, usage counts the drafts under source ``mtp``, and so does ``/metrics``."""
    from serve_checks import running_server

    with Engine(mtp_files["one"], n_ctx=256) as engine:
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=24, spec=False))
    args = ("--target", str(mtp_files["one"]), "--ctx", "256", "--parallel", "1", "--policy", "fixed",
            "--draft-max", "3", "--tree", "off")
    with running_server(tmp_path, *args) as srv:
        reply = srv.client().completions.create(model=mtp_files["one"].stem, prompt=PROMPT, max_tokens=24,
                                                temperature=0, extra_body={"repeat_penalty": 1.0})
        speculative = reply.usage.model_extra["speculative"]
        metrics = srv.metrics()
    assert reply.choices[0].text == plain.text
    assert speculative["sources"]["mtp"]["drafted"] > 0, speculative
    drafted = [v for (name, labels), v in metrics.items()
               if name.endswith("draft_tokens_by_source_total") and ("source", "mtp") in labels]
    assert drafted and drafted[0] > 0, sorted(k for k in metrics if "source" in str(k))


@pytest.mark.parametrize("heads", [1, 3], ids=["one-head", "chained-heads"])
def test_mtp_drafts_are_llama_cpp_s_own_draft_mtp_drafts(tmp_path, heads):
    """bench/peer_mtp_drafts.py on one prompt: every draft llama.cpp's ``draft-mtp`` made, drafted
    again by MtpDrafter from the same context, and the drafts of localspec's own generation made
    after the same committed text, are token for token llama.cpp's. Runs only where the native
    tool was built (docs/speculation.md gives the full bench's figures)."""
    import importlib.util
    from pathlib import Path

    tool = native_tool()
    if tool is None:
        pytest.skip("llama-speculative-simple of the pinned llama.cpp not built (bench/peer_llamacpp.py)")
    spec = importlib.util.spec_from_file_location(
        "peer_mtp_drafts", Path(__file__).resolve().parents[1] / "bench" / "peer_mtp_drafts.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    target = build_mtp_target(tmp_path / "mtp.gguf", heads=heads, head_noise=0.05)
    with Engine(target, n_ctx=512) as engine:
        same, steps, whole, drafts, g_same, g_steps, g_whole, g_drafts = bench.compare(
            engine, tool, target, PROMPT, 24, 3, verbose=False)
    assert drafts >= 4 and steps > drafts and g_drafts >= 2 and g_steps > g_drafts, (drafts, steps, g_drafts, g_steps)
    assert (same, whole) == (steps, drafts) and (g_same, g_whole) == (g_steps, g_drafts)


def test_fit_names_the_mtp_heads_weights_and_kv_and_llama_cpp_allocates_them(mtp_files):
    """``fit`` plans the heads as a part of their own (``mtp`` in --json, a row in the tables): their
    blocks' weights, the MTP context's F16 KV over their layers only (the target's KV holds the
    trunk's), its compute buffer; and llama.cpp allocates what was planned."""
    from localspec.memory.live import memory_report
    from localspec.memory.pair import plan_engine
    from localspec.store.models import ModelSpec

    for name, heads in (("one", 1), ("three", 3)):
        info = read_gguf(mtp_files[name])
        head_bytes = sum(t.n_bytes for t in info.tensors.values()
                         if any(t.name.startswith(f"blk.{i}.") for i in range(info.n_layer - heads, info.n_layer)))
        kv_layer = 256 * 2 * 16 * 2 * 2          # context x 2 KV heads x 16 x (K and V) x f16
        out = json.loads(run_cli("fit", "--target", str(mtp_files[name]), "--ctx", "256", "--json").stdout)
        mtp = out["mtp"]
        assert (mtp["role"], mtp["n_units"], mtp["kv_type"]) == ("mtp heads", heads, "f16"), mtp
        assert mtp["weights_bytes"] == head_bytes and mtp["kv_bytes"] == heads * kv_layer, mtp
        assert out["target"]["kv_bytes"] == 2 * kv_layer * {"f16": 1, "q8_0": 17 / 32, "q4_0": 9 / 32}[out["kv_type"]]
        assert mtp["compute_bytes"] > 0 and out["devices"][0]["mtp_bytes"] == mtp["total_bytes"], out
        assert out["total_bytes"] == out["target"]["total_bytes"] + mtp["total_bytes"]
        options = plan_engine(ModelSpec("t", mtp_files[name]), n_ctx=256, n_threads=1, ram=1 << 40, kv_type="f16")
        with Engine(mtp_files[name], n_threads=1, **options) as engine:
            report = memory_report(engine)
        actual, planned = report["actual"], report["planned"]   # llama.cpp logs MiB with 2 decimals
        assert abs(actual["target"]["kv_bytes"] - planned["target"]["kv_bytes"]) <= 6000, report
        assert abs(actual["drafter"]["kv_bytes"] - planned["mtp"]["kv_bytes"]) <= 6000, report
        assert abs(actual["drafter"]["compute_bytes"] - planned["mtp"]["compute_bytes"]) <= 6000, report
        weights = planned["target"]["weights_bytes"] + planned["mtp"]["weights_bytes"]
        assert abs(actual["target"]["weights_bytes"] - weights) <= 6000, report
    # with a drafter file llama.cpp skips the heads' tensors (no load_mtp): not counted at all
    from localspec.memory import planner
    info = read_gguf(mtp_files["three"])
    loaded, skipped = planner.layout(info, mtp=True), planner.layout(info, mtp=False)
    assert loaded.weights_bytes - skipped.weights_bytes == 543744 and skipped.n_nextn == 3 and not skipped.mtp
    assert planner.kv_bytes(loaded, 256, "f16") == planner.kv_bytes(skipped, 256, "f16") == 2 * kv_layer
    assert planner.mtp_kv_bytes(loaded, 256) == 3 * kv_layer and planner.mtp_kv_bytes(skipped, 256) == 0
    assert json.loads(run_cli("fit", "--target", str(mtp_files["none"]), "--ctx", "256", "--json").stdout)["mtp"] is None
    text = run_cli("fit", "--target", str(mtp_files["one"]), "--ctx", "256").stdout
    assert "mtp heads" in text and "counted in the target's row" not in text, text
