"""Gemma 4's assistant GGUF as the drafter file (localspec.speculation.assistant), on a tiny gemma4
target and its tiny gemma4-assistant written with ``gguf`` (tests/gemma4_models.py): recognised
from its metadata and checked against its target, reading the target's KV cache, lossless (greedy
output equal to plain decoding; sampled output from the target's distribution), named
``assistant`` in the stats and on ``--source``, and given by a Modelfile's ``DRAFT``. The tests'
names say ``assistant`` (``pytest -k assistant``) and those of the lossless ones ``mtp`` too
(llama.cpp drafts with it through ``draft-mtp``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chat_checks import assert_chat_drafts_with
from cli_run import assert_one_error, cli_batch, one_error_cli, run_cli
from engine_checks import assert_lossless
from gemma4_models import build_gemma4_assistant, build_gemma4_target
from localspec import Engine
from localspec.core.errors import LocalspecError
from localspec.core.events import DoneEvent
from localspec.formats.gguf_info import check_pair, read_gguf
from localspec.runtime.config import GenerationConfig
from localspec.speculation.policy import PolicyConfig
from sampling_checks import assert_drafts_keep_the_distribution
from tiny_models import build_target, rewrite_gguf

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


@pytest.fixture(scope="module")
def g4(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemma4")
    return {"target": build_gemma4_target(d / "target.gguf"),
            "assistant": build_gemma4_assistant(d / "assistant.gguf"),
            "wide": build_gemma4_assistant(d / "wide.gguf", n_embd_out=48),
            "target16": build_gemma4_target(d / "target16.gguf", window=16),   # sliding layers that cut
            "assistant16": build_gemma4_assistant(d / "assistant16.gguf", window=16),
            "llama": build_target(d / "llama.gguf"),
            "dir": d}


def _done(engine, prompt, cfg) -> DoneEvent:
    return [e for e in engine.generate(prompt, cfg) if isinstance(e, DoneEvent)][0]


def test_gemma4_assistant_is_recognised_and_checked_against_its_target(g4):
    info = read_gguf(g4["assistant"])
    assert info.is_assistant and not info.is_drafter
    check_pair(read_gguf(g4["target"]), info)
    for target, drafter, message in (("target", "wide", "made for a target of hidden size 48, but target.gguf has 64"),
                                     ("llama", "assistant", "it drafts for a gemma4 target, and llama.gguf is 'llama'"),
                                     ("assistant", "assistant", "is a Gemma 4 assistant (a drafter), not a target")):
        with pytest.raises(LocalspecError) as caught:
            check_pair(read_gguf(g4[target]), read_gguf(g4[drafter]))
        assert message in str(caught.value), caught.value
    proc = run_cli("inspect", str(g4["assistant"]), "--json")
    assert proc.returncode == 0, proc.stderr
    desc = json.loads(proc.stdout)
    assert desc["kind"] == "drafter" and desc["draft_source"] == "assistant" and "gemma4" in desc["drafts_for"]
    proc = run_cli("fit", "--target", str(g4["target"]), "--draft", str(g4["assistant"]), "--ctx", "256", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)   # the assistant has no KV of its own; the target's shared-KV layers none either
    assert plan["drafter"]["kv_bytes"] == 0 and plan["target"]["kv_bytes"] == 256 * 2 * (2 * 32 * 2) * 2, plan


def test_a_hostile_assistant_is_one_error_line_before_llama_cpp_sees_it(g4):
    """Assistants whose shapes llama.cpp would misread (views of the target's K/V of another
    size) or assert on: each ``generate`` is one ``Error:`` line, in one child process that a
    native abort would kill."""
    import gguf

    u32, arr, boolean = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.BOOL
    arch = "gemma4-assistant"
    cases = {"kv_heads": ({f"{arch}.attention.head_count_kv": (1, u32)}, "heads of 16 with 1 heads of 16"),
             "swa_heads": ({f"{arch}.attention.key_length_swa": (8, u32)}, "with 2 heads of 8"),
             "no_sliding": ({f"{arch}.attention.sliding_window_pattern": ([False, False], arr, boolean)},
                            "at least one sliding"),
             "nextn": ({f"{arch}.nextn_predict_layers": (1, u32)}, "nextn_predict_layers must equal block_count 2"),
             "no_width": ({f"{arch}.embedding_length_out": None}, "embedding_length_out must carry"),
             "heads": ({f"{arch}.attention.head_count": (3, u32)}, "3 attention heads cannot be shared by 2")}
    files = {name: rewrite_gguf(g4["assistant"], g4["dir"] / f"bad-{name}.gguf", changes)
             for name, (changes, _) in cases.items()}
    procs = cli_batch(*[["generate", "--target", str(g4["target"]), "--draft", str(files[name]), "-p", "hi", "-n", "2"]
                        for name in cases])
    for (name, (_, message)), proc in zip(cases.items(), procs):
        assert_one_error(proc, contains=message)


def test_the_assistant_reads_the_target_s_cache_and_writes_nothing(g4):
    """The same (token, state) drafted at the same position after two prompts of the same length:
    logits differ only through the target's cells the assistant attends to; the target's cache
    is untouched by drafting."""
    out = []
    with Engine(g4["target"], g4["assistant"], n_ctx=256) as engine:
        d, ctx = engine.drafters[0], engine.ctx   # the drafter's sequence 0
        assert d.name == "assistant"
        for prompt in ("one two three four five six seven", "alpha beta gamma delta epsilon zeta eta"):
            tokens = engine.model.tokenize(prompt)[:6] + [engine.model.tokenize(" fox")[-1]]
            ctx.seq_rm(0)
            ctx.decode(tokens, 0, all_logits=False)
            d.begin(tokens, 0)
            d.observe(tokens[1:] + [tokens[-1]], len(tokens), 0)
            first, state = d.catch_up()
            assert np.isfinite(first).all() and ctx.pos_max(0) == len(tokens) - 1
            logits, _ = d.decode([tokens[-1]], np.ones((1, d.n_embd), np.float32), len(tokens))
            assert ctx.pos_max(0) == len(tokens) - 1   # drafting wrote nothing into the target's cache
            out.append(np.array(logits))
        ctx.seq_rm(0)
    assert np.isfinite(out[0]).all() and np.abs(out[0] - out[1]).max() > 1e-6


def test_the_assistant_drafts_from_the_pair_draft_mtp_writes(g4):
    """Every draft of a generation starts, as draft-mtp's shared-KV mode starts it, from the
    committed token at ``pos0`` (the first position the target has not decoded) and the target's
    state at ``pos0 - 1``: checked against the states of the whole committed text decoded by the
    target alone in one batch."""
    from localspec.llama import llama_ext
    from localspec.llama.llama_model import Context, Model

    seen = []
    with Engine(g4["target"], g4["assistant"], n_ctx=256) as engine:
        drafter = engine.drafters[0]
        catch_up = drafter.catch_up

        def recording(max_rows=None):
            tok, h, pos0 = drafter._last
            seen.append((tok, np.array(h[0]), pos0))
            return catch_up(max_rows)

        drafter.catch_up = recording
        done = _done(engine, PROMPT, GenerationConfig(max_tokens=32, policy=PolicyConfig("fixed", 3, tree="off")))
        prompt = engine.prompt_tokens(PROMPT)
        text = prompt + done.tokens
    model = Model(g4["target"])
    ctx = Context(model, n_ctx=256, n_batch=256)
    try:
        llama_ext.set_embeddings_nextn(ctx.ptr, True, False)
        ctx.decode(text, 0, all_logits=False)
        states = np.array(np.ctypeslib.as_array(llama_ext.get_embeddings_nextn(ctx.ptr), shape=(len(text), model.n_embd)))
    finally:
        ctx.close()
        model.close()
    assert len(seen) > 3 and seen[0][2] == len(prompt), [s[2] for s in seen]   # the first: right after the prompt
    for tok, h, pos0 in seen:
        assert tok == text[pos0], (pos0, tok, text[pos0])
        assert np.abs(h - states[pos0 - 1]).max() < 1e-3, pos0


@pytest.mark.parametrize("policy,window", [(PolicyConfig("fixed", 4, tree="off"), ""),
                                           (PolicyConfig("fixed", 3, tree="on"), ""), (PolicyConfig("auto"), ""),
                                           (PolicyConfig("fixed", 4, tree="off"), "16")],
                         ids=["chain", "tree", "auto", "chain-window16"])
def test_assistant_mtp_greedy_output_equals_plain_decoding(g4, policy, window):
    """Chains, trees and the auto policy; and chains past the sliding window of 16 positions of
    the target's sliding layers (the assistant's sliding layer reads what that cache keeps)."""
    with Engine(g4["target" + window], g4["assistant" + window], n_ctx=512) as engine:
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=48, spec=False, record_margins=True))
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=48, policy=policy))
    assert_lossless(plain, spec)
    if policy.name == "fixed":
        drafts, drafted, accepted = spec.stats.sources["assistant" if policy.tree == "off" else "tree"]
        assert drafted > 0 and 0 < accepted < drafted, spec.stats.sources


def test_assistant_mtp_drafts_in_every_slot_of_a_parallel_engine(g4):
    """Two slots draft at their own positions over their own sequences of the target's cache, in
    shared assistant batches; each answer is the one plain decoding gives alone."""
    from engine_checks import assert_slots_lossless

    cfg = GenerationConfig(max_tokens=24, policy=PolicyConfig("fixed", 3, source="assistant"))
    assert_slots_lossless(g4["target"], g4["assistant"], [PROMPT, "One, two, three, four, five, six"], cfg,
                          "assistant")


def test_assistant_mtp_sampled_output_follows_the_target_s_distribution(g4):
    """Marginal distributions of generated tokens 3..6, plain vs assistant-drafted, over many
    seeds: the assistant proposes repeats the target often but not always makes, so drafts are
    accepted and rejected (and resampled)."""
    with Engine(g4["target"], g4["assistant"], n_ctx=256) as engine:
        assert_drafts_keep_the_distribution(engine, dict(temperature=0.6, top_k=8, top_p=1.0, min_p=0.0))


def test_a_mismatched_assistant_and_source_assistant_without_one_are_one_error_line(g4):
    proc = one_error_cli("generate", "--target", str(g4["target"]), "--draft", str(g4["wide"]), "-p", "hi", "-n", "4")
    assert_one_error(proc, contains="made for a target of hidden size 48")
    proc = run_cli("generate", "--target", str(g4["target"]), "-p", "hi", "--source", "assistant", "-n", "4")
    assert proc.returncode == 1 and proc.stderr.startswith("Error:") and "has no Gemma 4 assistant" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_modelfile_drafts_with_the_assistant_it_names_in_draft(g4, tmp_path):
    """``DRAFT`` pointing at the assistant: ``create`` checks the pair, ``generate`` drafts with it
    (source ``assistant``) and writes plain decoding's text."""
    (tmp_path / "Modelfile").write_text(f"FROM {g4['target']}\nDRAFT {g4['assistant']}\nPARAMETER temperature 0\n")
    assert run_cli("create", "g4", "-f", str(tmp_path / "Modelfile")).returncode == 0
    with Engine(g4["target"], g4["assistant"], n_ctx=256) as engine:
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=16, spec=False))
    proc = run_cli("generate", "g4", "-p", PROMPT, "--raw", "-n", "16", "--policy", "fixed", "--draft-max", "3",
                   "--tree", "off", "--ctx", "256", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["drafter"] == str(g4["assistant"]) and out["text"] == plain.text, out
    assert out["sources"]["assistant"]["drafted"] > 0, out["sources"]
    (tmp_path / "Bad").write_text(f"FROM {g4['target']}\nDRAFT {g4['wide']}\n")
    proc = run_cli("create", "bad", "-f", str(tmp_path / "Bad"))
    assert proc.returncode == 1 and "Bad:2:" in proc.stderr and "hidden size 48" in proc.stderr, proc.stderr


def test_a_server_with_an_assistant_drafts_with_it_and_names_it(g4, tmp_path):
    """``serve --draft`` the assistant: the official client's answer is plain decoding's text,
    usage counts the drafts under source ``assistant``, and so does ``/metrics``; Ollama's
    ``/api/show`` lists the source."""
    from serve_checks import running_server

    with Engine(g4["target"], g4["assistant"], n_ctx=256) as engine:
        plain = _done(engine, PROMPT, GenerationConfig(max_tokens=24, spec=False))
    args = ("--target", str(g4["target"]), "--draft", str(g4["assistant"]), "--ctx", "256", "--parallel", "1",
            "--policy", "fixed", "--draft-max", "3", "--tree", "off")
    with running_server(tmp_path, *args) as srv:
        reply = srv.client().completions.create(model=g4["target"].stem, prompt=PROMPT, max_tokens=24,
                                                temperature=0, extra_body={"repeat_penalty": 1.0})
        speculative = reply.usage.model_extra["speculative"]
        metrics = srv.metrics()
        shown = srv.http.post("/api/show", json={"model": g4["target"].stem}).json()["draft"]
    assert reply.choices[0].text == plain.text
    assert shown["sources"] == ["assistant", "lookup"] and shown["drafter"]["variant"] == "gemma4-assistant", shown
    assert speculative["sources"]["assistant"]["drafted"] > 0, speculative
    drafted = [v for (name, labels), v in metrics.items()
               if name.endswith("draft_tokens_by_source_total") and ("source", "assistant") in labels]
    assert drafted and drafted[0] > 0, sorted(k for k in metrics if "source" in str(k))


def test_the_chat_drafts_with_the_assistant_and_names_it(g4, isolated_home):
    """The terminal chat on the pair: F3's rows name the assistant, and a reply drafts with it."""
    assert_chat_drafts_with(lambda: Engine(g4["target"], g4["assistant"], n_ctx=256, n_threads=1), "tiny-g4",
                            draft_max=3, drafter_row="assistant.gguf: Gemma 4's assistant, source assistant",
                            source="assistant")
