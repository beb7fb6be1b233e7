"""``auto`` with a block drafter (DFlash) on a target whose step costs more than a block: the
costly tiny target of tests/dflash_models.py (8 layers of a 8192-wide FFN; on the 4-layer tiny
target a block of full-vocabulary rows costs four target steps and never pays, which
tests/test_dflash.py checks). With the cost model calibrated on this machine, a drafter whose
blocks are good drafts blocks and a garbage one is left off (few or no drafts), greedy output
equal to plain decoding in both. No timing is asserted: bench/block_drafters.py times auto
against plain decoding (docs/speculation.md)."""

from __future__ import annotations

import pytest

from dflash_models import NOISE, build_costly_target, build_dflash
from localspec import Engine
from localspec.core.events import DoneEvent
from localspec.runtime.config import GenerationConfig
from localspec.runtime.sampling import SamplingParams
from localspec.speculation import costmodel
from localspec.speculation import policy as policy_module
from localspec.speculation.policy import PolicyConfig
from tiny_models import build_target

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"
STORY = "Once upon a time there was a little house in the woods, and"


@pytest.fixture(scope="module")
def costly(tmp_path_factory):
    d = tmp_path_factory.mktemp("block_auto")
    return {"target": build_costly_target(d / "costly.gguf"), "dflash": build_dflash(d / "dflash.gguf"),
            "dflash_random": build_dflash(d / "dflash_random.gguf", kind="random")}


def _auto_and_plain(target, drafter, n: int) -> tuple[DoneEvent, DoneEvent]:
    """Greedy generations of ``n`` tokens with ``auto`` (the cost model calibrated first) and plain."""
    with Engine(target, drafter, n_ctx=256, n_threads=1) as engine:
        engine.cost_model()
        out = []
        for spec in (True, False):
            engine.clear_cache()
            cfg = GenerationConfig(max_tokens=n, spec=spec, policy=PolicyConfig("auto", source="dflash"))
            out.append([e for e in engine.generate(PROMPT, cfg) if isinstance(e, DoneEvent)][0])
    return out[0], out[1]


def test_dflash_auto_drafts_good_blocks_where_the_target_costs_more_than_a_block(costly, tmp_path, monkeypatch):
    """The "repeat" drafter's blocks are mostly accepted: auto drafts blocks of them (more than
    one draft per drafter decode), and the text is plain decoding's."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    auto, plain = _auto_and_plain(costly["target"], costly["dflash"], 128)
    assert auto.tokens == plain.tokens
    cycles, drafted, accepted = auto.stats.sources.get("dflash", [0, 0, 0])
    assert cycles > 0 and accepted > 0 and drafted > cycles, (auto.stats.sources, auto.stats.policy_choices)


def test_dflash_auto_leaves_a_garbage_block_drafter_off_on_the_costly_target(costly, tmp_path, monkeypatch):
    """A drafter whose blocks are garbage drafts next to nothing under auto (its rows' low
    confidence cuts them, and a probe that drafts and fails doubles the wait for the next), and
    the text is plain decoding's."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path))
    auto, plain = _auto_and_plain(costly["target"], costly["dflash_random"], 128)
    assert auto.tokens == plain.tokens
    cycles, drafted, accepted = auto.stats.sources.get("dflash", [0, 0, 0])
    assert cycles <= 3 and drafted <= 8, (auto.stats.sources, auto.stats.policy_choices)


def test_auto_rests_while_a_garbage_block_drafter_cannot_draft(tmp_path, monkeypatch):
    """On the tiny target (a step of ~1 ms, where weighing the sources every cycle cost 3-6%),
    ``auto`` with a garbage DFlash drafter rests: most cycles build no proposal and weigh
    nothing (``DraftPolicy.choose`` is asked only when the probe clock is due), as spec-off
    decoding does; greedy and seeded sampled text equal spec-off's (a rested cycle draws what
    a plain step draws). The weighings that remain (the probe's could-pay rechecks) back off
    while the answer stays no: about 6 in 160 cycles, where one in 8 cycles weighed before. The
    answers themselves rest on live timings, so the test checks the backoff's rule on the answers
    given (CI once saw a yes on a busy machine: 16 weighings)."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    target = build_target(tmp_path / "noisy.gguf", "noisy", noise=NOISE)
    drafter = build_dflash(tmp_path / "dflash_random.gguf", kind="random")
    weighed, policies = [0], []
    choose = policy_module.DraftPolicy.choose

    def counted(self, room, proposals):
        weighed[0] += 1
        if self not in policies:
            policies.append(self)
        return choose(self, room, proposals)

    monkeypatch.setattr(policy_module.DraftPolicy, "choose", counted)
    asked = []   # the could-pay answers: (probe clock, depth to probe; 0: no)
    could_pay = policy_module.DraftPolicy._probe_could_pay

    def answered(self, p, k_max, o):
        pays = could_pay(self, p, k_max, o)
        asked.append((self._probes[p.source].since, pays))
        return pays

    monkeypatch.setattr(policy_module.DraftPolicy, "_probe_could_pay", answered)
    told = {"at once": 0, "queued": 0}   # how the cycles' seconds reach the cost model
    observe_verify, observe_step = costmodel.CostModel.observe_verify, costmodel.CostModel.observe_step

    def at_once(self, b, seconds):
        told["at once"] += 1
        observe_verify(self, b, seconds)

    def queued(self, seconds):
        told["queued"] += 1
        observe_step(self, seconds)

    monkeypatch.setattr(costmodel.CostModel, "observe_verify", at_once)
    monkeypatch.setattr(costmodel.CostModel, "observe_step", queued)
    n = 160
    with Engine(target, drafter, n_ctx=512, n_threads=1) as engine:
        engine.cost_model()
        for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=11)):
            out = {}
            for spec in (False, True):
                engine.clear_cache()
                weighed[0], policies[:], asked[:] = 0, [], []
                told.update({"at once": 0, "queued": 0})
                cfg = GenerationConfig(max_tokens=n, spec=spec, sampling=sampling,
                                       policy=PolicyConfig("auto", source="dflash"))
                out[spec] = [e for e in engine.generate(STORY, cfg) if isinstance(e, DoneEvent)][0]
            auto = out[True]
            assert auto.tokens == out[False].tokens, sampling
            assert auto.stats.drafted == 0, auto.stats.sources
            rested = policies[0].rested
            cycles = auto.stats.cycles
            assert cycles >= 100 and rested >= cycles // 2 and weighed[0] + rested == cycles, (cycles, rested, weighed[0])
            # the could-pay rechecks back off while the answer stays no (8, 16, 32, 64 cycles); a yes
            # (the cycle's overhead, a live input, spikes on a busy machine) wakes every cycle until
            # the next recheck, PROBE_RECHECK cycles on, and starts the backoff again (about 3 more
            # rechecks): a handful of weighings, not one in 8
            wait = policy_module.PROBE_RECHECK
            for (since, pays), (later, pays_later) in zip(asked, asked[1:]):
                assert later - since == wait or later < since and pays, (asked, cycles)   # (or a probe drafted)
                again = not pays and not pays_later and later > since
                wait = min(2 * wait, policy_module.RECHECK_MAX) if again else policy_module.PROBE_RECHECK
            yes = sum(1 for _, pays in asked if pays)
            assert weighed[0] <= 2 + cycles // 32 + (policy_module.PROBE_RECHECK + 3) * yes, (cycles, weighed[0], asked)
            # every cycle's seconds queued for the cost model (folded in before it is read)
            # (but a probe's verify, after a yes), none told at once
            assert told["queued"] + told["at once"] == cycles and told["at once"] <= yes, (told, cycles, asked)
