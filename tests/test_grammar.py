"""Grammar-constrained decoding (llama.cpp's GBNF sampler): lossless under speculation (chain,
tree, lookup), lazy grammars, JSON on the real SmolLM2, bad grammars as one error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from localspec import Engine
from localspec.core.errors import LocalspecError
from localspec.speculation.policy import PolicyConfig
from localspec.runtime.sampling import SamplingParams

from engine_checks import PROMPTS, assert_lossless, run
from tiny_models import build_drafter, build_target

# letters a-g and spaces, ending in a full stop: the repeat target copies "a b c ..." prompts
LETTERS = 'root ::= [a-g ]+ "."'
# words from a small set: the grammar often overrides the target's choice
WORDS = 'root ::= ( ("the" | "fox" | "dog" | " " | "," | "1" | "2") )+'
COPY = "a b c d e f g a b c d e f g a b c"
DRAFTER = Path(__file__).resolve().parents[1] / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"

POLICIES = {
    "lookup": PolicyConfig("fixed", 6, source="lookup"),
    "chain": PolicyConfig("fixed", 4, source="eagle"),
    "tree": PolicyConfig("fixed", 4, source="eagle", tree="on", tree_width=3, tree_nodes=12),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("grammar")
    paths = {"repeat": build_target(d / "repeat.gguf", "repeat"),
             "noisy": build_target(d / "noisy.gguf", "noisy", noise=0.006)}
    paths["d_repeat"] = build_drafter(d / "d_repeat.gguf", paths["repeat"], "repeat")
    return paths


@pytest.mark.parametrize("target", ["repeat", "noisy"])
@pytest.mark.parametrize("grammar", [LETTERS, WORDS])
def test_greedy_grammar_output_is_the_same_with_every_draft_source(tiny, target, grammar):
    with Engine(tiny[target], tiny["d_repeat"], n_ctx=1024) as engine:
        for prompt in PROMPTS[:4] + [COPY]:
            plain = run(engine, prompt, max_tokens=32, spec=False, record_margins=True, grammar=grammar)
            text = plain.text
            allowed = set("abcdefg .") if grammar == LETTERS else set("thefoxdg ,12")
            assert text and set(text) <= allowed
            drafted = 0
            for name, policy in POLICIES.items():
                spec = run(engine, prompt, max_tokens=32, policy=policy, grammar=grammar)
                assert_lossless(plain, spec)
                drafted += spec.stats.drafted
            assert drafted > 0


def test_grammar_changes_the_output_and_sampling_stays_inside_it(tiny):
    with Engine(tiny["noisy"], n_ctx=1024) as engine:
        free = run(engine, PROMPTS[0], max_tokens=24, spec=False)
        bound = run(engine, PROMPTS[0], max_tokens=24, spec=False, grammar=WORDS)
        assert free.text != bound.text
        for seed in range(3):
            done = run(engine, COPY, max_tokens=24, grammar=WORDS, policy=POLICIES["lookup"],
                       sampling=SamplingParams(temperature=1.0, seed=seed, top_k=0, top_p=1.0, min_p=0.0))
            assert done.text and set(done.text) <= set("thefoxdg ,12")


def test_the_end_of_text_comes_only_where_the_grammar_may_end(tiny):
    with Engine(tiny["repeat"], n_ctx=1024) as engine:
        done = run(engine, COPY, max_tokens=200, spec=False, grammar='root ::= "a b c."')
        assert done.text == "a b c." and done.finish_reason == "stop"


def test_a_lazy_grammar_applies_only_after_its_trigger(tiny):
    # the repeat target repeats its last token (" c c c ..."); once "c c" has appeared, the grammar
    # (which covers the trigger itself) allows only x's after it
    lazy = 'root ::= "c c" [ ]? "x"+'
    with Engine(tiny["repeat"], n_ctx=1024) as engine:
        plain = run(engine, COPY, max_tokens=8, spec=False)
        done = run(engine, COPY, max_tokens=8, spec=False, grammar=lazy, grammar_triggers=["c c"])
        spec = run(engine, COPY, max_tokens=8, grammar=lazy, grammar_triggers=["c c"], policy=POLICIES["lookup"])
        strict = run(engine, COPY, max_tokens=8, spec=False, grammar=lazy)
    assert plain.text == " c" * 8
    assert done.tokens[:2] == plain.tokens[:2]                 # free until the trigger
    assert done.text.startswith(" c c") and set(done.text[4:].strip()) == {"x"}
    assert spec.tokens == done.tokens
    assert strict.text.startswith("c cx") or strict.text.startswith("c c x")   # not lazy: from the start


@pytest.mark.parametrize("bad", ["root ::= foo", 'rot ::= "a"', 'root ::= "a', "root ::= root \"a\"", ""])
def test_a_bad_grammar_is_one_error(tiny, bad):
    with Engine(tiny["repeat"], n_ctx=256) as engine:
        with pytest.raises(LocalspecError, match="grammar"):
            run(engine, COPY, max_tokens=4, grammar=bad)
        assert run(engine, COPY, max_tokens=4).tokens   # the engine is still usable


def test_smollm2_json_output_parses_and_speculation_keeps_it(smollm2):
    """The real SmolLM2 with the shipped drafter: chain, tree and lookup drafts under JSON grammars."""
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    prompts = ["Give me a person as JSON.", "Describe a cat in JSON with its name and age."]
    policies = [PolicyConfig("fixed", 6, source="lookup"), PolicyConfig("fixed", 4, source="eagle", tree="off"),
                PolicyConfig("fixed", 4, source="eagle", tree="on"), PolicyConfig("auto", 8)]
    with Engine(smollm2, DRAFTER, n_ctx=1024) as engine:
        for grammar in (JSON_GBNF, json_schema_to_gbnf(json.dumps(schema))):
            for prompt in prompts:
                msgs = [{"role": "user", "content": prompt}]
                engine.clear_cache()
                plain = run(engine, msgs, max_tokens=60, spec=False, record_margins=True, grammar=grammar)
                for policy in policies:
                    engine.clear_cache()
                    spec = run(engine, msgs, max_tokens=60, grammar=grammar, policy=policy)
                    assert_lossless(plain, spec)
                if plain.finish_reason == "stop":
                    value = json.loads(plain.text)
                    if grammar != JSON_GBNF:
                        assert set(value) == {"name", "age"} and isinstance(value["age"], int)
                else:
                    assert plain.text.lstrip().startswith(("{", "["))
        assert json.loads(plain.text)   # the schema's answers end within 60 tokens


@pytest.mark.parametrize("top_k", [40, 0])
def test_sampling_under_a_grammar_emits_exactly_the_masked_distribution(tiny, top_k):
    """The rejection rule over the masked distribution: the emitted token (draft accepted or
    replaced) has the distribution of plain sampling under the grammar, whatever the draft."""
    from collections import Counter

    import numpy as np

    from localspec.llama.grammar import Grammar
    from localspec.llama.llama_model import Model
    from localspec.runtime.sampling import Sampler, distribution
    from sampling_checks import within_binomial_bounds

    model = Model(tiny["repeat"])
    try:
        letters = [model.tokenize(c, add_special=False, parse_special=False)[0] for c in "abcde"]
        logits = np.random.default_rng(5).normal(size=model.n_vocab).astype(np.float32) * 2
        logits[letters] += np.array([6.0, 5.5, 5.0, 3.0, 1.0], dtype=np.float32)
        params = SamplingParams(temperature=0.8, top_k=top_k, top_p=0.99, min_p=0.0, seed=7)
        masked = np.full_like(logits, -np.inf)
        masked[letters] = logits[letters]
        ids, probs = distribution(masked, params)
        expected = dict(zip(ids.tolist(), probs.tolist()))
        sampler = Sampler(params, grammar=Grammar(model, "root ::= [a-e]"))
        n = 1500 if top_k else 300
        for draft in (letters[1], letters[0] + 1 if letters[0] + 1 not in letters else 0):
            counts = Counter(sampler.verify(logits, draft)[1] for _ in range(n))
            within_binomial_bounds(counts, n, expected)
        sampler.close()
    finally:
        model.close()


def test_the_constrained_argmax_takes_its_shortcuts_exactly(tiny):
    """Greedy under a grammar: the plain argmax when allowed, the best allowed one among the top
    logits, else the whole row masked; always the argmax of the fully masked row."""
    import numpy as np

    from localspec.llama.grammar import Grammar
    from localspec.llama.llama_model import Model
    from localspec.runtime.sampling import Sampler

    model = Model(tiny["repeat"])
    try:
        sampler = Sampler(SamplingParams(), grammar=Grammar(model, 'root ::= [a-e] | " the"'))
        letters = [model.tokenize(c, add_special=False, parse_special=False)[0] for c in "abcde"]
        rng = np.random.default_rng(11)
        for boost in (20.0, 3.0, 0.0, -20.0):     # allowed tokens: the argmax, near the top, anywhere, last
            for _ in range(5):
                logits = rng.normal(size=model.n_vocab).astype(np.float32)
                logits[letters] += boost + rng.normal(size=5).astype(np.float32)
                want = int(sampler.grammar.mask(logits).argmax())
                assert sampler.choose(logits) == want
                assert sampler.verify(logits, want) == (True, want)
        sampler.close()
    finally:
        model.close()


def test_a_lazy_grammar_refuses_a_token_that_completes_its_trigger_with_text_the_grammar_refuses(tiny):
    """llama.cpp would throw (abort the process) when such a token is accepted: every token with a
    space completes the trigger " ", and the text from it would start with a space the grammar
    refuses, so no token with a space may come."""
    with Engine(tiny["repeat"], n_ctx=1024) as engine:
        plain = run(engine, COPY, max_tokens=8, spec=False)
        done = run(engine, COPY, max_tokens=8, spec=False, grammar='root ::= "x"+', grammar_triggers=[" "])
        spec = run(engine, COPY, max_tokens=8, grammar='root ::= "x"+', grammar_triggers=[" "],
                   policy=POLICIES["lookup"])
        ok = run(engine, COPY, max_tokens=8, spec=False, grammar='root ::= " c" [ a-z]*', grammar_triggers=[" "])
    assert " " in plain.text and done.text and " " not in done.text
    assert spec.tokens == done.tokens
    assert ok.tokens == plain.tokens        # " c" starts text the grammar accepts: nothing changes
