"""Recall (localspec.speculation.recall): a request that repeats an earlier one's text is drafted
from that text, on the real SmolLM2 pair, output unchanged; the store's own rules in isolation."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_checks import assert_lossless, run
from localspec import Engine
from localspec.runtime.sampling import SamplingParams
from localspec.speculation.lookup import LONG_N, MATCH_CAP
from localspec.speculation.recall import Recall


def doc(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_a_history_ending_like_an_earlier_text_continues_it():
    recall = Recall()
    recall.add(doc(1000, 40))
    history = [7, 8, 9] + doc(1000, 20)             # the last 16 tokens occurred at 1004..1019
    start, match = recall.find(history)
    assert match == 20                              # followed back over every token that agrees
    assert recall.continuation(start, 5) == doc(1020, 5)
    assert recall.continuation(start, 100) == doc(1020, 20)   # not past the end of the document


def test_no_proposal_without_a_long_match_nor_across_documents():
    recall = Recall()
    recall.add(doc(1000, 30))
    recall.add(doc(5000, 30))
    assert recall.find(doc(1000, LONG_N - 1)) == (0, 0)        # shorter than LONG_N
    assert recall.find([1, 2, 3] + doc(3000, 20)) == (0, 0)    # never seen
    assert recall.find(doc(1014, LONG_N)) == (0, 0)            # nothing followed it in its document
    start, match = recall.find(doc(1013, LONG_N))
    assert match == LONG_N and recall.continuation(start, 8) == [1029]
    recall.add(doc(9000, LONG_N))                                 # too short to hold a continuation
    assert recall.find(doc(9000, LONG_N)) == (0, 0)


def test_the_match_is_capped_and_the_latest_occurrence_wins():
    recall = Recall()
    recall.add(doc(0, 200) + [1])
    recall.add(doc(0, 200) + [2])
    start, match = recall.find(doc(0, 200))
    assert match == MATCH_CAP and recall.continuation(start, 1) == [2]


def test_the_store_keeps_the_newest_text_within_its_capacity():
    recall = Recall(capacity=100)
    for i in range(10):
        recall.add(doc(1000 * (i + 1), 30))
    assert len(recall) <= 100
    assert recall.find(doc(10000, 20))[1] == 20               # the newest document is there
    assert recall.find(doc(1000, 20)) == (0, 0)               # the oldest is gone
    recall.clear()
    assert len(recall) == 0 and recall.find(doc(10000, 20)) == (0, 0)


DRAFTER = Path(__file__).resolve().parents[1] / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"
QUESTION = [{"role": "user", "content": "Name the planets of the solar system, with one fact about each."}]


@pytest.mark.slow
def test_a_repeated_request_is_drafted_from_the_first_and_its_output_is_unchanged(smollm2):
    """The second of two identical greedy requests drafts most of its answer from the first one's
    text (auto, the shipped pair), and its tokens are the first one's; clear_cache forgets it; a
    sampled request does not recall."""
    with Engine(smollm2, DRAFTER, n_ctx=1024) as engine:
        first = run(engine, QUESTION, max_tokens=96, record_margins=True)
        again = run(engine, QUESTION, max_tokens=96)
        assert_lossless(first, again)
        assert again.stats.accepted >= 0.8 * again.stats.generated_tokens, again.stats
        assert again.stats.generation_seconds < first.stats.generation_seconds
        engine.clear_cache()
        fresh = run(engine, QUESTION, max_tokens=96)
        assert fresh.stats.accepted < 0.5 * fresh.stats.generated_tokens, fresh.stats
        # a seeded sampled request does not recall: it repeats whatever ran before it
        sampled = [run(engine, QUESTION, max_tokens=48, sampling=SamplingParams(temperature=0.8, seed=7)).tokens
                   for _ in range(2)]
        assert sampled[0] == sampled[1]


def test_recall_off_through_the_request_field_and_serve_s_switch():
    """``"recall": false`` turns it off for one request; ``serve --no-recall`` (the server's policy)
    for every one, and a request's ``true`` cannot turn it back on."""
    from localspec.server.params import ServeDefaults, generation_config
    from localspec.server.schemas import CompletionRequest
    from localspec.speculation.policy import PolicyConfig

    def recall(defaults_on: bool, field):
        body = {"prompt": "hi"} if field is None else {"prompt": "hi", "recall": field}
        defaults = ServeDefaults(n_ctx=1024, policy=PolicyConfig(recall=defaults_on))
        return generation_config(CompletionRequest.model_validate(body), defaults, 8).policy.recall

    assert recall(True, None) and recall(True, True) and not recall(True, False)
    assert not recall(False, None) and not recall(False, True) and not recall(False, False)
    with pytest.raises(Exception, match="recall"):
        CompletionRequest.model_validate({"prompt": "hi", "recall": "no"})   # a bool, not a word


@pytest.mark.slow
def test_with_recall_off_no_text_is_kept_and_a_repeat_is_not_drafted_from_it(smollm2):
    """policy recall=False (``--no-recall``, ``PARAMETER draft_recall false``, a request's
    ``"recall": false``): the generation adds nothing to the store and drafts nothing from it; its
    output is that of a generation with recall on."""
    from localspec.speculation.policy import PolicyConfig

    off = PolicyConfig(recall=False)
    with Engine(smollm2, DRAFTER, n_ctx=1024) as engine:
        first = run(engine, QUESTION, max_tokens=96, policy=off, record_margins=True)
        assert len(engine.recall) == 0
        again = run(engine, QUESTION, max_tokens=96, policy=off)
        assert len(engine.recall) == 0
        assert_lossless(first, again)
        assert again.stats.accepted < 0.5 * again.stats.generated_tokens, again.stats   # as after clear_cache
        run(engine, QUESTION, max_tokens=8)   # recall on: its text is kept for the next request
        assert len(engine.recall) > 0
