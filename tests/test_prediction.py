"""Predicted Outputs: the prediction is a draft source (aligned with the output, resynchronised
after an edit); the output never changes; accepted/rejected prediction tokens as OpenAI counts them."""

from __future__ import annotations

import pytest

from localspec import Engine
from localspec.speculation.policy import PolicyConfig
from localspec.speculation.prediction import START_MATCH, PredictionSource, prediction_tokens_used

from engine_checks import assert_lossless, run
from tiny_models import build_target

CODE = '''def add(a, b):
    """Return the sum of a and b."""
    return a + b


def mul(a, b):
    """Return the product of a and b."""
    return a * b
'''
EDIT = [{"role": "user", "content": "Rename the function add to plus in this code and print nothing "
         "else than the code:\n```python\n" + CODE + "```"}]


def test_the_source_follows_the_prediction_and_resynchronises_after_an_edit():
    pred = PredictionSource([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert pred.propose(3) == ([1, 2, 3], START_MATCH)
    pred.extend([1, 2])
    assert pred.propose(2)[0] == [3, 4]
    pred.extend([42])                          # an edit: lost, nothing in the prediction ends so
    assert pred.propose(2) == ([], 0)
    pred.extend([5])                           # back on the prediction: after its 5
    assert pred.propose(3) == ([6, 7, 8], 1)
    pred.extend([6, 7])
    assert pred.propose(9) == ([8, 9], 3)
    pred.extend([8, 9])                        # the end: nothing more to propose
    assert pred.propose(4) == ([], 0)


def test_resynchronising_prefers_the_next_occurrence_forward():
    pred = PredictionSource([7, 1, 7, 2, 7, 3])
    pred.extend([7, 1, 7, 2, 99, 7])           # the 7 after the edit: the one after the aligned point
    assert pred.propose(1)[0] == [3]


def test_accepted_and_rejected_count_the_prediction_tokens_in_the_completion():
    assert prediction_tokens_used([1, 2, 3, 4], [1, 2, 9, 4, 5]) == (3, 1)
    assert prediction_tokens_used([1, 2], []) == (0, 2)
    assert prediction_tokens_used([], [1]) == (0, 0)


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    return build_target(tmp_path_factory.mktemp("prediction") / "noisy.gguf", "noisy", noise=0.006)


def test_tiny_output_is_the_same_with_any_prediction(noisy):
    with Engine(noisy, n_ctx=1024) as engine:
        for prompt in ("Hello world, this is", "def fibonacci(n):"):
            plain = run(engine, prompt, max_tokens=40, spec=False, record_margins=True)
            good = engine.model.detokenize(plain.tokens[:24])
            for prediction, policy in ((good, PolicyConfig("fixed", 6, source="lookup")),
                                       (good[:20] + " banana " + good[20:], PolicyConfig("fixed", 6, source="lookup")),
                                       ("unrelated text entirely", PolicyConfig("auto", 8))):
                spec = run(engine, prompt, max_tokens=40, prediction=prediction, policy=policy)
                assert_lossless(plain, spec)
                stats = spec.stats
                assert stats.accepted_prediction_tokens is not None
                n_pred = len(engine.model.tokenize(prediction, add_special=False, parse_special=False))
                assert stats.accepted_prediction_tokens + stats.rejected_prediction_tokens == n_pred
            # the exact continuation as the prediction: drafted from it and accepted (the text
            # retokenized may split its last word otherwise)
            spec = run(engine, prompt, max_tokens=40, prediction=good, policy=PolicyConfig("fixed", 6, source="lookup"))
            assert spec.stats.sources["prediction"][2] >= 12
            assert spec.stats.accepted_prediction_tokens >= 20 and spec.stats.rejected_prediction_tokens <= 2


def test_smollm2_edit_with_the_original_code_as_prediction(smollm2):
    with Engine(smollm2, n_ctx=2048) as engine:
        plain = run(engine, EDIT, max_tokens=120, spec=False, record_margins=True)
        assert plain.text.strip() != CODE.strip()    # (SmolLM2-135M drops the docstrings: an edit all the same)
        for policy in (PolicyConfig("auto", 8), PolicyConfig("fixed", 8, source="lookup")):
            spec = run(engine, EDIT, max_tokens=120, prediction=CODE, policy=policy)
            assert_lossless(plain, spec)
            assert spec.stats.accepted_prediction_tokens > 0
            if policy.name == "fixed":   # (auto drafts where its cost model says it pays: not on a loaded machine)
                assert spec.stats.sources["prediction"][2] > 0     # prediction drafts were accepted
            assert spec.stats.to_dict()["accepted_prediction_tokens"] == spec.stats.accepted_prediction_tokens
        off = run(engine, EDIT, max_tokens=120, spec=False, prediction=CODE)
        assert off.tokens == plain.tokens and off.stats.accepted_prediction_tokens > 0


def test_predictions_have_their_own_statistics_classes():
    from localspec.speculation.policy import (PREDICTION_SURE, DraftPolicy, Learned, _long_class, prediction_class,
                                              recall_class)

    weak, sure = prediction_class(1), prediction_class(PREDICTION_SURE)
    assert weak != sure and not _long_class(weak) and _long_class(sure)
    learned = Learned()
    assert recall_class() == sure + 1   # recall's class follows, then the model drafter's
    assert learned.lookup[recall_class() + 1] is learned.eagle
    assert learned.lookup[sure].expected(4)[-1] > learned.lookup[weak].expected(4)[-1]
    assert prediction_class(START_MATCH) == sure        # the first alignment counts as followed
    policy = DraftPolicy(PolicyConfig("fixed", 4, source="lookup"), lookup=True, learned=learned)
    policy.lookup_settled(sure, 8, 0)                   # a miss lowers the class's first position
    assert learned.lookup[sure].rates()[0] < 0.9
