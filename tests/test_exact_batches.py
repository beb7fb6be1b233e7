"""Exact mode's rules in the scheduler (runtime.batch, runtime.verifier), on a tiny model: a batch
holding an exact generation's rows keeps under 64 rows in all (prompts in chunks of 63, another
slot's rows included), and an exact generation reuses only a cached prefix that exact rows wrote."""

from __future__ import annotations

import pytest

from localspec import DoneEvent, Engine, GenerationConfig
from localspec.runtime.batch import Batch
from tiny_models import build_target

PROMPT = [100 + i % 97 for i in range(200)]
OTHER = [2000 + i % 89 for i in range(150)]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return build_target(tmp_path_factory.mktemp("exact") / "repeat.gguf", "repeat")


def done_of(events) -> DoneEvent:
    return next(e for e in events if isinstance(e, DoneEvent))


def test_an_exact_generation_reuses_only_a_prefix_exact_rows_wrote(target):
    exact = GenerationConfig(max_tokens=4, spec=False, rows_match=True)
    plain = GenerationConfig(max_tokens=4, spec=False)
    with Engine(target, n_ctx=512) as engine:
        assert done_of(engine.generate(PROMPT, plain)).stats.prompt_cached == 0
        first = done_of(engine.generate(PROMPT, exact))
        assert first.stats.prompt_cached == 0          # the default's rows wrote that prefix: read again
        again = done_of(engine.generate(PROMPT, exact))
        assert again.stats.prompt_cached == len(PROMPT) - 1 and again.tokens == first.tokens
        assert done_of(engine.generate(PROMPT, plain)).stats.prompt_cached == len(PROMPT) - 1
        # the default request rewrote only the last prompt row: the prefix before it is still exact
        assert done_of(engine.generate(PROMPT, exact)).stats.prompt_cached == len(PROMPT) - 1


def test_an_exact_generations_batches_stay_under_64_rows_with_another_slot_beside_it(target, monkeypatch):
    rows: list[tuple[int, bool]] = []
    decode = Batch.decode

    def recorded(self):
        rows.append((self.rows, len({s if isinstance(s, int) else s[0] for s in self.seqs}) > 1))
        return decode(self)

    exact = GenerationConfig(max_tokens=24, rows_match=True)
    other = GenerationConfig(max_tokens=24)
    with Engine(target, n_ctx=512, parallel=2) as engine:
        alone = done_of(engine.generate(PROMPT, exact))
        engine.clear_cache()
        monkeypatch.setattr(Batch, "decode", recorded)
        events = [e for i, e in engine.batch_generate([OTHER, PROMPT], [other, exact]) if i == 1]
    assert done_of(events).tokens == alone.tokens
    assert rows and max(n for n, _ in rows) <= 63, rows
    assert any(shared for _, shared in rows), rows   # some batches held both slots' rows
