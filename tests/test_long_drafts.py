"""Long drafts (issue 17): the long n-gram index, match lengths up to 64+, the policy going deeper
than 16 where the cost model says one long verify pays, and the engine drafting 48+ tokens in one
cycle on text that repeats itself, with output equal to plain decoding."""

from __future__ import annotations

import random

import pytest

from localspec import CycleEvent, DoneEvent, Engine, GenerationConfig, Message, PolicyConfig
from localspec.core.errors import LocalspecError
from localspec.speculation import lookup
from localspec.speculation.costmodel import CostModel
from localspec.speculation.lookup import NgramLookup
from localspec.speculation.policy import MAX_DEPTH, DraftPolicy, lookup_class
from engine_checks import assert_lossless, prefill, propose
from tiny_models import build_target

# verify seconds by batch size shaped as measured on this 2-core CPU (one thread): per token the
# cost keeps falling with the batch (V(65) ~ 14 V(1)); on a GPU it is nearly flat
CPU_LONG = {1: 0.006, 2: 0.0085, 4: 0.012, 8: 0.020, 9: 0.023, 16: 0.036, 17: 0.038, 24: 0.05, 32: 0.062,
            33: 0.064, 48: 0.075, 49: 0.077, 64: 0.084, 65: 0.086, 96: 0.13, 128: 0.165, 129: 0.167}
LINEAR = {b: 0.006 * b for b in (1, 2, 4, 8, 16, 32, 64, 128, 129)}


# -- lookup -------------------------------------------------------------------------------------

def test_the_long_index_finds_the_passage_being_copied():
    passage = list(range(100, 130))
    # the passage; other text in which its tokens 16..19 occur again, followed by something else;
    # then the passage copied up to token 20
    history = passage + [1, 2] + passage[16:20] + [3, 4] + passage[:20]
    got, n = propose(NgramLookup(history), 10)
    # the 4-token suffix alone would follow its most recent occurrence (continued by 3 4); the
    # 16-token index finds the copied passage, and the match is followed back over 20 tokens
    assert got == passage[20:30] and n == 20
    # fewer than LONG_N tokens in common: the short index as before
    short = NgramLookup([5, 6, 7, 8, 9, 1, 6, 7, 8, 9, 2, 6, 7, 8, 9])
    assert propose(short, 2) == ([2, 6], 4)


def test_a_loop_is_proposed_far_ahead_with_its_match_capped():
    period = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    lk = NgramLookup([1, 2, 3] + period * 10 + period[:3])
    got, n = propose(lk, MAX_DEPTH)
    assert len(got) == MAX_DEPTH == 128
    assert got == (period[3:] + period * 13)[:128] and n == lookup.MATCH_CAP == 64


# -- policy -------------------------------------------------------------------------------------

def _trained(verify, bucket, proposed, accepted, config=None, rounds=60):
    pol = DraftPolicy(config or PolicyConfig("auto"), CostModel(verify), lookup=True)
    for _ in range(rounds):
        pol.observe_lookup(lookup_class(bucket), proposed, accepted)
    return pol


def test_auto_drafts_deeper_than_16_where_one_long_verify_pays():
    pol = _trained(CPU_LONG, 64, 128, 128)
    source, k = pol.plan(500, 128, lookup_class(64))
    assert source == "lookup" and k >= 48
    # room and the proposal's length still bound it
    assert pol.plan(40, 128, lookup_class(64))[1] <= 40 and pol.plan(500, 30, lookup_class(64))[1] <= 30
    # draft_max (the flag) caps short matches; a long match (a copy, a loop) may go to lookup_max
    capped = _trained(CPU_LONG, 64, 128, 128, PolicyConfig("auto", draft_max=8, lookup_max=48))
    source, k = capped.plan(500, 128, lookup_class(64))
    assert source == "lookup" and 40 < k <= 48
    for _ in range(60):
        capped.observe_lookup(lookup_class(4), 128, 128)
    assert capped.plan(500, 128, lookup_class(4))[1] <= 8


def test_auto_stays_short_or_plain_where_long_drafts_do_not_pay():
    # deep drafts that break after a few tokens: a few drafts at most
    pol = _trained(CPU_LONG, 64, 128, 3)
    assert pol.plan(500, 128, lookup_class(64))[1] <= 8
    # verify cost linear in the batch: nothing beats plain decoding, however good the match
    assert _trained(LINEAR, 64, 128, 128).plan(500, 128, lookup_class(64)) == (None, 0)


def test_lookup_max_is_checked():
    with pytest.raises(LocalspecError, match="lookup_max must be between 1 and 128"):
        PolicyConfig(lookup_max=129)


# -- engine -------------------------------------------------------------------------------------

