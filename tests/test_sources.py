"""Draft sources behind one interface (localspec.speculation.sources): named statistics classes
with the priors their sources declare, a source registered from outside the package drafting
through a real generation losslessly, and ``--source`` as a comma list on the real SmolLM2 pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_run import assert_one_error, run_cli
from engine_checks import assert_lossless, run
from localspec import Engine
from localspec.core.errors import LocalspecError
from localspec.core.options import OPTIONS, check
from localspec.speculation import lookup, prediction, recall, registry
from localspec.speculation.costmodel import CostModel
from localspec.speculation.model_source import EagleSource, MtpSource
from localspec.speculation.policy import (DraftPolicy, Learned, PolicyConfig, lookup_class, prediction_class,
                                          recall_class)
from localspec.speculation.sources import (CLASSES, Found, TextSource, model_source, register, text_sources,
                                           unregister, wants)

DRAFTER = Path(__file__).resolve().parents[1] / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"
COPY = [{"role": "user", "content": "Repeat this sentence exactly, twice: The quick brown fox jumps over the "
                                    "lazy dog while the small cat sleeps under the old wooden table."}]


def test_statistics_classes_are_named_with_their_sources_priors_in_the_old_order():
    """Every class has a name (source, bucket) and the prior its source declares; the indices are
    those the integer offsets gave (lookup's lengths, its loops, the predictions', recall's)."""
    names = [(c.source, c.bucket) for c in CLASSES][:14]
    assert names[:8] == [("lookup", f"match {b}") for b in ("1", "2", "3", "4-7", "8-15", "16-31", "32-63", "64+")]
    assert names[8:] == [("lookup", "loop 4-7"), ("lookup", "loop 8-15"), ("lookup", "loop 16-31"),
                         ("prediction", "realigned"), ("prediction", "followed"), ("recall", "recall")]
    priors = lookup.LOOKUP_PRIORS + lookup.LOOP_PRIORS + prediction.PREDICTION_PRIORS + (recall.RECALL_PRIOR,)
    assert [c.prior for c in CLASSES][:14] == list(priors)
    assert lookup_class(40) == CLASSES.index("lookup", "match 32-63")
    assert lookup_class(12, 10) == CLASSES.index("lookup", "loop 8-15")
    assert prediction_class(1) == CLASSES.index("prediction", "realigned")
    assert prediction_class(9) == CLASSES.index("prediction", "followed")
    assert recall_class() == CLASSES.index("recall", "recall") == 13
    deep = {(c.source, c.bucket) for c in CLASSES if c.deep}
    assert deep == {("lookup", "match 16-31"), ("lookup", "match 32-63"), ("lookup", "match 64+"),
                    ("lookup", "loop 16-31"), ("prediction", "followed"), ("recall", "recall")}
    learned = Learned()   # one acceptance per class, from its prior; the model drafter's is eagle's
    assert learned.eagle is learned.lookup[CLASSES.index("eagle", "drafter")]
    assert learned.eagle.rates()[:2] == [0.5, 0.6] and len(learned.eagle.rates()) == OPTIONS["draft_max"].hi
    assert learned.lookup[recall_class()].rates()[:2] == [0.95, 0.97]


def test_the_builtin_sources_are_registered_in_order_and_switched_by_their_word():
    assert [s.name for s in registry.BUILTIN] == ["lookup", "prediction", "recall", "eagle", "mtp", "assistant",
                                                  "dflash", "dspark"]
    assert [s.name for s in text_sources()] == ["prediction", "lookup", "recall"]   # asked in this order
    assert wants("auto", "lookup") and wants("mtp,lookup", "lookup") and not wants("mtp", "lookup")
    assert check("source", "mtp, lookup") == "mtp,lookup"
    for bad, why in (("lookup,nope", "'nope' is not one"), ("auto,eagle", "'auto' stands alone"),
                     ("lookup,lookup", "a word twice")):
        with pytest.raises(LocalspecError, match=why):
            PolicyConfig(source=bad)
    policy = DraftPolicy(PolicyConfig(source="eagle,lookup"), None, eagle=True, lookup=True)
    assert policy.eagle and policy.lookup
    policy = DraftPolicy(PolicyConfig(source="lookup"), None, eagle=True, lookup=True)
    assert not policy.eagle and policy.lookup
    # each prices its own draft: a text source nothing, a model drafter k calibrated steps
    cost = CostModel({1: 0.01, 2: 0.015}, drafter_step=0.004)
    assert lookup.LookupSource(None, 0).cost(8, cost) == 0.0
    assert EagleSource(None, None, None).cost(3, cost) == pytest.approx(3 * cost.drafter_step)
    assert model_source("mtp") is MtpSource and model_source("eagle") is EagleSource


class FixedContinuation(TextSource):
    """A test's own source: proposes ``TEXT`` (token ids) as the output's continuation, wherever
    the output so far is a prefix of it; a statistics class of its own, drafted deep."""

    name = "fixed-text"
    order = 5
    classes = (("all", (0.95, 0.97), True),)
    TEXT: list[int] = []
    ANYWHERE = False   # propose TEXT's next tokens even where the output left it

    def __init__(self, history, start: int) -> None:
        self.history, self.start = history, start
        self.cls = CLASSES.index(self.name, "all")
        self.committed = 0

    @classmethod
    def create(cls, ctx):
        # the history holds the prompt and the first output token
        return cls(ctx.history, len(ctx.history) - 1) if ctx.history is not None else None

    def find(self):
        out = self.history.tokens[self.start:]
        text = self.TEXT
        if len(out) >= len(text) or (text[:len(out)] != out and not self.ANYWHERE):
            return None
        return Found(self, len(out) + 64, self.cls, len(out))   # longer than any lookup match

    def propose(self, found, k):
        return self.TEXT[found.at:found.at + k]

    def commit(self, tokens):
        self.committed += len(tokens)


@pytest.fixture
def fixed_source():
    register(FixedContinuation)
    try:
        yield FixedContinuation
    finally:
        unregister(FixedContinuation)
    assert "fixed-text" not in OPTIONS["source"].words
    with pytest.raises(LocalspecError, match="'fixed-text' is not one"):
        PolicyConfig(source="fixed-text,lookup")   # unregistered: no longer a source word


@pytest.mark.slow
def test_a_registered_source_drafts_through_a_generation_losslessly(smollm2, fixed_source):
    """A source registered from outside the package (its module and one register call): named
    in --source it drafts, its drafts are accepted where right, and greedy output stays the plain
    one, whether its text is the output itself or another text; the stats count it by its name."""
    with Engine(smollm2, n_ctx=1024) as engine:
        plain = run(engine, COPY, max_tokens=40, spec=False, record_margins=True)
        fixed_source.TEXT = list(plain.tokens)
        for name in ("fixed", "auto"):
            right = run(engine, COPY, max_tokens=40, policy=PolicyConfig(name=name, source="fixed-text"))
            assert_lossless(plain, right)
            assert set(right.stats.sources) == {"fixed-text"}, right.stats.sources
            assert right.stats.accepted >= 0.5 * right.stats.generated_tokens, (name, right.stats)
            assert right.stats.policy_choices["fixed-text"] > 0
        # every draft wrong: all rejected, output unchanged
        fixed_source.TEXT, fixed_source.ANYWHERE = [t + 1 for t in plain.tokens], True
        wrong = run(engine, COPY, max_tokens=40, policy=PolicyConfig(name="fixed", source="fixed-text"))
        assert_lossless(plain, wrong)
        assert wrong.stats.accepted == 0 and wrong.stats.drafted > 0, wrong.stats
        fixed_source.ANYWHERE = False
        # with lookup beside it, under auto (every source): the proposal with the longer match
        fixed_source.TEXT = list(plain.tokens)
        both = run(engine, COPY, max_tokens=40, policy=PolicyConfig(source="fixed-text,lookup"))
        assert_lossless(plain, both)
        assert "fixed-text" in both.stats.sources


@pytest.mark.slow
def test_a_comma_list_of_sources_drafts_with_each_on_the_real_pair(smollm2):
    """``eagle,lookup`` weighs the drafter file and lookup against each other (auto's sources on
    this pair): lossless, and each drafts where it pays; ``fixed`` over ``lookup,eagle`` drafts
    with the drafter every cycle; ``mtp,lookup`` on an engine with no MTP heads is one clear error."""
    with Engine(smollm2, DRAFTER, n_ctx=1024) as engine:
        plain = run(engine, COPY, max_tokens=48, spec=False, record_margins=True)
        both = run(engine, COPY, max_tokens=48, policy=PolicyConfig(source="eagle,lookup", recall=False))
        assert_lossless(plain, both)
        assert both.stats.sources.get("lookup", [0, 0, 0])[2] > 0, both.stats.sources   # the copy: lookup
        fixed = run(engine, COPY, max_tokens=24, policy=PolicyConfig(name="fixed", source="lookup,eagle"))
        assert_lossless(plain, fixed)
        assert fixed.stats.policy_choices["eagle"] > 0 and fixed.stats.sources.get("eagle"), fixed.stats
        with pytest.raises(LocalspecError, match="no MTP heads"):
            run(engine, COPY, max_tokens=4, policy=PolicyConfig(source="mtp,lookup"))


def test_cli_names_the_flag_for_an_unknown_source_in_a_list(smollm2):
    for value, why in (("lookup,nope", "'nope' is not one"), ("auto,lookup", "'auto' stands alone")):
        proc = run_cli("generate", "--target", str(smollm2), "-p", "hi", "-n", "2", "--source", value)
        line = assert_one_error(proc, contains=f"draft source must be auto, eagle, lookup, mtp, assistant, dflash or dspark, or a comma list")
        assert why in line and line.endswith("(--source)"), line
