"""Repetition penalties: the logits against llama.cpp's own penalties sampler, plain penalised
decoding against llama.cpp end to end, and speculation under penalties against plain decoding
(greedy equality on the real SmolLM2 target, the distribution on tiny models)."""

from __future__ import annotations

import ctypes
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from localspec import Engine, LocalspecError, Message, PolicyConfig, SamplingParams
from localspec.runtime.penalties import PenaltyWindow
from localspec.runtime.sampling import Sampler, distribution
from engine_checks import PROMPTS, assert_lossless, run
from sampling_checks import assert_same_marginals, plain_and_speculative_samples, within_binomial_bounds
from tiny_models import build_drafter, build_target

ROOT = Path(__file__).resolve().parents[1]
DRAFTER = ROOT / "localspec" / "data" / "smollm2-135m-eagle3.1.gguf"
PENALTIES = dict(repeat_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2)


class LlamaCppPenalties:
    """llama.cpp's own ``penalties`` sampler (llama_sampler_init_penalties), fed tokens with
    llama_sampler_accept and applied to a full row of logits as llama-server applies it."""

    def __init__(self, n_vocab: int, last_n: int, repeat: float, frequency: float, presence: float) -> None:
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.n_vocab = n_vocab
        self.ptr = llama_cpp.llama_sampler_init_penalties(n_vocab, last_n, repeat, frequency, presence)

    def accept(self, tokens) -> None:
        for t in tokens:
            self.llama_cpp.llama_sampler_accept(self.ptr, int(t))

    def apply(self, logits: np.ndarray) -> np.ndarray:
        lc = self.llama_cpp
        data = (lc.llama_token_data * self.n_vocab)()
        for i, v in enumerate(logits.tolist()):
            data[i].id, data[i].logit, data[i].p = i, v, 0.0
        arr = lc.llama_token_data_array(data=data, size=self.n_vocab, selected=-1, sorted=False)
        lc.llama_sampler_apply(self.ptr, ctypes.byref(arr))
        out = np.empty(self.n_vocab, dtype=np.float32)
        for d in data:
            out[d.id] = d.logit
        return out

    def close(self) -> None:
        self.llama_cpp.llama_sampler_free(self.ptr)


def reference_logits(logits, context, last_n, repeat, frequency, presence) -> np.ndarray:
    # llama.cpp takes no -1: Ollama hands it the context size, which covers everything here
    ref = LlamaCppPenalties(len(logits), len(context) if last_n == -1 else last_n, repeat, frequency, presence)
    try:
        ref.accept(context)
        return ref.apply(logits)
    finally:
        ref.close()


@pytest.mark.parametrize("last_n", [1, 3, 16, 64, -1])
@pytest.mark.parametrize("repeat,frequency,presence", [(1.3, 0.0, 0.0), (0.8, 0.0, 0.0), (1.0, 0.25, 0.0),
                                                       (1.0, 0.0, 0.6), (1.15, -0.3, 0.5), (1.1, 0.2, -0.4)])
def test_penalised_logits_match_llama_cpp(last_n, repeat, frequency, presence):
    """Positive and negative logits, repeated tokens, windows shorter and longer than the context;
    and a context split into committed tokens + ``after`` (drafts) gives the same row."""
    rng = np.random.default_rng(last_n + 7)
    logits = (rng.normal(size=300) * 3).astype(np.float32)
    context = rng.integers(0, 40, size=120).tolist()
    expected = reference_logits(logits, context, last_n, repeat, frequency, presence)
    assert (expected != logits).any()
    for split in (120, 119, 117, 100, 60, 0):
        window = PenaltyWindow(last_n=last_n, repeat=repeat, frequency=frequency, presence=presence,
                               context=context[:split])
        got = window.apply(logits, context[split:])
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
        window.push(context[split:])   # committing the drafts leaves the same window
        np.testing.assert_allclose(window.apply(logits), expected, rtol=1e-6, atol=1e-6)