def _run(engine, prompt, **kw):
    cycles, done = [], None
    for event in engine.generate(prompt, GenerationConfig(**kw)):
        if isinstance(event, CycleEvent):
            cycles.append(event)
        elif isinstance(event, DoneEvent):
            done = event
    return cycles, done


def test_auto_drafts_48_or_more_in_one_cycle_on_a_loop_and_stays_lossless(tmp_path):
    """The tiny target's output head is most of its cost (V(65) ~ 130 V(1) here), so long drafts
    never pay on it with its own calibration: the engine gets a GPU-shaped cost model instead (the
    live refresh then brings in what the verifies really cost)."""
    target = build_target(tmp_path / "repeat.gguf", "repeat")
    with Engine(target, n_ctx=1024) as engine:
        _, plain = _run(engine, "Hello world", max_tokens=300, spec=False, record_margins=True)
        engine.cost = CostModel({b: 0.02 + 0.0002 * b for b in (1, 2, 4, 8, 16, 32, 64, 128, 129)})
        cycles, spec = _run(engine, "Hello world", max_tokens=300)
    assert_lossless(plain, spec)
    deep = [c for c in cycles if c.drafted >= 48]
    assert deep and all(c.source == "lookup" for c in deep)
    assert spec.stats.accepted >= 48


def test_smollm2_loop_is_drafted_far_ahead_and_output_equals_plain(smollm2):
    """The real model loops on this prompt under greedy decoding (bench/repetitive.jsonl); its
    verify costs as measured on this CPU at one thread (a calibration on a busy machine can be
    anything), refreshed live from there."""
    prompt = [Message("user", "List some words that rhyme with dog.")]
    with Engine(smollm2, n_ctx=1024, n_threads=1) as engine:
        _, plain = _run(engine, prompt, max_tokens=200, spec=False, record_margins=True)
        engine.clear_cache()
        engine.cost = CostModel(CPU_LONG)
        cycles, spec = _run(engine, prompt, max_tokens=200, policy=PolicyConfig("auto", source="lookup"))
    assert_lossless(plain, spec)
    assert max(c.drafted for c in cycles) > 16


def test_shadow_score_reports_matched_positions_as_they_come():
    """A long proposal on a loop settles only when all of it matched: its evidence for the deep
    positions arrives as the tokens are committed, and the totals equal scoring it at the end."""
    from localspec.speculation.lookup import ShadowScore
    from localspec.speculation.policy import Acceptance

    hits, settled = [], []
    sh = ShadowScore(lambda b, m, acc: settled.append((b, m, acc)), hits=lambda b, lo, hi: hits.append((b, lo, hi)))
    sh.add(list(range(100)), 64)
    sh.commit(list(range(40)))
    assert hits == [(64, 0, 40)] and not settled
    sh.commit([40, 41, 7])
    assert hits[-1] == (64, 40, 42) and settled == [(64, 100, 42)]
    incremental, at_end = Acceptance([0.5] * 128), Acceptance([0.5] * 128)
    incremental.observe_hits(0, 40)
    incremental.observe_hits(40, 42)
    incremental.observe_miss(42)
    at_end.observe(100, 42)
    assert incremental.hit == at_end.hit and incremental.seen == at_end.seen


# -- padding to a cheaper batch -------------------------------------------------------------------

# measured on this CPU (2 threads): llama.cpp's flash attention runs 64+ query rows tiled, so a
# verify of 64 rows costs about half one of 63
CPU_CLIFF = {1: 0.0055, 2: 0.0088, 4: 0.0135, 8: 0.025, 16: 0.045, 17: 0.051, 24: 0.068, 32: 0.091,
             48: 0.142, 56: 0.165, 63: 0.19, 64: 0.096, 72: 0.104, 96: 0.128, 128: 0.155}


def test_a_draft_between_two_measured_steps_is_padded_to_the_cheaper_size():
    cm = CostModel(CPU_CLIFF)
    assert cm.rows_for(41) == 64 and cm.rows_for(63) == 64      # cheaper with filler rows
    assert cm.rows_for(17) == 17 and cm.rows_for(1) == 1         # 64 rows cost more than these
    assert cm.rows_for(100) == 100                               # nothing larger is cheaper
    # the policy weighs a 40-token draft at the padded cost, and pads it
    pol = _trained(CPU_CLIFF, 64, 128, 128)
    source, k = pol.plan(500, 40, lookup_class(64))
    assert source == "lookup" and k == 40 and pol.verify_rows(k + 1) == 64
    assert DraftPolicy(PolicyConfig("fixed"), cm, lookup=True).verify_rows(41) == 41   # fixed: as asked


