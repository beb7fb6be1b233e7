"""Draft sources, cost model and policy in isolation; the engine with n-gram lookup drafts."""

from __future__ import annotations

import json

import pytest

from localspec import CycleEvent, DoneEvent, Engine, GenerationConfig, LocalspecError, PolicyConfig, SamplingParams
from localspec.core.paths import user_dir
from localspec.speculation.costmodel import CostModel, load_or_calibrate
from localspec.speculation.lookup import NgramLookup, ShadowScore
from localspec.speculation.policy import Acceptance, DraftPolicy, Learned, Proposal, lookup_class
from engine_checks import PROMPTS, assert_lossless, propose, run
from tiny_models import build_drafter, build_target


# -- n-gram lookup -------------------------------------------------------------------------------

def test_lookup_proposes_the_continuation_of_the_longest_recent_match():
    lk = NgramLookup([1, 2, 3, 4, 5, 9, 9, 2, 3, 4, 6, 7, 1, 2, 3, 4])
    # suffix 1 2 3 4 occurred at 0..3 (continued by 5); 2 3 4 at 7..9 is more recent but shorter
    assert propose(lk, 3) == ([5, 9, 9], 4)
    long = NgramLookup([8, 1, 2, 3, 4, 5, 6, 0, 8, 1, 2, 3, 4, 5, 6])
    assert propose(long, 2) == ([0, 8], 7)  # the whole 8 1 2 3 4 5 6 matched
    lk.extend([8])
    assert propose(lk, 2) == ([], 0)  # 8 never seen before
    lk.extend([2, 3])
    assert propose(lk, 2) == ([4, 8], 2)  # the most recent "2 3" (positions 13..14) was followed by 4 8


def test_lookup_is_incremental_and_matches_a_brute_force_search():
    import random

    rng = random.Random(5)
    tokens = [rng.randrange(6) for _ in range(400)]
    lk = NgramLookup()
    for i, tok in enumerate(tokens):
        lk.extend([tok])
        hist = tokens[: i + 1]
        got, n = propose(lk, 4)
        expect = ([], 0)
        for m in range(min(4, len(hist)), 0, -1):  # index part (match lengths checked below)
            suffix = hist[-m:]
            starts = [j + m for j in range(len(hist) - m) if hist[j:j + m] == suffix]
            if starts:
                s = starts[-1]
                cont = hist[s:]
                while len(cont) < 4:
                    cont.append(cont[len(cont) - (len(hist) - s)])
                if m == 4:  # the reported match length follows the match backwards
                    a, b = s - m - 1, len(hist) - m - 1
                    while a >= 0 and m < 32 and hist[a] == hist[b]:
                        a, b, m = a - 1, b - 1, m + 1
                expect = (cont[:4], m)
                break
        assert (got, n) == expect, i


def test_lookup_extends_a_repeating_continuation_periodically():
    lk = NgramLookup([7, 1, 2, 1, 2])
    assert propose(lk, 5) == ([1, 2, 1, 2, 1], 2)  # "1 2" at 1..2, continued by 1 2 (period 2)


def test_lookup_reports_how_far_back_the_continued_occurrence_lies():
    period = [11, 12, 13, 14, 15, 16, 17]
    lk = NgramLookup([1, 2, 3] + period * 3 + period[:2])
    start, match = lk.find()
    assert (len(lk) - start, match) == (7, 16)      # a loop: the match spans its period
    assert lk.continuation(start, 4) == [13, 14, 15, 16] == propose(lk, 4)[0]
    passage = list(range(100, 130))
    copy = NgramLookup(passage + [1, 2] + passage[:20])
    start, match = copy.find()
    assert (len(copy) - start, match) == (32, 20)   # copying from far back
    assert copy.continuation(start, 4) == [120, 121, 122, 123]
    assert NgramLookup([1, 2, 3]).find() == (0, 0) and NgramLookup().find() == (0, 0)   # nothing matched