def test_penalties_off_leave_logits_alone_and_bad_values_are_refused():
    logits = np.array([0.5, 3.0, -1.0, 2.9], dtype=np.float32)
    for params in (SamplingParams(), SamplingParams(repeat_penalty=1.5, repeat_last_n=0)):
        assert not params.penalized
        sampler = Sampler(params, [1, 1, 1])
        assert sampler.penalties is None and sampler.penalised(logits) is logits
        assert sampler.choose(logits, [1]) == 1
    sampler = Sampler(SamplingParams(repeat_penalty=1.5), [1])
    assert sampler.choose(logits) == 3              # greedy is the argmax of the penalised logits: 2.0 < 2.9
    sampler.commit([3])
    assert sampler.choose(logits) == 1              # both penalised: 2.0 > 2.9 / 1.5
    sampler = Sampler(SamplingParams(frequency_penalty=0.1), [3])
    assert sampler.choose(logits) == 1              # 3.0 > 2.9 - 0.1
    assert sampler.choose(logits, [1, 1, 1]) == 3   # ``after`` counts too: 3.0 - 0.3 < 2.8
    for bad in (dict(repeat_penalty=0.0), dict(repeat_penalty=float("nan")), dict(repeat_penalty=11.0),
                dict(repeat_last_n=-2), dict(repeat_last_n=1.5), dict(presence_penalty=2.5),
                dict(frequency_penalty=float("inf")), dict(frequency_penalty=-3.0)):
        with pytest.raises(LocalspecError):
            SamplingParams(**bad)


@pytest.mark.parametrize("draft", [5, 2, 0])  # penalised below other tokens, unpenalised, outside the window
def test_verify_after_drafts_emits_the_penalised_distribution_of_that_context(draft):
    """The rejection rule at a position after earlier drafts samples exactly the distribution
    of the penalised logits for the whole context (committed tokens + those drafts)."""
    rng = np.random.default_rng(4)
    logits = (rng.normal(size=10) * 1.2).astype(np.float32)
    logits[5] = 2.5
    params = SamplingParams(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=11, repeat_last_n=4, **PENALTIES)
    committed, after = [0, 7, 5, 5], [5, 2]       # the window of 4: 5 5 5 2 (token 0 has left it)
    ids, probs = distribution(reference_logits(logits, committed + after, 4, 1.3, 0.2, 0.4), params)
    expected = dict(zip(ids.tolist(), probs.tolist()))
    sampler = Sampler(params, committed)
    n = 40000
    counts = Counter(sampler.verify(logits, draft, after)[1] for _ in range(n))
    within_binomial_bounds(counts, n, expected)
    unpenalised = dict(zip(*(a.tolist() for a in distribution(logits, params))))
    assert abs(expected[5] - unpenalised[5]) > 0.1   # the penalties do change this distribution


def test_plain_penalised_greedy_matches_llama_cpp(smollm2):
    """Plain decoding with penalties against llama.cpp decoding the same tokens through
    llama-cpp-python, with llama.cpp's penalties sampler fed the prompt and each chosen token (as
    llama-server does) and argmax; and penalties do change this reply."""
    import llama_cpp

    msgs = [Message("user", "Name three colours of the rainbow.")]
    params = SamplingParams(repeat_penalty=1.2, frequency_penalty=0.1, presence_penalty=0.1, repeat_last_n=32)
    with Engine(smollm2, n_ctx=1024) as engine:
        tokens = engine.prompt_tokens(msgs)
        ours = run(engine, msgs, max_tokens=32, spec=False, sampling=params).tokens
        greedy = run(engine, msgs, max_tokens=32, spec=False).tokens
    assert ours != greedy
    llm = llama_cpp.Llama(str(smollm2), n_ctx=1024, n_threads=1, flash_attn=True, verbose=False)
    ref = LlamaCppPenalties(llm.n_vocab(), 32, 1.2, 0.1, 0.1)
    try:
        ref.accept(tokens)
        llm.eval(tokens)
        out: list[int] = []
        while len(out) < len(ours):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
            tok = int(np.argmax(ref.apply(row.astype(np.float32))))
            if tok == llm.token_eos():
                break
            out.append(tok)
            ref.accept([tok])
            llm.eval([tok])
    finally:
        ref.close()
    assert ours == out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_penalties")
    noisy = build_target(d / "noisy.gguf", "noisy", noise=0.006)
    return {"noisy": noisy, "d_repeat": build_drafter(d / "d_repeat.gguf", noisy, "repeat")}


