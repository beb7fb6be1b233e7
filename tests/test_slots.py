"""Parallel slots in one target context (localspec.runtime.scheduler): every step one decode of
every active slot's rows; each request's output as if it ran alone; speculation priced against
the whole batch; the memory plan sized for N slots."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from engine_checks import PROMPTS, Collect, assert_lossless, drain, run, solo
from localspec import DoneEvent, Engine, GenerationConfig
from localspec.core.errors import LocalspecError
from localspec.runtime.sampling import SamplingParams
from localspec.runtime.prompt_cache import PromptCache
from localspec.speculation.cost_measure import fit_curve
from localspec.speculation.costmodel import CostModel
from localspec.speculation.policy import LOOKUP, DraftPolicy, PolicyConfig, lookup_class
from localspec.speculation.sources import Proposal
from tiny_models import noisy_and_repeat

LOOKUP4 = PolicyConfig("fixed", 4)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return noisy_and_repeat(tmp_path_factory.mktemp("slots"))


@pytest.mark.parametrize("kind", ["noisy", "repeat"])
def test_four_slots_equal_each_request_alone(models, kind):
    """8 prompts through 4 slots (lookup drafts, fixed depth): each output is the one it gets alone
    (or differs first at a near-tie), and the steps carried several slots."""
    alone = solo(models[kind], PROMPTS, max_tokens=48)
    with Engine(models[kind], n_ctx=512, parallel=4) as engine:
        scheduler = engine.scheduler()
        sinks = {p: Collect() for p in PROMPTS}
        steps = drain(scheduler, [(p, GenerationConfig(max_tokens=48, policy=LOOKUP4), sinks[p]) for p in PROMPTS],
                      prepare=engine.prepare)
    for p in PROMPTS:
        assert_lossless(alone[p], sinks[p].done)
    drafted = sum(sinks[p].done.stats.drafted for p in PROMPTS)
    assert drafted > 0
    assert steps < sum(alone[p].stats.cycles + 1 for p in PROMPTS) / 2   # batched, not one after another


def test_each_slot_drafts_with_its_own_drafter_sequence(models):
    """3 slots drafting with the EAGLE drafter (fixed depth 4): each request's output, drafts and
    accepted drafts are those it gets alone (the features come from the slot's own rows of the
    shared batch, the drafter's KV from its own sequence)."""
    eagle = GenerationConfig(max_tokens=40, policy=PolicyConfig("fixed", 4, source="eagle"))
    alone = solo(models["noisy"], PROMPTS, max_tokens=40)
    with Engine(models["noisy"], models["d_repeat"], n_ctx=512) as engine:
        drafted_alone = {}
        for p in PROMPTS:
            engine.clear_cache()
            drafted_alone[p] = [e for e in engine.generate(p, eagle) if isinstance(e, DoneEvent)][0].stats.sources
    with Engine(models["noisy"], models["d_repeat"], n_ctx=512, parallel=3) as engine:
        scheduler = engine.scheduler()
        sinks = {p: Collect() for p in PROMPTS}
        drain(scheduler, [(p, eagle, sinks[p]) for p in PROMPTS], prepare=engine.prepare)
    for p in PROMPTS:
        assert_lossless(alone[p], sinks[p].done)
        assert sinks[p].done.stats.sources == drafted_alone[p] and drafted_alone[p]["eagle"][2] > 0


def test_grammar_logprobs_and_prediction_belong_to_their_slot(models):
    """Three slots at once: one under a grammar (digits and commas), one with logprobs, one with a
    prediction to draft from; each answer (tokens, logprobs) is what the request gets alone."""

    digits = 'root ::= [0-9 ,]+'
    configs = {PROMPTS[3]: GenerationConfig(max_tokens=24, grammar=digits, policy=LOOKUP4),
               PROMPTS[0]: GenerationConfig(max_tokens=24, logprobs=3, policy=LOOKUP4),
               PROMPTS[1]: GenerationConfig(max_tokens=24, prediction=" the quick brown fox jumps", policy=LOOKUP4)}
    with Engine(models["noisy"], n_ctx=512) as engine:
        alone = {}
        for p, config in configs.items():
            engine.clear_cache()
            alone[p] = [e for e in engine.generate(p, config) if isinstance(e, DoneEvent)][0]
    with Engine(models["noisy"], n_ctx=512, parallel=3) as engine:
        scheduler = engine.scheduler()
        sinks = {p: Collect() for p in configs}
        drain(scheduler, [(p, c, sinks[p]) for p, c in configs.items()], prepare=engine.prepare)
    for p in configs:
        done = sinks[p].done
        assert done.tokens == alone[p].tokens, p
        if p == PROMPTS[0]:
            assert [(x.token, round(x.logprob, 4)) for x in done.logprobs] == \
                [(x.token, round(x.logprob, 4)) for x in alone[p].logprobs]
    assert set(sinks[PROMPTS[3]].done.text) <= set("0123456789 ,")


def test_one_slot_cancelled_leaves_the_others_unchanged(models):
    alone = solo(models["noisy"], PROMPTS[:3], max_tokens=60)
    with Engine(models["noisy"], n_ctx=512, parallel=3) as engine:   # plain decoding: one token a step
        scheduler = engine.scheduler()
        cancel = threading.Event()
        sinks = [Collect() for _ in range(3)]
        for p, sink, c in zip(PROMPTS[:3], sinks, (None, cancel, None)):
            scheduler.admit(engine.prepare(p), GenerationConfig(max_tokens=60, spec=False), c, sink)
        while scheduler.active:
            if sinks[1].n_tokens >= 10:
                cancel.set()
            scheduler.step()
    # the step after the cancel still commits its token; the next check ends the generation
    assert sinks[1].done.finish_reason == "cancelled" and len(sinks[1].done.tokens) == 11
    for i in (0, 2):
        assert_lossless(alone[PROMPTS[i]], sinks[i].done)
        assert sinks[i].done.finish_reason == "length"


def test_a_long_prompt_prefills_in_chunks_while_the_others_stream(models):
    """A prompt of ~1500 tokens needs several batches of n_batch rows: the streaming slots get a
    token at every one of those steps, and the long prompt's answer is what it is alone."""
    long_prompt = " ".join(f"item {i}," for i in range(250))
    alone = solo(models["noisy"], [PROMPTS[0], long_prompt], n_ctx=2048, max_tokens=40)
    with Engine(models["noisy"], n_ctx=2048, parallel=2) as engine:
        scheduler = engine.scheduler()
        streaming, late = Collect(), Collect()
        scheduler.admit(engine.prepare(PROMPTS[0]), GenerationConfig(max_tokens=40), None, streaming)
        for _ in range(3):
            scheduler.step()
        tokens = engine.prepare(long_prompt)
        assert len(tokens) > 2 * engine.ctx.n_batch
        scheduler.admit(tokens, GenerationConfig(max_tokens=40), None, late)
        gains = []
        while late.n_tokens == 0:
            before = streaming.n_tokens
            scheduler.step()
            gains.append(streaming.n_tokens - before)
        drain(scheduler)
    assert len(gains) >= 3 and all(g >= 1 for g in gains[:-1]), gains
    assert_lossless(alone[PROMPTS[0]], streaming.done)
    assert_lossless(alone[long_prompt], late.done)


def test_a_follow_up_turn_reuses_its_slots_cache(models):
    """Two conversations in two slots; each follow-up goes to the slot holding its prefix and
    decodes only the new tokens."""
    with Engine(models["noisy"], n_ctx=512, parallel=2) as engine:
        scheduler = engine.scheduler()
        first = {p: Collect() for p in PROMPTS[:2]}
        drain(scheduler, [(p, GenerationConfig(max_tokens=12), first[p]) for p in PROMPTS[:2]], prepare=engine.prepare)
        slot_of = {p: next(s.index for s in scheduler.slots
                           if s.verifier.kv_tokens[:len(engine.prepare(p))] == engine.prepare(p)) for p in PROMPTS[:2]}
        assert sorted(slot_of.values()) == [0, 1]
        for p in reversed(PROMPTS[:2]):   # the other order: the slot is chosen by prefix, not by turn
            follow = engine.prepare(p) + first[p].done.tokens + engine.prepare(" and then")[1:]
            sink = Collect()
            slot = scheduler.admit(follow, GenerationConfig(max_tokens=4), None, sink)
            assert slot == slot_of[p]
            drain(scheduler)
            # the last generated token was never decoded (it is the next batch's ``last``)
            cached = len(engine.prepare(p)) + len(first[p].done.tokens) - 1
            assert sink.done.stats.prompt_cached == cached < len(follow)


@pytest.mark.parametrize("kind", ["noisy", "repeat"])
def test_a_prompt_whose_slot_moved_on_is_loaded_back_from_the_prompt_cache(models, kind):
    """Two slots, three long prompts and then the first again: its slot holds another text by
    then, but the prompt cache kept its cells, so only its last token or two are decoded again,
    and its output is the one it got the first time (EAGLE drafts with the repeating pair, starting again
    from the rows after the prompt)."""
    drafter = models["d_repeat"] if kind == "repeat" else None
    prompts = [[100 + 7 * i + j % 50 for j in range(60)] for i in range(3)]
    config = GenerationConfig(max_tokens=24,
                              policy=PolicyConfig("fixed", 3, source="eagle") if drafter else LOOKUP4)
    with Engine(models[kind], drafter, n_ctx=512, parallel=2) as engine:
        scheduler = engine.scheduler(prompt_cache=PromptCache(64 << 20))
        sinks = [Collect() for _ in range(4)]
        for prompt, sink in zip(prompts + [prompts[0]], sinks):
            scheduler.admit(prompt, config, None, sink)
            drain(scheduler)
        assert len(scheduler.prompt_cache) >= 1
        first, again = sinks[0].done, sinks[3].done
        # the last prompt token is decoded again (its logits choose the first token); with a
        # drafter the one before it too (as on any reused prefix: see TargetVerifier.begin)
        assert again.stats.prompt_cached == len(prompts[0]) - (2 if drafter else 1)
        assert first.stats.prompt_cached == 0
        assert_lossless(first, again)
        if drafter:
            assert again.stats.drafted > 0
        # without the cache the same sequence prefills it again
        scheduler = engine.scheduler()
        for prompt in prompts[1:] + [prompts[0]]:
            sink = Collect()
            scheduler.admit(prompt, GenerationConfig(max_tokens=4), None, sink)
            drain(scheduler)
        assert sink.done.stats.prompt_cached < len(prompts[0]) - 1


def test_a_prompt_sharing_a_few_tokens_more_with_a_kept_text_is_loaded_back(models):
    """Chat prompts share their template's first tokens: a repeated question gains only its own
    dozen tokens over whatever text its slot holds. A load copies cells, far cheaper than a
    forward pass of those rows, so the kept text is loaded back (under the old 32-token rule it
    was prefilled again, and a warm server's first tokens waited on it)."""
    system = [200 + j % 40 for j in range(30)]
    a, b = system + [300 + j for j in range(12)], system + [400 + j for j in range(12)]
    config = GenerationConfig(max_tokens=40, policy=LOOKUP4)
    with Engine(models["noisy"], n_ctx=512) as engine:
        scheduler = engine.scheduler(prompt_cache=PromptCache(64 << 20))
        sinks = [Collect() for _ in range(3)]
        for prompt, sink in zip((a, b, a), sinks):
            scheduler.admit(prompt, config, None, sink)
            drain(scheduler)
        assert sinks[1].done.stats.prompt_cached == len(system)       # b reuses the shared prefix
        assert sinks[2].done.stats.prompt_cached == len(a) - 1         # a's whole prompt, loaded back
        assert_lossless(sinks[0].done, sinks[2].done)


def test_a_sampled_request_drafting_with_a_model_reads_its_prompt_again_rather_than_load_it(models):
    """A load empties the drafter's sequence, so a seeded sampled request's drafts, and with them
    its draws, would differ from the same request's on a fresh engine (serve's documented promise
    for a fixed policy): such a prompt is read again, and its text is the first run's."""
    system = [200 + j % 40 for j in range(30)]
    a, b = system + [300 + j for j in range(12)], system + [400 + j for j in range(12)]
    sampled = GenerationConfig(max_tokens=24, sampling=SamplingParams(temperature=0.9, seed=5),
                               policy=PolicyConfig("fixed", 3, source="eagle"))
    with Engine(models["noisy"], models["d_repeat"], n_ctx=512) as engine:
        scheduler = engine.scheduler(prompt_cache=PromptCache(64 << 20))
        sinks = [Collect() for _ in range(3)]
        for prompt, sink in zip((a, b, a), sinks):
            scheduler.admit(prompt, sampled, None, sink)
            drain(scheduler)
        assert len(scheduler.prompt_cache) >= 1
        assert sinks[2].done.stats.prompt_cached < len(a) - 2          # not loaded: read again
        assert sinks[2].done.tokens == sinks[0].done.tokens


def test_a_load_is_worth_its_copy_unless_most_of_the_kept_text_is_of_no_use():
    from localspec.runtime.prompt_cache import worth_loading

    assert worth_loading(12, 42, 170)            # a repeated chat question, its answer after it
    assert not worth_loading(3, 42, 170)         # a few rows: not worth a copy
    assert not worth_loading(12, 42, 1000)       # 42 of 1,000 kept tokens used: the copy is mostly waste


def test_a_draft_is_priced_against_the_prompts_waiting_in_its_step(models):
    """A slot generating beside a prompt being read prices its draft against a shared batch (the
    prompt's rows wait on this step: a long draft priced as if alone delayed their first token by
    hundreds of milliseconds at 4 clients); alone, it is priced alone."""
    with Engine(models["repeat"], n_ctx=512, parallel=2) as engine:
        scheduler = engine.scheduler()
        seen: list[tuple[int, int]] = []
        first = Collect()
        scheduler.admit(engine.prepare(PROMPTS[0]), GenerationConfig(max_tokens=48), None, first)
        scheduler.step()    # its prompt
        slot = next(s for s in scheduler.slots if s.busy)
        plan = slot.generation.plan

        def recording(batch, reserve=0, *, batched=False, batch_rows=0):
            seen.append((scheduler.prefilling, batch_rows))
            return plan(batch, reserve, batched=batched, batch_rows=batch_rows)

        slot.generation.plan = recording
        scheduler.step()    # alone
        scheduler.admit(engine.prepare(PROMPTS[1]), GenerationConfig(max_tokens=4), None, Collect())
        scheduler.step()    # beside the second prompt
        drain(scheduler)
    assert seen[0] == (0, 0) and seen[1] == (1, 1), seen


def test_a_slot_alone_just_after_shared_steps_prices_its_draft_as_shared(models):
    """Right after steps of several slots, the clients whose answers just ended are sending their
    next requests: a slot alone for those few steps (SHARED_GRACE) prices its draft as in a shared
    batch, so that no deep draft verified as if alone holds their first tokens (at 4 clients: an
    80-row lookup draft, TTFT 0.3 s); after them, and for a slot that was alone all along, alone."""
    from localspec.runtime.scheduler import SHARED_GRACE

    with Engine(models["repeat"], n_ctx=512, parallel=2) as engine:
        scheduler = engine.scheduler()
        long, short = Collect(), Collect()
        scheduler.admit(engine.prepare(PROMPTS[0]), GenerationConfig(max_tokens=40), None, long)
        scheduler.admit(engine.prepare(PROMPTS[1]), GenerationConfig(max_tokens=3), None, short)
        scheduler.step()    # both prompts
        slot = next(s for s in scheduler.slots if s.busy and s.generation.config.max_tokens == 40)
        plan = slot.generation.plan
        seen: list[tuple[int, int]] = []

        def recording(batch, reserve=0, *, batched=False, batch_rows=0):
            seen.append((scheduler.active, batch_rows))
            return plan(batch, reserve, batched=batched, batch_rows=batch_rows)

        slot.generation.plan = recording
        drain(scheduler)
    alone = [rows for active, rows in seen if active == 1]
    assert any(active == 2 for active, _ in seen) and len(alone) > SHARED_GRACE, seen
    assert all(rows >= 1 for rows in alone[:SHARED_GRACE - 1]) and alone[-1] == 0, seen


def test_the_prompt_cache_keeps_the_newest_texts_within_its_budget():
    from localspec.runtime.prompt_cache import Kept

    cache = PromptCache(100)
    for i in range(5):
        cache.put(Kept([i] * 40, bytes(30)))
    assert len(cache) == 3 and cache.used == 90
    assert cache.best([0] * 40) == (None, 0)                # the oldest went first
    kept, n = cache.best([4] * 10 + [9])
    assert kept.tokens == [4] * 40 and n == 10
    cache.touch(cache.best([2] * 40)[0])                    # used again: now the newest
    cache.put(Kept([7] * 40, bytes(30)))
    assert cache.best([2] * 40)[1] == 40 and cache.best([3] * 40) == (None, 0)
    cache.put(Kept([8] * 40, bytes(101)))            # larger than the budget: not kept
    assert cache.best([8] * 40) == (None, 0)


def test_a_seeded_sampled_request_repeats_whatever_the_other_traffic(models):
    """A seeded request's draws are its own: the other slots' traffic never moves its random stream.
    Its text is the same alone and in a crowd up to the first position where the target's numbers
    differ (on AVX-512 machines, never at 1 thread; on an AVX2-only EPYC a 4-row batch rounds
    differently from a one-row decode): there the two runs' distributions differ, which the top
    alternative's log-probability shows; the same distribution with another draw would be a bug."""
    sampled = GenerationConfig(max_tokens=40, sampling=SamplingParams(temperature=0.9, seed=5), policy=LOOKUP4,
                               logprobs=1)
    with Engine(models["noisy"], n_ctx=512, parallel=4) as engine:
        scheduler = engine.scheduler()
        alone, crowded = Collect(), Collect()
        drain(scheduler, [(PROMPTS[3], sampled, alone)], prepare=engine.prepare)
        others = [(p, GenerationConfig(max_tokens=30, policy=LOOKUP4), Collect()) for p in PROMPTS[4:7]]
        drain(scheduler, others[:2] + [(PROMPTS[3], sampled, crowded)] + others[2:], prepare=engine.prepare)
    a, c = alone.done, crowded.done
    same = next((i for i, (x, y) in enumerate(zip(a.tokens, c.tokens)) if x != y), None)
    if same is None:
        assert a.tokens == c.tokens
        return
    for i in range(same):   # the same request: the same numbers within rounding
        assert abs(a.logprobs[i].top[0].logprob - c.logprobs[i].top[0].logprob) < 1e-2
    first_a, first_c = a.logprobs[same].top[0], c.logprobs[same].top[0]
    assert (first_a.token, first_a.logprob) != (first_c.token, first_c.logprob), \
        f"token {same} drawn differently from the same distribution: the crowd moved the request's random stream"


EAGLE_DRAFTER = Path(__file__).resolve().parents[1] / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"


def _eagle_slots(target, prompts, config: GenerationConfig, monkeypatch, *, shared: bool):
    """The prompts through four slots drafting EAGLE chains: each slot's drafts in order, the
    drafter's encodes, and each prompt's DoneEvent. ``shared``: the slots' catch-ups in one
    encode and decode a step (else each alone: the per-slot path)."""
    from localspec.runtime.generation import Generation
    from localspec.speculation.drafter import ModelDrafter
    from localspec.speculation.eagle import EagleKind

    drafts, encodes = [], []
    add_rows, encode_rows = Generation.add_rows, ModelDrafter.encode_rows
    monkeypatch.setattr(Generation, "add_rows",
                        lambda self, batch, draft: drafts.append((self.verifier.seq, draft))
                        or add_rows(self, batch, draft))   # (a lone slot's planned chain: its tokens after the step)
    monkeypatch.setattr(ModelDrafter, "encode_rows", lambda self, *a: encodes.append(len(a[0])) or encode_rows(self, *a))
    write_direct = ModelDrafter.write_direct

    def direct(self, who, tokens, feats, start):   # a lone catch-up's encode in one C call (llama.hostloop)
        done = write_direct(self, who, tokens, feats, start)
        if done is not None:
            encodes.append(len(tokens))
        return done

    monkeypatch.setattr(ModelDrafter, "write_direct", direct)
    rounds = ModelDrafter.catch_up_rounds

    def fused(self, asks):   # every slot's catch-up and chain in one C call: one encode of all their rows
        rows = sum(who.pending if most is None else min(who.pending, most) for who, most, _, _ in asks)
        done = rounds(self, asks)
        if done is not None:
            encodes.append(rows)
        return done

    monkeypatch.setattr(ModelDrafter, "catch_up_rounds", fused)
    if not shared:
        monkeypatch.setattr(EagleKind, "shares_catch_up", False)
    try:
        with Engine(target, EAGLE_DRAFTER, n_ctx=256, parallel=4) as engine:
            sinks = {p: Collect() for p in prompts}
            drain(engine.scheduler(), [(p, config, sinks[p]) for p in prompts], prepare=engine.prepare)
    finally:
        monkeypatch.undo()
    return [(seq, list(d.tokens)) for seq, d in drafts], encodes, {p: sinks[p].done for p in prompts}


def test_a_lone_slot_s_chain_is_drafted_into_its_verify_rows_alone_or_beside_a_prompt(smollm2, monkeypatch):
    """A slot drafting alone plans its greedy EAGLE chain and drafts it in the step's decode
    (``Draft.planned``, ``Batch.decode``): in the chain's own C call where its rows are the
    batch's only ones, and filled in Python where another slot's prompt shares the batch. Either
    way the verify rows hold the chain's drafts (then the last one again), and the drafts pay."""
    from localspec.runtime.batch import Batch

    seen = []
    decode = Batch.decode

    def recorded(self):
        chain = self.chain
        decode(self)
        if chain is not None:
            draft, row, n = chain
            k = len(draft.tokens)
            seen.append((len(self.segments), self.tokens[row:row + n], draft.tokens + [draft.tokens[-1]] * (n - k),
                         draft.planned))
    monkeypatch.setattr(Batch, "decode", recorded)
    config = GenerationConfig(max_tokens=40, policy=PolicyConfig("fixed", 4, source="eagle", tree="off"))
    with Engine(smollm2, EAGLE_DRAFTER, n_ctx=512, parallel=2) as engine:
        scheduler = engine.scheduler()
        first, second = Collect(), Collect()
        scheduler.admit(engine.prepare("Repeat exactly: the quick brown fox jumps over the lazy dog. the quick"),
                        config, None, first)
        for _ in range(6):
            scheduler.step()
        scheduler.admit(engine.prepare("Summarize: " + " ".join(f"Item {i} is a box on shelf {i % 7}." for i in range(40))),
                        GenerationConfig(max_tokens=4, spec=False), None, second)
        drain(scheduler)
    assert {segments > 1 for segments, *_ in seen} == {True, False}   # both paths ran
    for segments, rows, drafts, planned in seen:
        assert rows == drafts and planned is None
    assert first.done.stats.accepted > 0 and second.done is not None


def test_four_slots_catch_up_together_and_draft_what_each_catch_up_alone_drafts(smollm2, monkeypatch):
    """Four slots drafting EAGLE chains with the shipped SmolLM2 pair (greedy, fixed depth 4):
    each step writes every slot's committed rows in one drafter encode and one decode
    (ModelDrafter.catch_ups, or catch_up_rounds in C), and every slot's drafts, accepted drafts
    and output are those of the per-slot path (each slot's catch-up its own encode and decode),
    the output that of plain decoding."""
    prompts = ["Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox",
               "The capital of France is Paris. The capital of Italy is",
               "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
               "Count with me: one, two, three, four, five, six,"]
    config = GenerationConfig(max_tokens=40, policy=PolicyConfig("fixed", 4, source="eagle", tree="off"))
    plain = solo(smollm2, prompts, n_ctx=256, max_tokens=40)
    per_slot, per_slot_encodes, per_slot_done = _eagle_slots(smollm2, prompts, config, monkeypatch, shared=False)
    shared, shared_encodes, shared_done = _eagle_slots(smollm2, prompts, config, monkeypatch, shared=True)
    assert shared == per_slot and sum(len(d) for _, d in shared) > 0
    for p in prompts:
        assert shared_done[p].tokens == per_slot_done[p].tokens
        assert shared_done[p].stats.sources == per_slot_done[p].stats.sources
        assert_lossless(plain[p], shared_done[p])
    assert sum(per_slot_done[p].stats.sources["eagle"][2] for p in prompts) > 0   # drafts were accepted
    # the same rows encoded, in about a quarter of the encodes
    assert sum(shared_encodes) == sum(per_slot_encodes) and len(shared_encodes) < len(per_slot_encodes) / 2


def test_the_engine_alone_and_a_scheduler_of_one_agree(models):
    """generate() and a one-slot scheduler run the same loop: same tokens, same cycles."""
    with Engine(models["repeat"], n_ctx=512) as engine:
        direct = run(engine, PROMPTS[1], max_tokens=30, policy=LOOKUP4)
        engine.clear_cache()
        sink = Collect()
        drain(engine.scheduler(), [(PROMPTS[1], GenerationConfig(max_tokens=30, policy=LOOKUP4), sink)],
              prepare=engine.prepare)
    assert sink.done.tokens == direct.tokens and sink.done.stats.cycles == direct.stats.cycles


def test_a_request_cannot_take_a_slot_when_all_are_busy_nor_the_engine_alone(models):
    with Engine(models["noisy"], n_ctx=256, parallel=2) as engine:
        scheduler = engine.scheduler()
        for p in PROMPTS[:2]:
            scheduler.admit(engine.prepare(p), GenerationConfig(max_tokens=4), None, Collect())
        with pytest.raises(LocalspecError):
            scheduler.admit(engine.prepare(PROMPTS[2]), GenerationConfig(max_tokens=4), None, Collect())
        with pytest.raises(LocalspecError, match="already generating"):   # slot 0 is the scheduler's
            run(engine, PROMPTS[2], max_tokens=4)
        drain(scheduler)
        assert run(engine, PROMPTS[2], max_tokens=4).finish_reason == "length"   # free again
        assert engine.n_ctx == 256 and engine.ctx.n_ctx >= 512 and engine.ctx.n_seq_max == 2


# -- speculation priced against the batch ---------------------------------------------------------

def _plan(costs: dict[int, float], slots: int, match: int) -> int:
    """Auto's lookup depth for a slot among ``slots`` (the others one row each), on a lookup match
    of ``match`` tokens (its acceptance prior: a short match is often wrong, a copy rarely)."""
    policy = DraftPolicy(PolicyConfig(), CostModel(costs), lookup=True)
    policy.overhead = 0.0002
    policy.batch_rows = slots - 1
    source, k = policy.plan(room=64, lookup_len=32, lookup_cls=lookup_class(match))
    assert source == (LOOKUP if k else None)
    return k


SIZES = list(range(1, 65)) + [96, 128]
# a GPU: rows nearly free up to 64 (10 ms, +10 us a row)
GPU = {b: 0.010 + 0.00001 * b for b in SIZES}
# a compute-bound CPU (this machine's Q4_0 SmolLM2, smoothed): V(4) = 2 V(1), V(16) = 4 V(1), then
# about a millisecond a row
CPU = {b: (5 * min(b, 16) ** 0.5 + max(0, b - 16) * 1.0) / 1000 for b in SIZES}


@pytest.mark.parametrize("match", [4, 8])
def test_speculation_stays_on_at_4_and_8_slots_where_rows_are_nearly_free(match):
    depths = [_plan(GPU, n, match) for n in (1, 4, 8, 16)]
    assert all(k >= 4 for k in depths), depths


def test_speculation_turns_off_as_the_batch_grows_where_rows_cost_what_they_cost_alone():
    """On the CPU curve a slot alone drafts a short, a medium and a copy-long match; among 2, 4, 8
    or 16 slots it drafts none of them: there rows of several sequences cost more than the curve
    says (measured with bench/serve_load.py on 2 cores: auto with drafts 0.83-0.96x its own plain
    decoding at 2-8 concurrent requests), so a batch drafts only where rows are nearly free."""
    for match in (4, 8, 32):
        depths = [_plan(CPU, n, match) for n in (1, 2, 4, 8, 16)]
        assert depths[0] > 0 and depths[1:] == [0, 0, 0, 0], (match, depths)


@pytest.mark.parametrize("curve", ["GPU", "CPU"])
def test_a_slot_rests_before_asking_its_text_sources_exactly_where_no_text_match_could_draft(curve):
    """``DraftPolicy.rest_shared`` (asked before the text sources are) rests a shared slot only where
    :meth:`DraftPolicy.choose` drafts no text match of any length, and never a slot alone: on the
    CPU curve every shared step rests, on the GPU curve none does."""
    costs = {"GPU": GPU, "CPU": CPU}[curve]
    for slots in (1, 2, 4, 8):
        for match in (2, 8, 32):
            asked, rests = (DraftPolicy(PolicyConfig(), CostModel(costs), lookup=True) for _ in range(2))
            for pol in (asked, rests):
                pol.overhead, pol.batch_rows = 0.0002, slots - 1
            chosen, k = asked.choose(64, [Proposal(LOOKUP, lookup_class(match), 32)])
            rested = rests.rest_shared()
            assert not (rested and chosen is not None), (curve, slots, match, k)
            assert rested == (curve == "CPU" and slots > 1), (curve, slots, match)
            assert rests.rested == int(rested)


def test_alone_the_batch_price_is_the_calibrated_curve():
    """batch_rows 0 (a generation alone, or a scheduler of one slot) plans exactly as before."""
    a = DraftPolicy(PolicyConfig(), CostModel(CPU), lookup=True)
    b = DraftPolicy(PolicyConfig(), CostModel(CPU), lookup=True)
    b.batch_rows = 0
    for match in (2, 4, 8, 16, 32):
        assert a.plan(64, 32, lookup_class(match)) == b.plan(64, 32, lookup_class(match))
    assert a._verify(5) == CostModel(CPU).verify(5)


H200 = Path(__file__).resolve().parent / "data" / "gpu_costs_h200.json"   # bench/gpu_costs.py, docs/gpu.md
# this machine's measured Q4_0 SmolLM2 curve (2 cores; test_gpu_costs.py's), seconds
CPU_MEASURED = {1: 0.005, 2: 0.0087, 3: 0.0105, 4: 0.010, 5: 0.016, 6: 0.018, 7: 0.016, 8: 0.014, 9: 0.015,
                12: 0.019, 16: 0.022, 24: 0.032, 32: 0.040, 48: 0.058, 64: 0.075, 96: 0.110, 128: 0.145}


@pytest.mark.skipif(not H200.is_file(), reason="the H200 curves (tests/data/gpu_costs_h200.json) are not here")
@pytest.mark.parametrize("label", ["llama3-8b/Q4_0", "llama3-8b/Q4_K_M", "llama3-8b/F16"])
def test_on_measured_h200_curves_speculation_stays_on_up_to_16_slots(label):
    """The H200's measured verify curves of an 8B target (fitted as calibration fits them): a lookup
    match of 8 tokens still drafts at 4, 8 and 16 slots; on this CPU's measured curve it drafts
    alone and not at 16 or 32 slots."""
    data = json.loads(H200.read_text())["models"][label]["fa_on"]["verify_ms"]
    gpu = fit_curve({int(k): ms / 1e3 for k, ms in data.items()})
    assert all(_plan(gpu, n, 8) > 0 for n in (1, 4, 8, 16))
    cpu = fit_curve(CPU_MEASURED)
    assert _plan(cpu, 1, 8) > 0 and _plan(cpu, 16, 8) == _plan(cpu, 32, 8) == 0


# -- memory ---------------------------------------------------------------------------------------

def test_slots_that_do_not_fit_the_memory_budget_are_one_clear_error(smollm2):
    from localspec.memory.pair import plan_engine
    from localspec.memory.planner import kv_bytes, layout
    from localspec.formats.gguf_info import read_gguf
    from localspec.store.models import ModelSpec

    one = plan_engine(ModelSpec("t", smollm2), n_ctx=2048, n_threads=1, ram=1 << 40)["memory_plan"]
    per_slot = kv_bytes(layout(read_gguf(smollm2)), 2048, one.kv_type)
    budget = int((one.total_bytes + 2 * per_slot) / 0.9)
    two = plan_engine(ModelSpec("t", smollm2), n_ctx=2048, n_threads=1, ram=budget, parallel=2)
    assert two["parallel"] == 2 and two["n_ctx"] == 2048 and two["memory_plan"].n_ctx == 4096
    with pytest.raises(LocalspecError) as err:
        plan_engine(ModelSpec("t", smollm2), n_ctx=2048, n_threads=1, ram=budget, parallel=64)
    message = str(err.value)
    assert "\n" not in message and message.startswith("64 slots of context 2048 do not fit the memory budget")
    auto = plan_engine(ModelSpec("t", smollm2), n_ctx=2048, n_threads=1, ram=budget, parallel=None)
    assert auto["parallel"] in (1, 2, 4) and auto["memory_plan"].fits and auto["n_ctx"] == 2048
    assert auto["memory_plan"].n_ctx == 2048 * auto["parallel"]