def test_loops_have_their_own_statistics_and_draft_deeper_than_other_matches():
    from localspec.speculation.policy import LOOKUP_BUCKETS, _bucket

    # a match spanning its whole period (4-31 tokens) is a loop class; others keep their length bucket
    assert lookup_class(12, 10) == len(LOOKUP_BUCKETS) + 1 and lookup_class(12, 40) == _bucket(12)
    assert lookup_class(5, 5) == len(LOOKUP_BUCKETS) and lookup_class(3, 2) == _bucket(3)
    assert lookup_class(40, 10) == _bucket(40) and lookup_class(12) == _bucket(12)
    # priors alone: a loop of 12 tokens drafts deeper than a 12-token match that is no loop
    costs = {1: 0.006, 2: 0.0085, 4: 0.012, 8: 0.020, 16: 0.036, 17: 0.038, 32: 0.062, 64: 0.084, 128: 0.165}
    fresh = DraftPolicy(PolicyConfig("auto"), CostModel(costs), lookup=True)
    loop, other = fresh.plan(500, 128, lookup_class(12, 10)), fresh.plan(500, 128, lookup_class(12, 40))
    assert loop[0] == "lookup" and loop[1] > 2 * other[1]
    # and each class learns on its own
    pol = DraftPolicy(PolicyConfig("auto"), CostModel(costs), lookup=True)
    for _ in range(60):
        pol.observe_lookup(lookup_class(12, 10), 16, 0)
    assert pol.plan(500, 128, lookup_class(12, 10)) == (None, 0)
    assert pol.plan(500, 128, lookup_class(12, 40)) == other


def test_shadow_score_counts_accepted_prefixes():
    seen = []
    sh = ShadowScore(lambda bucket, m, acc: seen.append((bucket, m, acc)))
    sh.add([1, 2, 3], 2)
    sh.add([5], 1)
    sh.commit([1])          # second proposal fails at once
    assert seen == [(1, 1, 0)]
    sh.commit([2, 9])       # first accepted 2 then fails
    assert seen[-1] == (2, 3, 2)
    sh.add([4, 4], 3)
    sh.commit([4, 4, 4])
    assert seen[-1] == (3, 2, 2)


# -- cost model ----------------------------------------------------------------------------------

def test_cost_model_interpolates_refreshes_and_extrapolates():
    cm = CostModel({1: 0.005, 2: 0.009, 4: 0.010, 8: 0.014})
    assert cm.verify(3) == pytest.approx(0.0095)
    assert cm.verify(16) == pytest.approx(0.014 + 8 * 0.001)
    for _ in range(60):
        cm.observe_verify(1, 0.010)   # the machine got twice as slow
    assert cm.verify(1) == pytest.approx(0.010, rel=0.05)
    assert cm.verify(4) > 0.010 * 1.5  # unseen sizes follow the drift
    cm.observe_drafter(4, 0.004)
    assert cm.drafter_step == pytest.approx(0.001)
    assert cm.drifted()


def test_calibration_is_cached_per_key(tmp_path):
    calls = []

    def calibrate():
        calls.append(1)
        return {1: 0.005, 2: 0.008}, 0.001, 1.2, True

    cache = tmp_path / "calibration.json"
    a = load_or_calibrate("m1", cache, calibrate)
    b = load_or_calibrate("m1", cache, calibrate)
    assert len(calls) == 1 and b.verify(2) == pytest.approx(0.008) and b.drafter_step == pytest.approx(0.001)
    load_or_calibrate("m2", cache, calibrate)
    assert len(calls) == 2 and set(json.loads(cache.read_text())["entries"]) == {"m1", "m2"}
    cache.write_text("not json")
    load_or_calibrate("m1", cache, calibrate)
    assert len(calls) == 3
    for _ in range(20):
        a.observe_verify(1, 0.02)
        a.observe_verify(2, 0.02)
    a.save_if_drifted()
    assert json.loads(cache.read_text())["entries"]["m1"]["verify"]["1"] > 0.01


# -- policy --------------------------------------------------------------------------------------

