"""The one driver (localspec.runtime.scheduler): Engine.generate is a scheduler of one slot,
Engine.batch_generate one of every slot; a slot's states; early close and refusal as before."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from engine_checks import PROMPTS, assert_lossless, solo
from localspec import DoneEvent, Engine, GenerationConfig
from localspec.core.errors import LocalspecError
from localspec.core.events import TokenEvent
from localspec.runtime.scheduler import SlotState
from localspec.speculation.policy import PolicyConfig
from tiny_models import noisy_and_repeat

ROOT = Path(__file__).resolve().parents[1]
LOOKUP4 = PolicyConfig("fixed", 4)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return noisy_and_repeat(tmp_path_factory.mktemp("batch"))


def _by_request(stream) -> dict[int, list]:
    out: dict[int, list] = {}
    for i, event in stream:
        out.setdefault(i, []).append(event)
    return out


def test_batch_generate_equals_generate_one_at_a_time(models):
    """Six prompts through three slots (the other three wait for a free one): each request's greedy
    output is the one generate gives it alone, each stream ends with its one DoneEvent, and the
    steps carried several requests (fewer decodes than one after another)."""
    prompts = PROMPTS[:6]
    alone = solo(models["noisy"], prompts, max_tokens=32)
    with Engine(models["noisy"], n_ctx=512, parallel=3) as engine:
        events = _by_request(engine.batch_generate(prompts, GenerationConfig(max_tokens=32, policy=LOOKUP4)))
        assert not engine._lock.locked()   # released at the end
    assert sorted(events) == list(range(6))
    for i, p in enumerate(prompts):
        dones = [e for e in events[i] if isinstance(e, DoneEvent)]
        assert len(dones) == 1 and events[i][-1] is dones[0]
        assert_lossless(alone[p], dones[0])
        assert "".join(e.text for e in events[i] if isinstance(e, TokenEvent)) == dones[0].text


def test_batch_generate_on_the_real_model(smollm2):
    """The embedded SmolLM2 target, chat prompts from bench/chat.jsonl with a config each, through
    an engine of one slot (each request waits for it): token for token what generate gives the
    same prompts one after another on a fresh engine (the same cache and recall history). Several
    slots on this model part from a request alone at small gaps, as on main before the one driver
    (a single row's attention over a pool of several slots' cells rounds otherwise; the tiny
    models above check several slots)."""
    prompts = [[{"role": "user", "content": json.loads(line)["prompt"]}]
               for line in (ROOT / "bench" / "chat.jsonl").read_text().splitlines()[:3]]
    configs = [GenerationConfig(max_tokens=24, spec=False), GenerationConfig(max_tokens=24),
               GenerationConfig(max_tokens=16, policy=PolicyConfig(source="lookup"))]
    with Engine(smollm2, n_ctx=1024) as engine:
        alone = [[e for e in engine.generate(p, c) if isinstance(e, DoneEvent)][0] for p, c in zip(prompts, configs)]
    with Engine(smollm2, n_ctx=1024) as engine:
        events = _by_request(engine.batch_generate(prompts, configs))
    assert [events[i][-1].tokens for i in range(3)] == [d.tokens for d in alone]
    assert [events[i][-1].text for i in range(3)] == [d.text for d in alone]


def test_batch_generate_checks_every_prompt_first(models):
    with Engine(models["noisy"], n_ctx=256, parallel=2) as engine:
        with pytest.raises(LocalspecError, match="2 prompts and 3 configs"):
            list(engine.batch_generate(PROMPTS[:2], [GenerationConfig()] * 3))
        with pytest.raises(LocalspecError, match="the prompt is empty"):
            list(engine.batch_generate([PROMPTS[0], ""]))
        assert not engine._lock.locked()


def test_a_slot_passes_through_its_states(models):
    """Admitted: prefill; its first token chosen: generating; its DoneEvent delivered while
    finished; then idle again, the engine released."""
    with Engine(models["noisy"], n_ctx=512) as engine:
        scheduler = engine.scheduler()
        slot = scheduler.slots[0]
        seen: list[tuple[str, SlotState]] = []
        assert slot.state is SlotState.IDLE
        scheduler.admit(engine.prepare(PROMPTS[0]), GenerationConfig(max_tokens=5, spec=False), None,
                        lambda e: seen.append((type(e).__name__, slot.state)))
        assert slot.state is SlotState.PREFILL and engine._lock.locked()
        while scheduler.active:
            scheduler.step()
        assert slot.state is SlotState.IDLE and slot.generation is None and not engine._lock.locked()
    assert seen[0] == ("TokenEvent", SlotState.GENERATING)
    assert {s for name, s in seen if name != "DoneEvent"} == {SlotState.GENERATING}
    assert seen[-1] == ("DoneEvent", SlotState.FINISHED)


def test_generate_streams_step_by_step_and_a_closed_one_frees_the_engine(models):
    """generate yields each step's events before the next step is decoded (a cancel set on the
    first token ends it there), refuses a second generation while one is open, and closing it
    early frees the slot and the engine: the next generation reuses the committed prefix."""
    with Engine(models["noisy"], n_ctx=512) as engine:
        cancel = threading.Event()
        events = []
        for event in engine.generate(PROMPTS[1], GenerationConfig(max_tokens=40, spec=False), cancel=cancel):
            events.append(event)
            cancel.set()
        done = events[-1]
        assert isinstance(done, DoneEvent) and done.finish_reason == "cancelled"
        assert 1 <= len(done.tokens) <= 3   # the step of the first event (a held-back first token: the next)
        stream = engine.generate(PROMPTS[1], GenerationConfig(max_tokens=40, spec=False))
        next(stream)
        with pytest.raises(LocalspecError, match="the engine is already generating"):
            next(engine.generate(PROMPTS[2]))
        stream.close()
        assert not engine._lock.locked()
        done = [e for e in engine.generate(PROMPTS[1], GenerationConfig(max_tokens=4, spec=False))
                if isinstance(e, DoneEvent)][0]
        assert done.stats.prompt_cached > 0
