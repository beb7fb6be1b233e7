"""Exact mode (``rows_match``) through ``localspec serve``, on the real model at 2 threads.

At 2 threads a ~390-token context puts one-row steps on llama.cpp's split-KV attention and a
prompt read in one batch on its tiled attention, while the rows of a verify batch take a third
path; each rounds otherwise, so greedy speculative text leaves plain decoding at near-ties
(docs/speculation.md#exactness), and what a request answers depends on the batch shapes that ran
before and beside it (issue 44, class 6). With ``rows_match`` on a server every row of a request
takes one path: its greedy text with drafts equals plain decoding, and the same request answers the
same text after cancelled streams and while another client's request shares its batches. The
tests' usual one thread would hide all of this: the server here runs 2, as users run it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import ollama
import pytest

from localspec import Engine
from localspec.core.events import DoneEvent
from localspec.runtime.engine import GenerationConfig
from localspec.runtime.sampling import SamplingParams
from serve_checks import KEY, running_server, shared_default_target

ROOT = Path(__file__).resolve().parents[1]
N = 64
TIMEOUT = 900   # seconds a request may take: 2 llama.cpp threads spin badly on a loaded machine
GREEDY = dict(temperature=0.0, repeat_penalty=1.0)
# a drafter chain of 4 every cycle (fixed): every cycle a 5-row verify against plain decoding's steps
SERVE = ["--ctx", "2048", "--threads", "2", "--parallel", "2", "--rows-match", "--policy", "fixed", "--draft-max", "4",
         "--api-key", KEY, "--queue-size", "8"]
COLOURS = {"type": "object", "properties": {"colours": {"type": "array", "items": {"type": "string"}}},
           "required": ["colours"]}


def summarization() -> str:
    """The first summarization prompt of the bench (~390 tokens with the chat template)."""
    return json.loads((ROOT / "bench" / "summarize.jsonl").read_text().splitlines()[0])["prompt"]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("exact_serve")


@pytest.fixture(scope="module")
def server(home):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_CALIBRATION", "off")   # no background calibration taking a core meanwhile
        with running_server(home, *SERVE) as srv:
            yield srv


def body(content: str, **extra) -> dict:
    return {"model": "smollm2-135m", "messages": [{"role": "user", "content": content}], "max_tokens": N,
            **GREEDY, **extra}


def ask(server, content: str, **extra) -> dict:
    """A greedy chat request's answer."""
    response = server.http.post("/v1/chat/completions", json=body(content, **extra), timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def text_of(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


def test_greedy_drafts_equal_plain_decoding_through_serve_at_two_threads(server, home):
    prompt = summarization()
    answer = ask(server, prompt)
    assert answer["usage"]["speculative"]["drafted"] >= N // 2, answer["usage"]   # it drafted, and
    with Engine(shared_default_target(home), n_ctx=2048, n_threads=2, rows_match=True) as engine:
        messages = [{"role": "user", "content": prompt}]
        assert len(engine.prompt_tokens(messages)) > 256   # past the split-KV path's 512-cell view
        config = GenerationConfig(max_tokens=N, sampling=SamplingParams(**GREEDY), spec=False)
        plain = [e for e in engine.generate(messages, config) if isinstance(e, DoneEvent)][0]
    assert text_of(answer) == plain.text   # answered plain decoding's text
    # Ollama's API, with exact mode asked for in its options: the same text
    client = ollama.Client(host=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT)
    reply = client.chat(model="smollm2-135m", messages=messages,
                        options={"rows_match": True, "temperature": 0, "repeat_penalty": 1.0, "num_predict": N})
    assert reply.message.content == plain.text


def colours(server, **extra) -> str:
    return text_of(ask(server, "Name three colours of the rainbow. Answer in JSON.",
                       response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": COLOURS}},
                       **extra))


def cancelled_stream(server, i: int) -> None:
    """A structured stream the client closes after its first chunks (the server cancels it)."""
    request = body(f"List {i + 2} fruits in JSON.", stream=True,
                   response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": COLOURS}})
    with server.http.stream("POST", "/v1/chat/completions", json=request, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        for n, _ in enumerate(response.iter_lines()):
            if n >= 3:
                break


def test_the_same_greedy_request_answers_the_same_text_whatever_ran_before_or_beside_it(server):
    first = colours(server)
    assert '"colours"' in first
    for i in range(6):
        cancelled_stream(server, i)
    assert colours(server) == first
    started, finished = threading.Event(), threading.Event()

    def busy() -> None:   # another client, not in exact mode, whose rows share the probe's batches
        request = body(summarization(), stream=True, max_tokens=150, rows_match=False)
        with server.http.stream("POST", "/v1/chat/completions", json=request, timeout=TIMEOUT) as response:
            for _ in response.iter_lines():
                started.set()
        finished.set()

    other = threading.Thread(target=busy)
    other.start()
    try:
        assert started.wait(TIMEOUT)
        beside = colours(server)
        assert not finished.is_set(), "the other client's request ended before the probe ran beside it"
    finally:
        other.join(TIMEOUT)
    assert beside == first
    assert colours(server, rows_match=True) == first