def test_acceptance_expectation_and_decay():
    acc = Acceptance([0.5] * 4, weight=1.0)
    assert acc.expected(3) == pytest.approx([0, 0.5, 0.75, 0.875])
    for _ in range(200):
        acc.observe(4, 4)
    assert acc.expected(4)[4] > 3.9


def test_learned_acceptance_carries_over_as_a_few_observations():
    acc = Acceptance([0.5] * 4)
    for _ in range(100):
        acc.observe(4, 4)
    acc.carry(4.0)
    assert acc.seen[0] == pytest.approx(6.0) and acc.rates()[0] == pytest.approx((1.0 + 4.0) / 6.0, abs=0.02)
    for _ in range(10):
        acc.observe(1, 0)
    assert acc.rates()[0] < 0.4  # the new text's failures take over quickly


def _policy(verify, lookup_rate, *, draft_max=8):
    cost = CostModel(verify)
    pol = DraftPolicy(PolicyConfig("auto", draft_max), cost, lookup=True)
    for _ in range(300):
        pol.observe_lookup(lookup_class(4), 8, 8 if lookup_rate == 1.0 else 0)
    return pol


CPU = {1: 0.005, 2: 0.0087, 3: 0.0105, 4: 0.010, 5: 0.016, 6: 0.018, 7: 0.016, 8: 0.014, 9: 0.015}
GPU = {b: 0.020 + 0.0002 * b for b in range(1, 10)}


def test_auto_policy_drafts_deep_when_lookup_copies_and_plain_when_it_fails():
    assert _policy(CPU, 1.0).plan(100, 8, lookup_class(4)) == ("lookup", 8)
    assert _policy(CPU, 1.0, draft_max=4).plan(100, 8, lookup_class(4)) == ("lookup", 3)  # verify 4: a sweet spot
    padded = _policy(CPU, 1.0, draft_max=5)     # 6 rows verify padded to 8, cheaper here
    assert padded.plan(100, 8, lookup_class(4)) == ("lookup", 5) and padded.verify_rows(6) == 8
    assert _policy(CPU, 0.0).plan(100, 8, lookup_class(4)) == (None, 0)
    assert _policy(GPU, 1.0).plan(100, 8, lookup_class(4)) == ("lookup", 8)
    assert _policy(CPU, 1.0).plan(2, 8, lookup_class(4))[1] <= 2                   # room left


def test_auto_policy_weighs_drafter_cost_and_probes_a_bad_drafter_rarely():
    def bad(verify):
        pol = DraftPolicy(PolicyConfig("auto", 8, probe_every=4), CostModel(verify, 0.0005), eagle=True)
        for _ in range(300):
            pol.eagle_acc.observe(1, 0)
        return pol, [pol.plan(100) for _ in range(200)]

    _, plans = bad(GPU)  # a better drafter would pay here: probe, one draft deep, ever more rarely
    probes = [p for p in plans if p[0] == "eagle"]
    assert probes and all(p == ("eagle", 1) for p in probes) and len(probes) <= 7  # 4, 8, 16, ... cycles apart
    _, plans = bad(CPU)  # even a much better drafter would not pay: never probe
    assert all(p == (None, 0) for p in plans)
    good = DraftPolicy(PolicyConfig("auto", 8), CostModel(GPU, 0.0005), eagle=True, lookup=False)
    for _ in range(300):
        good.eagle_acc.observe(8, 8)
    assert good.plan(100) == ("eagle", 8)
    # a long backlog of rows to write first makes the same drafter less attractive on a CPU
    cpu = DraftPolicy(PolicyConfig("auto", 8), CostModel(CPU, 0.002), eagle=True)
    for _ in range(300):
        cpu.eagle_acc.observe(8, 8)
    assert cpu.plan(100, backlog=1)[0] == "eagle" and cpu.plan(100, backlog=500) == (None, 0)


