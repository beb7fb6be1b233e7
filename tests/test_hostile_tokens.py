"""Hardening, fourth round (issue 44), class 1: one request never stalls the other clients.

- A text cut at its special tokens in linear time gives exactly llama.cpp's tokens (SmolLM2's
  vocabulary; a vocabulary whose user-defined and control tokens overlap, of different and equal
  lengths; both ``parse_special`` and ``add_special`` settings), and 40k specials cost about four
  times what 10k cost (llama.cpp's own cut: sixteen).
- A body's bounds come before any model work: a list of more than 10,000 items is a 400 naming it
  on ``/v1/responses``, ``/v1/chat/completions`` and ``/api/chat`` (Ollama's shape), a prompt with
  as many special tokens as the context holds is a 400 before it is tokenized.
- Two real clients on a real server: a 4 MB body of special tokens (and a long plain text, which
  is tokenized whole) is refused within 2 s while the other client's 4-token answer arrives within
  2 s of its time alone: tokenizing is never on the engine thread.
"""

from __future__ import annotations

import random
import statistics
import threading
import time

import gguf
import httpx
import pytest

from serve_checks import Served, error_of
from tiny_models import build_target, rewrite_gguf

from localspec.core.paths import embedded_target
from localspec.llama.gguf_native import GGUFHeader
from localspec.llama.llama_model import Model

USER_DEFINED, CONTROL = 4, 3   # llama.cpp's token types in a GGUF (tokenizer.ggml.token_type)


@pytest.fixture(scope="module")
def smollm2_vocab():
    model = Model(embedded_target(), no_alloc=True)
    yield model
    model.close()


def both_ways(model: Model, text: str) -> None:
    data = text.encode()
    for add in (True, False):
        for parse in (True, False):
            assert model.tokenize(text, add_special=add, parse_special=parse) == \
                model._llama_tokenize(data, add, parse), (text[:200], add, parse)


def test_the_cut_gives_llama_cpp_s_tokens_on_smollm2(smollm2_vocab):
    pieces = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "<|im_start",
              "|>", "<", "user", "\n", " ", "  ", "hello world", "é", "日本", "\t", "<|im_end|>|>"]
    rng = random.Random(44)
    texts = ["", "plain text only", "<|im_start|>", "<|im_start|><|im_start|>", " <|im_end|> ",
             "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"]
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(100)]
    # past special_split.FEW special tokens: the cut is localspec's, not llama.cpp's
    texts += ["".join(rng.choice(pieces) for _ in range(rng.randint(200, 600))) for _ in range(40)]
    for text in texts:
        both_ways(smollm2_vocab, text)


@pytest.fixture(scope="module")
def overlapping_vocab(tmp_path_factory):
    """A tiny target whose vocabulary marks plain tokens as special: user-defined "abc" and "cd"
    (different lengths, overlapping: the longer wins), user-defined "xy" and "yx" (one length,
    overlapping: a text holding both is left to llama.cpp's own order), control "qq"."""
    d = tmp_path_factory.mktemp("overlap")
    src = build_target(d / "src.gguf")
    header = GGUFHeader(src)
    tokens = [t if isinstance(t, str) else bytes(t).decode() for t in header.kv["tokenizer.ggml.tokens"]]
    types = [int(t) for t in header.kv["tokenizer.ggml.token_type"]]
    for text, kind in (("abc", USER_DEFINED), ("cd", USER_DEFINED), ("xy", USER_DEFINED), ("yx", USER_DEFINED),
                       ("qq", CONTROL)):
        types[tokens.index(text)] = kind
    dst = rewrite_gguf(src, d / "overlap.gguf", {
        "tokenizer.ggml.token_type": (types, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.INT32)})
    model = Model(dst, no_alloc=True)
    yield model
    model.close()


def test_the_cut_follows_llama_cpp_where_special_tokens_overlap(overlapping_vocab):
    model = overlapping_vocab
    rng = random.Random(7)
    alphabet = ["a", "b", "c", "d", "q", "x", "y", " ", "\n", "<|im_start|>", "abc", "cd", "qq", "xy"]
    for text in ["abcd", "abcabc", "xabcdx", "cdabc", "a bcd", "qqabc", "bcd", "abcbcd", "abcd" * 100,
                 "xyx", "yxy" * 100, "qqq" * 100]:
        both_ways(model, text)
    for n in [30] * 200 + [400] * 60:   # the long ones hold more than special_split.FEW special tokens
        both_ways(model, "".join(rng.choice(alphabet) for _ in range(rng.randint(1, n))))
    splitter = model._split.splitter()
    assert [s.text for s in splitter.present(b"abcd", True)] == [b"abc", b"cd"]
    assert [s.text for s in splitter.present(b"qq cd", False)] == [b"cd"]   # control: text unless parsed
    assert splitter.ambiguous(splitter.present(b"xyx", True))
    assert not splitter.ambiguous(splitter.present(b"abcd xy", True))


