"""Speculation on a hybrid recurrent target (llama.cpp's ``qwen35``, Qwen3.5/3.6: gated delta nets
beside attention), on tiny files written with ``gguf`` (tests/hybrid_models.py).

A rejected draft must leave the recurrent state as plain decoding leaves it: the context keeps
llama.cpp's rollback snapshots (``n_rs_seq``), the policy drafts no deeper than they reach, and a
cached prompt is reused only where the cut is exact (localspec.runtime.recurrent). Greedy output
with n-gram lookup drafts and with the file's MTP head equals plain decoding, in one slot and two;
sampled output follows the target's distribution."""

from __future__ import annotations

import json

import pytest

from cli_run import run_cli
from engine_checks import assert_lossless, assert_slots_lossless, seed_calibration, solo
from hybrid_models import build_hybrid_target
from localspec import Engine
from localspec.core.events import DoneEvent
from localspec.core.paths import user_dir
from localspec.llama.contexts import RS_ROLLBACK
from localspec.runtime.config import GenerationConfig
from localspec.speculation.policy import PolicyConfig
from sampling_checks import assert_drafts_keep_the_distribution

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"
OTHER = "One, two, three, four, five, six"


@pytest.fixture(scope="module")
def hybrid_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid")
    return {"plain": build_hybrid_target(d / "plain.gguf"),
            "mtp": build_hybrid_target(d / "mtp.gguf", with_head=True),
            "noisy": build_hybrid_target(d / "noisy.gguf", with_head=True, noise=0.005, seed=3),
            "next": build_hybrid_target(d / "next.gguf", arch="qwen3next", with_head=True),
            "moe": build_hybrid_target(d / "moe.gguf", arch="qwen35moe", with_head=True)}


def _done(engine, prompt, cfg) -> DoneEvent:
    return [e for e in engine.generate(prompt, cfg) if isinstance(e, DoneEvent)][0]


def _plain(engine, prompt, n=48) -> DoneEvent:
    engine.clear_cache()
    return _done(engine, prompt, GenerationConfig(max_tokens=n, spec=False, record_margins=True))


def test_hybrid_context_keeps_rollback_snapshots_and_refuses_inexact_cuts(hybrid_files):
    """The target context of a qwen35 file keeps RS_ROLLBACK snapshots per sequence; a cut is
    allowed within the last decode's rows only, once between decodes."""
    with Engine(hybrid_files["plain"], n_ctx=256) as engine:
        ctx = engine.ctx
        assert engine.model.recurrent and ctx.rollback == RS_ROLLBACK and engine.spec_note is None
        ctx.decode(list(range(100, 110)), 0, all_logits=False)   # positions 0..9
        assert ctx.can_seq_rm(10) and ctx.can_seq_rm(0)               # nothing, everything
        assert ctx.can_seq_rm(10 - RS_ROLLBACK) and not ctx.can_seq_rm(9 - RS_ROLLBACK)   # the snapshots' reach
        ctx.seq_rm(7)
        assert ctx.pos_max() == 6 and not ctx.can_seq_rm(6)          # one rollback between decodes
        assert ctx.seq_state(0) is None                               # llama.cpp would save the state before it
        ctx.decode([7], 7, all_logits=False)
        assert not ctx.can_seq_rm(7) and ctx.can_seq_rm(8)            # a one-row decode: no snapshot before it
        ctx.seq_rm(0)


@pytest.mark.parametrize("policy", [PolicyConfig("fixed", 4, source="lookup"), PolicyConfig("fixed", 16, tree="on"),
                                    PolicyConfig("auto")], ids=["lookup", "deeper-than-rollback", "auto"])
def test_hybrid_greedy_lookup_drafts_equal_plain_decoding(hybrid_files, policy):
    with Engine(hybrid_files["plain"], n_ctx=512) as engine:
        # auto plans with a calibration (a CPU-shaped one, as an earlier run leaves it), not with the
        # guess its first cycles correct: whether it drafts then depends on nothing but the text
        seed_calibration(user_dir() / "calibration.json", engine.cost_key())
        plain = _plain(engine, PROMPT)
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=48, policy=policy))
    assert_lossless(plain, spec)
    drafts, drafted, accepted = spec.stats.sources["lookup"]
    assert accepted > 0 and (drafted > accepted or policy.name == "auto"), spec.stats.sources   # rolled back
    assert len(spec.stats.drafted_per_position) <= RS_ROLLBACK   # no draft deeper than the snapshots reach


