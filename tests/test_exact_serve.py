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

import pytest

from localspec import Engine
from localspec.core.events import DoneEvent
from localspec.runtime.engine import GenerationConfig
from localspec.runtime.sampling import SamplingParams
from serve_checks import KEY, running_server, shared_default_target

ROOT = Path(__file__).resolve().parents[1]
N = 96
GREEDY = dict(temperature=0.0, repeat_penalty=1.0)
SERVE = ["--ctx", "2048", "--threads", "2", "--parallel", "2", "--rows-match", "--api-key", KEY,
         "--queue-size", "8"]
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
    with running_server(home, *SERVE) as srv:
        yield srv


def plain_exact(home: Path, prompt: str) -> list[int]:
    """Plain decoding (no drafts) of ``prompt`` in this process, at 2 threads, in exact mode: what
    the served speculative text must equal."""
    with Engine(shared_default_target(home), n_ctx=2048, n_threads=2, rows_match=True) as engine:
        config = GenerationConfig(max_tokens=N, sampling=SamplingParams(**GREEDY), spec=False)
        done = [e for e in engine.generate([{"role": "user", "content": prompt}], config)
                if isinstance(e, DoneEvent)][0]
        return engine.model.detokenize(done.tokens) if hasattr(engine.model, "detokenize") else done.text


def ask(server, content: str, **extra) -> tuple[str, dict]:
    """A greedy chat request's text and its speculative statistics."""
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": content}], "max_tokens": N,
            **GREEDY, **extra}
    response = server.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    return answer["choices"][0]["message"]["content"], answer


def test_greedy_drafts_equal_plain_decoding_through_serve_at_two_threads(server, home):
    prompt = summarization()
    text, answer = ask(server, prompt)
    stats = answer.get("speculative") or answer.get("usage", {})
    assert "drafted" in json.dumps(stats), answer   # the statistics block is there
    with Engine(shared_default_target(home), n_ctx=2048, n_threads=2, rows_match=True) as engine:
        assert len(engine.prompt_tokens([{"role": "user", "content": prompt}])) > 256
        config = GenerationConfig(max_tokens=N, sampling=SamplingParams(**GREEDY), spec=False)
        plain = [e for e in engine.generate([{"role": "user", "content": prompt}], config)
                 if isinstance(e, DoneEvent)][0]
    assert text == plain.text