def test_auto_policy_copies_features_only_for_a_drafter_it_may_use():
    """The engine copies the target's features for the drafter only while the policy wants them, and
    drops the rows it did not want (backlog 0 next cycle). An empty backlog must not ask for them
    again: a drafter that would never pay (every other cycle's copy cost 1-2% of plain text here)."""
    def run(verify):
        pol = DraftPolicy(PolicyConfig("auto", 8, probe_every=4), CostModel(verify, 0.0005), eagle=True)
        for _ in range(300):
            pol.eagle_acc.observe(1, 0)
        backlog, wanted, plans = 1, [], []
        for _ in range(200):
            plans.append(pol.plan(100, backlog=backlog))
            wanted.append(pol.wants_features)
            backlog = 1 if pol.wants_features else 0
        return wanted, plans

    wanted, plans = run(CPU)     # never worth probing: never copied
    assert not any(wanted) and all(p == (None, 0) for p in plans)
    wanted, plans = run(GPU)     # probed now and then: copied only in the cycles before a probe
    probes = [i for i, p in enumerate(plans) if p[0] == "eagle"]
    assert probes and all(wanted[i - 1] for i in probes) and sum(wanted) < len(wanted) / 2


# -- engine with lookup drafts -------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tinyspec")
    paths = {k: build_target(d / f"{k}.gguf", k, noise=0.006) if k == "noisy" else build_target(d / f"{k}.gguf", k)
             for k in ("repeat", "noisy", "random")}
    paths["d_repeat"] = build_drafter(d / "d_repeat.gguf", paths["repeat"], "repeat")
    return paths


COPY = "a b c d e f g a b c d e f g a b c"


@pytest.mark.parametrize("target", ["repeat", "noisy", "random"])
@pytest.mark.parametrize("policy", [PolicyConfig("fixed", 4, source="lookup"), PolicyConfig("fixed", 8, source="lookup"),
                                    PolicyConfig("auto", 8, source="lookup"), PolicyConfig("auto", 8)])
def test_lookup_drafts_are_lossless_without_a_drafter(tiny, target, policy):
    with Engine(tiny[target], n_ctx=1024) as engine:
        for prompt in PROMPTS + [COPY]:
            plain = run(engine, prompt, max_tokens=40, spec=False, record_margins=True)
            spec = run(engine, prompt, max_tokens=40, policy=policy)
            assert_lossless(plain, spec)
            assert spec.stats.spec
            if policy.name == "fixed":
                assert spec.stats.sources.get("lookup", [0, 0, 0])[1] == spec.stats.drafted


def test_lookup_on_a_repeating_target_accepts_everything(tiny):
    with Engine(tiny["repeat"], n_ctx=512) as engine:
        done = run(engine, "Hello world", max_tokens=41, policy=PolicyConfig("fixed", 8, source="lookup"))
    assert done.stats.drafted > 0 and done.stats.acceptance_rate == 1.0
    assert done.stats.tokens_per_cycle > 6


def test_both_sources_mixed_are_lossless(tiny):
    with Engine(tiny["noisy"], tiny["d_repeat"], n_ctx=1024) as engine:
        for prompt in PROMPTS + [COPY]:
            plain = run(engine, prompt, max_tokens=48, spec=False, record_margins=True)
            for policy in (PolicyConfig("auto", 8), PolicyConfig("auto", 3, source="eagle"),
                           PolicyConfig("fixed", 5, source="lookup"), PolicyConfig("fixed", 3, source="eagle")):
                assert_lossless(plain, run(engine, prompt, max_tokens=48, policy=policy))


def test_auto_uses_the_drafter_where_it_pays_and_records_sources(tiny, background_calibration, patient_calibration):
    # a perfect drafter and lookup on a repeating target: auto speculates and reports per source
    with Engine(tiny["repeat"], tiny["d_repeat"], n_ctx=1024) as engine:
        events = list(engine.generate("Hello world", GenerationConfig(max_tokens=80)))
        assert engine.calibrator.wait(120)   # calibrated in the background, after the reply
    done = events[-1]
    assert isinstance(done, DoneEvent)
    srcs = {e.source for e in events if isinstance(e, CycleEvent)}
    assert srcs & {"eagle", "lookup"}
    assert sum(done.stats.policy_choices.values()) == done.stats.cycles
    d = done.stats.to_dict()
    assert set(d["sources"]) <= {"eagle", "lookup"} and d["verify_ms_by_batch"]
    assert (user_dir() / "calibration.json").is_file()


