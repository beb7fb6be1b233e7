"""``auto`` with a block drafter (DFlash) on a target whose step costs more than a block: the
costly tiny target of tests/dflash_models.py (8 layers of a 8192-wide FFN; on the 4-layer tiny
target a block of full-vocabulary rows costs four target steps and never pays, which
tests/test_dflash.py checks). With the cost model calibrated on this machine, a drafter whose
blocks are good drafts blocks and a garbage one is left off (few or no drafts), greedy output
equal to plain decoding in both. No timing is asserted: bench/block_drafters.py times auto
against plain decoding (docs/speculation.md)."""

from __future__ import annotations

import pytest

from dflash_models import build_costly_target, build_dflash
from localspec import Engine
from localspec.core.events import DoneEvent
from localspec.runtime.config import GenerationConfig
from localspec.speculation.policy import PolicyConfig

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown"


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