def _verify(engine, drafts, sampler, rows):
    """``drafts`` verified as a generation's step verifies them: the verifier's chain rows (padded
    to ``rows``) in one batch, decoded once, read back."""
    from localspec.runtime.batch import Batch
    v, batch = engine.verifier, Batch(engine.ctx)
    tokens, start = v.chain_rows(drafts, rows)
    offset = batch.add(v.seq, tokens, start, all_logits=bool(drafts))
    batch.decode()
    return v.verify(drafts, sampler, batch.at(offset), len(tokens))


def test_a_padded_verify_commits_and_caches_what_an_unpadded_one_does(smollm2):
    """Ten right drafts and a wrong one, verified in 12 rows and padded to 40: the same tokens
    accepted, the same target token after them, the filler rows' cells dropped (the next step's
    logits equal those after the unpadded verify bit for bit). Under 64 rows llama.cpp's CPU
    logits equal one-token decoding's; 64 or more run flash attention tiled (see docs)."""
    from localspec.runtime.sampling import Sampler, SamplingParams
    prompt = [Message("user", "Count from one to twenty.")]
    with Engine(smollm2, n_ctx=512, n_threads=1) as engine:
        _, plain = _run(engine, prompt, max_tokens=16, spec=False)
        ids, text = engine.prompt_tokens(prompt), plain.tokens
        results = []
        for rows in (0, 40):
            engine.clear_cache()
            v, sampler = engine.verifier, Sampler(SamplingParams(temperature=0.0), ids)
            assert prefill(engine, ids, sampler) == text[0]
            checked = _verify(engine, text[1:11] + [(text[11] + 1) % engine.model.n_vocab], sampler, rows)
            n_past = v.n_past
            step = _verify(engine, [], sampler, 0)
            results.append((checked.tokens, checked.batch, n_past, step.tokens, engine.ctx.logits(-1).copy()))
    (tokens, batch, n_past, after, logits), padded = results
    assert tokens == text[1:12] and padded[0] == tokens and padded[2] == n_past and padded[3] == after == [text[12]]
    assert batch == 12 and padded[1] == 40
    assert (padded[4] == logits).all()


def test_padding_stays_within_the_deepest_draft_the_config_allows():
    pol = _trained(CPU_CLIFF, 64, 128, 128, PolicyConfig("auto", lookup_max=62))
    assert pol.verify_rows(41) == 41 and pol.verify_rows(63) == 63


def test_the_quick_bound_in_plan_never_changes_a_decision():
    """``plan`` first bounds every depth's rate by the cheapest batch (so most cycles skip weighing
    each depth); with the bound disabled (a cheapest batch of 0: it never skips) every choice is
    the same, over random cost curves, acceptance histories, matches and drafter backlogs."""
    rng = random.Random(7)
    for trial in range(300):
        v1 = rng.uniform(0.003, 0.008)
        curve, v = {1: v1}, v1
        for b in (2, 3, 4, 8, 16, 17, 24, 32, 48, 63, 64, 96, 128, 129):
            v = v * rng.uniform(1.0, 1.6) if b < 64 else v * rng.uniform(0.7, 1.5)
            curve[b] = v
        cost = CostModel(curve, rng.uniform(0.0002, 0.002))
        for _ in range(rng.randrange(0, 20)):   # a live history: bands learn their corrections
            b = rng.choice([1, 1, 1, 4, 16, 64])
            cost.observe_verify(b, cost.verify(b) * rng.uniform(0.8, 1.3))
        pol = DraftPolicy(PolicyConfig("auto"), cost, eagle=rng.random() < 0.5, lookup=True)
        pol.overhead = rng.uniform(0.0, 0.001)
        for _ in range(rng.randrange(0, 40)):
            bucket, proposed = rng.choice([1, 2, 4, 8, 16, 32, 64]), rng.randrange(1, 129)
            pol.observe_lookup(lookup_class(bucket), proposed, rng.randrange(0, proposed + 1))
            if rng.random() < 0.3:
                pol.eagle_acc.observe(8, rng.randrange(0, 9))
        args = (rng.randrange(1, 200), rng.randrange(0, 129), lookup_class(rng.choice([0, 1, 2, 3, 5, 9, 17, 40, 64])),
                rng.randrange(0, 20))
        twin = DraftPolicy(PolicyConfig("auto"), cost, eagle=pol.eagle, lookup=True)
        twin.eagle_acc, twin.lookup_acc, twin.overhead = pol.eagle_acc, pol.lookup_acc, pol.overhead
        unbounded = type("Unbounded", (), {"__getattr__": lambda self, name: getattr(cost, name),
                                           "cheapest_batch": lambda self: 0.0})()
        twin.cost = unbounded
        assert pol.plan(*args) == twin.plan(*args), (trial, args)