def test_sampling_with_lookup_keeps_the_distribution_rule(tiny):
    """Seeded sampling: lookup drafts go through the same exact rejection rule (checked
    statistically in test_sampling); here, drafts are both accepted and rejected."""
    with Engine(tiny["noisy"], n_ctx=512) as engine:
        cfg = GenerationConfig(max_tokens=60, policy=PolicyConfig("fixed", 4, source="lookup"),
                               sampling=SamplingParams(temperature=0.5, top_k=8, top_p=1.0, min_p=0.0, seed=3))
        done = [e for e in engine.generate(COPY, cfg) if isinstance(e, DoneEvent)][0]
    assert 0 < done.stats.accepted < done.stats.drafted


def test_windowed_catch_up_after_plain_stretches_is_lossless(tiny):
    """auto writes only the last rows to the drafter after plain decoding; drafts change, output not."""
    from localspec.speculation import policy as P

    with Engine(tiny["noisy"], tiny["d_repeat"], n_ctx=1024) as engine:
        prompt = " ".join(f"w{i}" for i in range(60))
        plain = run(engine, prompt, max_tokens=40, spec=False, record_margins=True)
        old = P.CATCH_UP_ROWS
        try:
            P.CATCH_UP_ROWS = 4
            spec = run(engine, prompt, max_tokens=40, policy=PolicyConfig("auto", 4, source="eagle"))
        finally:
            P.CATCH_UP_ROWS = old
        assert_lossless(plain, spec)


def test_idle_drafter_skips_feature_copies_and_resumes_losslessly(tiny, monkeypatch):
    """While the drafter is neither used nor about to be probed, its features are not copied; when
    acceptance turns good mid-generation it drafts again from the rows recorded after the gap."""
    with Engine(tiny["noisy"], tiny["d_repeat"], n_ctx=1024) as engine:
        prompt = "The quick brown fox"
        plain = run(engine, prompt, max_tokens=120, spec=False, record_margins=True)
        from localspec.speculation import policy as P

        monkeypatch.setattr(P, "CARRY", 1000.0)  # keep the useless-drafter record below in full
        engine.cost = CostModel(GPU, 1e-7)  # the live refresh brings verify down to the tiny model's cost
        eagle = engine.learned.eagle
        eagle.hit, eagle.seen = [0.0] * len(eagle.seen), [50.0] * len(eagle.seen)  # looks useless
        skipped, events = 0, []
        cfg = GenerationConfig(max_tokens=120, policy=PolicyConfig("auto", 4, p_min=0.0, probe_every=4, source="eagle"))
        for e in engine.generate(prompt, cfg):
            events.append(e)
            if isinstance(e, CycleEvent):
                skipped += engine.drafters[0].pending == 0
                if len(events) > 150:  # the drafter turns out good
                    eagle.hit = [50.0] * len(eagle.seen)
        done = events[-1]
        assert skipped > 0 and done.stats.drafted > 0
        assert_lossless(plain, done)


def test_bad_source():
    with pytest.raises(LocalspecError, match="draft source"):
        GenerationConfig(policy=PolicyConfig(source="magic"))