def test_special_tokens_cost_linear_time(smollm2_vocab):
    unit = "<|im_start|>user\nhi<|im_end|>\n"

    def seconds(n: int) -> float:
        text = unit * (n // 2)
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            smollm2_vocab.tokenize(text)
            runs.append(time.perf_counter() - t0)
        return min(runs)

    small, large = seconds(10_000), seconds(40_000)
    assert large < 8 * small + 0.3, (small, large)   # linear: about 4x; llama.cpp's own cut: about 16x
    assert large < 3.0, large


def test_as_many_special_tokens_as_the_context_holds_are_refused_before_tokenizing(smollm2_vocab):
    from localspec.llama.special_split import TooManyTokens

    text = "<|im_end|>" * 1_000_000
    t0 = time.perf_counter()
    with pytest.raises(TooManyTokens) as info:
        smollm2_vocab.tokenize(text, limit=256)
    assert info.value.count == 256 and info.value.special and time.perf_counter() - t0 < 1.0


# -- the server: two real clients ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("tokens_home")
    target = build_target(home / "tiny.gguf", "repeat")
    served = Served(home, "--target", str(target), "--ctx", "256", "--parallel", "2", "--max-body", "5M",
                    "--no-spec")
    yield served
    assert served.stop() == 130
    assert "Traceback" not in served.text(), served.text()


SMALL = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0}


def _timed(url: str, path: str, body: dict, out: list) -> None:
    t0 = time.perf_counter()
    r = httpx.post(url + path, json=body, timeout=120)
    out.append((r, time.perf_counter() - t0))


def _beside(server, path: str, big: dict) -> tuple:
    """The big request, and 0.2 s later the small one: (big response, its seconds, small response,
    its seconds, the small one's median time alone)."""
    alone = []
    for _ in range(3):
        out: list = []
        _timed(server.url, "/v1/chat/completions", SMALL, out)
        assert out[0][0].status_code == 200
        alone.append(out[0][1])
    big_out: list = []
    small_out: list = []
    sender = threading.Thread(target=_timed, args=(server.url, path, big, big_out))
    sender.start()
    time.sleep(0.2)
    _timed(server.url, "/v1/chat/completions", SMALL, small_out)
    sender.join()
    return (*big_out[0], *small_out[0], statistics.median(alone))


def test_a_4mb_body_of_special_tokens_is_refused_at_once_and_stalls_nobody(server):
    big = {"messages": [{"role": "user", "content": "<|im_start|>" * (4_000_000 // 12)}], "max_tokens": 4}
    big_r, big_s, small_r, small_s, alone = _beside(server, "/v1/chat/completions", big)
    assert big_r.status_code == 400 and error_of(big_r)["code"] == "context_length_exceeded", big_r.text
    assert "special tokens" in error_of(big_r)["message"]
    assert big_s < 2.0, big_s
    assert small_r.status_code == 200 and small_s < alone + 2.0, (small_s, alone)


def test_a_long_plain_text_is_tokenized_off_the_engine_thread(server):
    big = {"messages": [{"role": "user", "content": "hello world, " * 150_000}], "max_tokens": 4}
    big_r, big_s, small_r, small_s, alone = _beside(server, "/v1/chat/completions", big)
    assert big_r.status_code == 400 and error_of(big_r)["code"] == "context_length_exceeded", big_r.text
    assert small_r.status_code == 200 and small_s < alone + 2.0, (small_s, alone, big_s)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/responses", {"input": [{"role": "user", "content": "x"}] * 50_000}, "input"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}] * 10_001}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 20_000}]},
     "messages.0.content"),
    ("/v1/completions", {"prompt": "x", "stop": ["x"] * 20_000}, "stop"),   # each stop is looked for after every token
])
def test_a_list_of_more_than_ten_thousand_items_is_a_400_naming_it(server, path, body, param):
    t0 = time.perf_counter()
    r = httpx.post(server.url + path, json=body, timeout=60)
    assert r.status_code == 400 and time.perf_counter() - t0 < 2.0, r.text
    error = error_of(r)
    assert error["code"] == "too_many_items" and error["param"] == param, error


def test_ollama_s_routes_count_items_too(server):
    r = httpx.post(server.url + "/api/chat", json={"messages": [{"role": "user", "content": "x"}] * 20_000,
                                                   "stream": False}, timeout=60)
    assert r.status_code == 400 and set(r.json()) == {"error"} and "10000" in r.json()["error"], r.text


def test_a_long_prediction_is_tokenized_off_the_engine_thread_and_bounded(server):
    big = {**SMALL, "prediction": {"type": "content", "content": "hello world, " * 150_000}}
    big_r, big_s, small_r, small_s, alone = _beside(server, "/v1/chat/completions", big)
    assert big_r.status_code == 400 and error_of(big_r)["param"] == "prediction", big_r.text
    assert "more than the context" in error_of(big_r)["message"]
    assert small_r.status_code == 200 and small_s < alone + 2.0, (small_s, alone, big_s)
    fits = {**SMALL, "prediction": {"type": "content", "content": "Hello! How can I help?"}}
    assert httpx.post(server.url + "/v1/chat/completions", json=fits, timeout=60).status_code == 200