def test_hybrid_prefix_reuse_gives_what_a_fresh_cache_gives(hybrid_files):
    """A second prompt sharing the first's prefix, then one that continues the first's answer
    (a chat's next turn): each answer is the one a fresh cache gives (the cache cut where the
    state can be cut, else the prompt prefilled whole)."""
    cfg = GenerationConfig(max_tokens=24, policy=PolicyConfig("fixed", 4, source="lookup"))
    with Engine(hybrid_files["plain"], n_ctx=512) as engine:
        first = _done(engine, PROMPT, cfg)
        prompts = [PROMPT + first.text + " The end.", PROMPT[:30] + " and the cat"]
        reused = []
        for p in prompts:
            reused.append(_done(engine, p, cfg))
        assert reused[0].stats.prompt_cached > len(first.tokens)   # the first prompt and answer were kept
        for p, got in zip(prompts, reused):
            assert_lossless(_plain(engine, p, 24), got)


def test_hybrid_two_slots_draft_and_equal_plain_decoding(hybrid_files):
    def keeps_snapshots(engine) -> None:
        assert engine.ctx.rollback == RS_ROLLBACK

    cfg = GenerationConfig(max_tokens=32, policy=PolicyConfig("fixed", 4, source="lookup"))
    assert_slots_lossless(hybrid_files["plain"], None, [PROMPT, OTHER], cfg, "lookup", rounds=2,
                          on_engine=keeps_snapshots)


def test_hybrid_cli_generate_with_lookup_is_plain_decoding_s_text(hybrid_files):
    path = str(hybrid_files["plain"])
    out = {}
    for name, extra in (("plain", ("--no-spec",)), ("lookup", ("--source", "lookup"))):
        proc = run_cli("generate", "--target", path, "-p", PROMPT, "-n", "32", "--temperature", "0", "--json", *extra)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        out[name] = json.loads(proc.stdout)
    assert out["lookup"]["text"] == out["plain"]["text"]


@pytest.mark.parametrize("name,policy", [("mtp", PolicyConfig("fixed", 4, tree="off")), ("mtp", PolicyConfig("auto")),
                                         ("moe", PolicyConfig("fixed", 4, tree="off"))], ids=["chain", "auto", "qwen35moe"])
def test_hybrid_mtp_greedy_output_equals_plain_decoding(hybrid_files, name, policy):
    """The qwen35 (and qwen35moe) file's NextN block drafts (its context a plain KV cache of the
    head's layer)."""
    with Engine(hybrid_files[name], n_ctx=512) as engine:
        assert engine.mtp_heads == 1 and engine.drafter.name == "mtp" and engine.drafter.ctx.rollback is None
        plain = _plain(engine, PROMPT)
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=48, policy=replace_source(policy, "mtp")))
    assert_lossless(plain, spec)
    if policy.name == "fixed":
        drafts, drafted, accepted = spec.stats.sources["mtp"]
        assert drafted > accepted > 0, spec.stats.sources


def replace_source(policy: PolicyConfig, source: str) -> PolicyConfig:
    from dataclasses import replace
    return replace(policy, source=source) if policy.name == "fixed" else policy


def test_hybrid_mtp_drafts_in_two_slots(hybrid_files):
    cfg = GenerationConfig(max_tokens=24, policy=PolicyConfig("fixed", 3, source="mtp"))
    assert_slots_lossless(hybrid_files["mtp"], None, [PROMPT, OTHER], cfg, "mtp")


def test_hybrid_mtp_sampled_output_follows_the_target_s_distribution(hybrid_files):
    with Engine(hybrid_files["noisy"], n_ctx=256) as engine:
        assert_drafts_keep_the_distribution(engine, dict(temperature=0.4, top_k=8, top_p=1.0, min_p=0.0))