@pytest.mark.parametrize("block_ms, accepts", [(0.5, True), (0.5, False), (1.5, True), (1.5, False), (3.0, True), (20.0, False)])
def test_resting_decides_as_weighing_every_cycle(block_ms, accepts):
    """``DraftPolicy.rest`` skips weighing only where the weighing would change nothing: a policy
    that rests and one that weighs every cycle make the same choice each cycle, with the same
    probe clock and the same rows recorded (a block drafter that pays or not, whose probes are
    accepted or not), over enough cycles for the probe interval to double to its cap."""
    def proposal(pol, backlog):
        return Proposal("dflash", pol.model_cls, 8, lambda k: block_ms * 1e-3, backlog)

    cost = CostModel({b: 1e-3 * (1 + 0.15 * (b - 1)) for b in range(1, 65)}, block_ms * 1e-3)
    weighs, rests = (DraftPolicy(PolicyConfig("auto", source="dflash"), cost, model="dflash", learned=Learned())
                     for _ in range(2))
    backlog = {weighs: 1, rests: 1}
    for cycle in range(1200):
        seen = []
        for pol in (weighs, rests):
            if pol is rests and pol.rest(100):
                chosen, k = None, 0
            else:
                chosen, k = pol.choose(100, [proposal(pol, backlog[pol])])
            if chosen is not None:
                pol.eagle_acc.observe(k, k if accepts else 0)
            backlog[pol] = 1 if pol.wants_features else 0   # the committed rows recorded, or dropped
            probe = pol._probes.get("dflash")
            seen.append((chosen is not None, k, pol.wants_features, probe and (probe.since, probe.interval)))
        assert seen[0] == seen[1], (cycle, seen)
    assert accepts or rests.rested > 600, rests.rested   # a drafter that never pays: most cycles rest


def test_could_pay_rechecks_back_off_and_a_source_that_turns_good_is_found_again():
    """A block drafter that cannot pay even with better acceptance is weighed less and less often
    (the cached could-pay answer kept 8, 16, 32, then at most RECHECK_MAX cycles), and once its
    blocks turn cheap (the load on its core went away) it is probed within RECHECK_MAX cycles."""
    from localspec.speculation import policy as P

    cost = CostModel({b: 1e-3 * (1 + 0.15 * (b - 1)) for b in range(1, 65)}, 20e-3)
    price = [20e-3]
    pol = DraftPolicy(PolicyConfig("auto", source="dflash"), cost, model="dflash", learned=Learned())
    weighed, backlog, probed = [], 1, None
    for cycle in range(1000):
        if cycle == 600:
            price[0] = 0.2e-3
        if pol.rest(100):
            backlog = 0
            continue
        weighed.append(cycle)
        chosen, _ = pol.choose(100, [Proposal("dflash", pol.model_cls, 8, lambda k: price[0], backlog)])
        backlog = 1 if pol.wants_features else 0
        if chosen is not None:
            probed = cycle
            break
    before = [c for c in weighed if c < 600]
    gaps = [b - a for a, b in zip(before, before[1:])]
    assert gaps[:4] == [8, 16, 32, 64] and set(gaps[4:]) == {P.RECHECK_MAX}, gaps
    assert len(before) <= 600 // P.RECHECK_MAX + 5   # every PROBE_RECHECK cycles before: 75
    assert probed is not None and probed - 600 <= P.RECHECK_MAX + 1, (probed, weighed[-5:])


def test_a_block_drafter_is_probed_at_the_depth_that_would_pay():
    """A block costs one drafter decode at any depth: where one block costs more than a target
    step, a one-deep draft never pays, so the probe of a block drafter drafts the depth whose
    optimistic rate pays best (and teaches every position of it); a chain drafter's stays one deep."""
    cost = CostModel({b: 1e-3 * (1 + 0.01 * (b - 1)) for b in range(1, 65)}, 1.5e-3)   # rows nearly free
    depths = {}
    for block in (True, False):
        pol = DraftPolicy(PolicyConfig("auto", source="dflash"), cost, model="dflash", learned=Learned())
        pol.block = block
        price = (lambda k: 1.5e-3) if block else (lambda k: 0.45e-3 * k)
        for _ in range(200):
            chosen, k = pol.choose(100, [Proposal("dflash", pol.model_cls, 8, price, 1)])
            if chosen is not None:
                depths[block] = k
                break
    assert depths[False] == 1 and depths[True] > 1, depths