@pytest.mark.parametrize("policy", [PolicyConfig("fixed", 4), PolicyConfig("fixed", 3, tree="on"),
                                    PolicyConfig("fixed", 4, source="lookup")])
def test_greedy_speculation_with_penalties_is_lossless_on_tiny_models(tiny, policy):
    """The repeat drafter proposes repetitions the penalties push down: drafts are accepted and
    rejected, and the output is plain penalised decoding's."""
    params = SamplingParams(repeat_penalty=1.05, presence_penalty=0.2, frequency_penalty=0.05, repeat_last_n=4)
    drafted = accepted = 0
    with Engine(tiny["noisy"], tiny["d_repeat"], n_ctx=1024) as engine:
        for prompt in PROMPTS[:5]:
            plain = run(engine, prompt, max_tokens=40, spec=False, record_margins=True, sampling=params)
            spec = run(engine, prompt, max_tokens=40, policy=policy, sampling=params)
            unpenalised = run(engine, prompt, max_tokens=40, spec=False)
            assert plain.tokens != unpenalised.tokens
            assert_lossless(plain, spec)
            drafted += spec.stats.drafted
            accepted += spec.stats.accepted
    assert 0 < accepted < drafted


def test_greedy_speculation_with_penalties_is_lossless_on_smollm2(smollm2):
    """The real target with the shipped drafter (chains and trees) and n-gram lookup: the same
    tokens as plain decoding with the same penalties, drafts accepted and rejected. The copy
    prompt gives lookup drafts that the 16-token window does not penalise."""
    prompts = [[Message("user", "Name three colours of the rainbow.")],
               [Message("user", "Copy this sentence exactly: The quick brown fox jumps over the lazy dog "
                                "near the old river bank at dawn.")]]
    params = SamplingParams(repeat_penalty=1.3, presence_penalty=0.3, frequency_penalty=0.2, repeat_last_n=16)
    policies = (PolicyConfig("fixed", 4, tree="off", source="eagle"), PolicyConfig("fixed", 3, tree="on"),
                PolicyConfig("fixed", 4, source="lookup"))
    drafted, accepted = Counter(), Counter()
    with Engine(smollm2, DRAFTER, n_ctx=2048) as engine:
        for msgs in prompts:
            engine.clear_cache()
            plain = run(engine, msgs, max_tokens=40, spec=False, record_margins=True, sampling=params)
            for i, policy in enumerate(policies):
                engine.clear_cache()
                spec = run(engine, msgs, max_tokens=40, policy=policy, sampling=params)
                assert_lossless(plain, spec)
                drafted[i] += spec.stats.drafted
                accepted[i] += spec.stats.accepted
    for i, policy in enumerate(policies):
        assert 0 < accepted[i] < drafted[i], policy


@pytest.mark.parametrize("tree", ["off", "on"])
def test_penalised_speculative_sampling_matches_plain_penalised_sampling(tiny, tree):
    """As test_sampling's end-to-end test, with penalties over a short window: the marginal
    distributions of generated tokens 3..6 agree between plain and speculative decoding."""
    params = dict(temperature=0.4, top_k=8, top_p=1.0, min_p=0.0, repeat_penalty=1.02, presence_penalty=0.02,
                  frequency_penalty=0.01, repeat_last_n=4)
    n = 300
    with Engine(tiny["noisy"], tiny["d_repeat"], n_ctx=256) as engine:
        samples, drafted, accepted = plain_and_speculative_samples(engine, params, n, tree)
    # both branches of the rule are exercised (the penalties push down the repetitions it drafts)
    assert 0.05 * drafted < accepted < 0.9 * drafted
    assert_same_marginals(samples, n)