def test_hybrid_state_llama_cpp_cannot_roll_back_decodes_plainly_with_one_note(hybrid_files):
    """Qwen3-Next (not in llama.cpp's llm_arch_supports_rs_rollback): no drafter, no MTP heads, no
    lookup, the same text, one note; ``--source mtp`` is one error line."""
    path = hybrid_files["next"]
    with Engine(path, n_ctx=256) as engine:
        assert engine.model.recurrent and engine.ctx.rollback == 0
        assert engine.spec_note and engine.drafter is None and engine.mtp_heads == 0
        plain = _plain(engine, PROMPT, 24)
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=24, policy=PolicyConfig("fixed", 4, source="lookup")))
    assert spec.tokens == plain.tokens and spec.stats.drafted == 0
    proc = run_cli("generate", "--target", str(path), "-p", PROMPT, "-n", "8", "--temperature", "0")
    notes = [line for line in proc.stderr.splitlines() if "roll back" in line]
    assert proc.returncode == 0 and len(notes) == 1 and notes[0].startswith("note:"), proc.stderr
    proc = run_cli("generate", "--target", str(path), "-p", "hi", "--source", "mtp", "-n", "4")
    assert proc.returncode == 1 and proc.stderr.startswith("Error:") and "roll back" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_hybrid_mtp_server_of_two_slots_answers_plain_decoding_s_text(hybrid_files, tmp_path):
    """``serve --parallel 2`` on the qwen35 file with its head: two concurrent requests (official
    client) each get plain decoding's text, with MTP drafts counted."""
    from concurrent.futures import ThreadPoolExecutor

    from serve_checks import running_server

    path = hybrid_files["mtp"]
    prompts = [PROMPT, OTHER]
    alone = solo(path, prompts, n_ctx=256, max_tokens=24)
    args = ("--target", str(path), "--ctx", "256", "--parallel", "2", "--policy", "fixed", "--draft-max", "3")
    with running_server(tmp_path, *args) as srv:
        client = srv.client()

        def ask(prompt):
            return client.completions.create(model=path.stem, prompt=prompt, max_tokens=24, temperature=0,
                                             extra_body={"repeat_penalty": 1.0})
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(ask, prompts))
    for p, reply in zip(prompts, replies):
        assert reply.choices[0].text == alone[p].text
    assert sum(r.usage.model_extra["speculative"]["sources"].get("mtp", {}).get("drafted", 0) for r in replies) > 0


def test_hybrid_inspect_says_what_the_recurrent_state_means_for_drafting(hybrid_files):
    from localspec.formats.gguf_info import read_gguf, recurrent_note

    assert "chains of 8 tokens or fewer" in recurrent_note(read_gguf(hybrid_files["mtp"]))
    assert "cannot roll back" in recurrent_note(read_gguf(hybrid_files["next"]))
    proc = run_cli("inspect", str(hybrid_files["next"]))
    assert proc.returncode == 0 and "cannot roll back" in " ".join((proc.stdout + proc.stderr).split()), proc.stdout


def test_hybrid_eagle_drafter_chains_equal_plain_decoding(hybrid_files, tmp_path):
    """An EAGLE-3 drafter file on a qwen35 target: trees asked for are chains, no deeper than the
    snapshots reach, and the text is plain decoding's."""
    from tiny_models import build_drafter

    drafter = build_drafter(tmp_path / "eagle.gguf", hybrid_files["plain"], "repeat")
    with Engine(hybrid_files["plain"], drafter, n_ctx=512) as engine:
        plain = _plain(engine, PROMPT)
        engine.clear_cache()
        spec = _done(engine, PROMPT, GenerationConfig(max_tokens=48, policy=PolicyConfig("fixed", 12, tree="on")))
    assert_lossless(plain, spec)
    drafts, drafted, accepted = spec.stats.sources["eagle"]
    assert drafted > accepted > 0 and len(spec.stats.drafted_per_position) <= RS_ROLLBACK, spec.stats.sources


def test_hybrid_mtp_chat_turns_reuse_the_conversation_and_equal_plain_decoding(hybrid_files):
    """Each turn continues the last answer: the cached conversation is kept every time (where the
    head would need one more row cut than the state allows, the head's own cache restarts
    instead), and each answer is plain decoding's."""
    with Engine(hybrid_files["mtp"], n_ctx=1024) as engine:
        text, turns = PROMPT, []
        for turn in range(5):
            done = _done(engine, text, GenerationConfig(max_tokens=20 + turn, policy=PolicyConfig("fixed", 4, source="mtp")))
            turns.append((text, done))
            assert turn == 0 or done.stats.prompt_cached >= len(engine.prompt_tokens(turns[-2][0])), turn
            text = text + done.text + " And then"
        for text, done in turns:
            assert_lossless(_plain(engine, text, len(done.tokens)), done)
