"""``localspec serve`` as a client meets it: the real server in a subprocess on a loopback port,
the official ``openai`` client and raw HTTP (httpx), answers checked against the engine's own
output, and Prometheus metrics read with prometheus_client's own parser."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict

import httpx
import openai
import pytest

from localspec.formats.chat_format import Message
from localspec.runtime.sampling import CHAT_SAMPLING, SamplingParams

from serve_checks import CTX, KEY, MAX_BODY, MODEL, POLICY, engine_output, error_of, running_server
from serve_checks import reference  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("serve_home")) as srv:
        yield srv


SAMPLED = dict(temperature=0.8, top_p=0.95, seed=11, presence_penalty=0.3, frequency_penalty=0.2)
EXTENSIONS = dict(top_k=40, min_p=0.05, repeat_penalty=1.1, repeat_last_n=32)   # llama-server's fields


def test_streamed_chat_equals_the_engines_own_output(server, reference):
    question = "Name three colours of the rainbow."
    stream = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=24, stream=True,
        stream_options={"include_usage": True}, extra_body=EXTENSIONS, **SAMPLED)
    parts, usage, finish = [], None, None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    expected = engine_output(reference, [Message("user", question)], max_tokens=24, **SAMPLED, **EXTENSIONS)
    assert "".join(parts) == expected.text and expected.text
    assert usage.completion_tokens == len(expected.tokens)
    assert finish == ("length" if expected.finish_reason == "length" else "stop")
    spec = usage.model_extra["speculative"]
    assert spec["enabled"] is True and spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"]


def test_metrics_count_the_requests_drafts(server):
    before = server.metrics()
    reply = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write one sentence about the sea."}], max_tokens=20,
        temperature=0)
    after = server.metrics()

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert reply.choices[0].message.content and reply.choices[0].finish_reason in ("stop", "length")
    spec = reply.usage.model_extra["speculative"]
    assert spec["drafted"] > 0
    assert delta("vllm:spec_decode_num_draft_tokens_total") == spec["drafted"]
    assert delta("vllm:spec_decode_num_accepted_tokens_total") == spec["accepted"]
    assert delta("vllm:spec_decode_num_drafts_total") == spec["drafts"] > 0
    positions = [delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(4)]
    assert positions == spec["accepted_per_position"] + [0] * (4 - len(spec["accepted_per_position"]))
    assert sum(positions) == spec["accepted"]
    assert delta("llamacpp:tokens_predicted_total") == reply.usage.completion_tokens
    assert delta("llamacpp:prompt_tokens_total") == reply.usage.prompt_tokens
    assert delta("vllm:request_success_total", finished_reason=reply.choices[0].finish_reason) == 1
    assert after[("llamacpp:predicted_tokens_seconds", ())] > 0
    assert after[("llamacpp:requests_processing", ())] == 0 and after[("llamacpp:requests_deferred", ())] == 0


def test_completions_and_models(server, reference):
    client = server.client()
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8, temperature=0,
                                      echo=True)
    expected = engine_output(reference, "The capital of France is", max_tokens=8, temperature=0.0)
    assert reply.choices[0].text == "The capital of France is" + expected.text
    assert reply.usage.completion_tokens == len(expected.tokens)
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_errors_have_openais_shape_and_status(server):
    url = "/v1/chat/completions"
    good = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    r = server.http.post(url, content=b'{"messages": [', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and error_of(r)["code"] == "invalid_json"
    r = httpx.post(server.url + url, json=good, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    r = httpx.post(server.url + url, json=good)
    assert r.status_code == 401 and error_of(r)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="gpt-4", messages=good["messages"])
    r = server.http.post(url, json={**good, "n": 2})
    assert r.status_code == 400 and error_of(r)["param"] == "n"
    r = server.http.post("/v1/completions", json={"prompt": "word " * (CTX + 100), "max_tokens": 2})
    assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded"
    r = server.http.post(url, json={**good, "messages": [{"role": "user", "content": "x" * (MAX_BODY + 1)}]})
    assert r.status_code == 413 and error_of(r)["code"] == "request_too_large"
    r = server.http.post(url, json={**good, "temperature": -1})
    assert r.status_code == 400 and error_of(r)["param"] == "temperature"
    r = server.http.post(url, json={**good, "presence_penalty": 3})
    assert r.status_code == 400 and error_of(r)["param"] == "presence_penalty"
    r = server.http.post(url, json={**good, "repeat_penalty": 50})
    assert r.status_code == 400 and "repeat_penalty" in error_of(r)["message"]
    assert error_of(r)["param"] == "repeat_penalty"                       # the declared range names its field
    r = server.http.post(url, json={**good, "seed": 2**32})
    assert r.status_code == 400 and error_of(r)["param"] == "seed"
    assert server.http.post(url, json={**good, "min_p": 1.0}).status_code == 200   # as the CLI and Modelfiles
    r = server.http.get("/v1/nothing-here")
    assert r.status_code == 404 and error_of(r)
    assert httpx.get(server.url + "/health").json()["status"] == "ok"   # no key needed
    assert server.http.post(url, json=good).status_code == 200           # and still serving


def test_load_every_request_answered_or_refused(server):
    """8 clients x 5 requests against a queue of 2: each gets 200 or 429, none is lost."""
    before = server.metrics()
    statuses: list[int] = []
    problems: list[str] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as http:
            for j in range(5):
                try:
                    r = http.post("/v1/completions", json={"prompt": f"Client {i}, request {j}:", "max_tokens": 4,
                                                           "temperature": 0})
                except httpx.HTTPError as exc:
                    with lock:
                        problems.append(repr(exc))
                    continue
                with lock:
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        if r.json()["usage"]["completion_tokens"] < 1:
                            problems.append(r.text)
                    elif r.status_code == 429:
                        if error_of(r)["code"] != "rate_limit_exceeded":
                            problems.append(r.text)
                    else:
                        problems.append(f"{r.status_code} {r.text}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    counts = Counter(statuses)
    assert not problems and len(statuses) == 40 and set(counts) <= {200, 429}, (counts, problems)
    assert counts[200] >= 1 and counts[429] >= 1, counts
    after = server.metrics()
    finished = sum(v - before.get(k, 0.0) for k, v in after.items() if k[0] == "vllm:request_success_total")
    assert finished == counts[200]
    assert after[("localspec:requests_rejected_total", ())] - before.get(("localspec:requests_rejected_total", ()), 0) \
        == counts[429]
    r = server.http.post("/v1/completions", json={"prompt": "Still there?", "max_tokens": 2})
    assert r.status_code == 200


def test_a_client_killed_mid_stream_cancels_its_generation(server):
    before = server.metrics()
    abort = ("vllm:request_success_total", (("finished_reason", "abort"),))
    with server.http.stream("POST", "/v1/completions", json={"prompt": "1, 2, 3, 4,", "max_tokens": CTX,
                                                             "temperature": 0, "stream": True}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: {") for line in received)
    # the connection is closed: the engine must stop long before CTX tokens
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = server.metrics()
        if after.get(abort, 0.0) - before.get(abort, 0.0) == 1 and after[("llamacpp:requests_processing", ())] == 0:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the generation was not cancelled: {after}")
    generated = after[("llamacpp:tokens_predicted_total", ())] - before.get(("llamacpp:tokens_predicted_total", ()), 0)
    assert generated < CTX / 2
    r = server.http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["text"]


def test_a_client_gone_before_its_whole_answer_cancels_it(server):
    """Not streaming: a client that gives up (timeout) while its answer is generated cancels it too."""
    before = server.metrics()
    abort = ("vllm:request_success_total", (("finished_reason", "abort"),))
    with pytest.raises(httpx.ReadTimeout):
        server.http.post("/v1/completions", json={"prompt": "1, 2, 3, 4,", "max_tokens": CTX, "temperature": 0},
                         timeout=1.0)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        after = server.metrics()
        if after.get(abort, 0.0) - before.get(abort, 0.0) == 1 and after[("llamacpp:requests_processing", ())] == 0:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the generation was not cancelled: {after}")
    assert server.http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}).status_code == 200


def test_bad_command_lines_are_one_error_line(tmp_path):
    import socket

    def serve(*args):
        return subprocess.run([sys.executable, "-m", "localspec", "serve", *args], capture_output=True, text=True,
                              timeout=120)

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        cases = [(["--port", str(port)], "cannot listen on 127.0.0.1"),
                 (["--max-body", "lots"], "bad size"),
                 (["--queue-size", "0"], "--queue-size"),
                 (["--stream-interval-ms", "-1"], "--stream-interval-ms"),
                 (["--stream-interval-ms", "1001"], "--stream-interval-ms"),
                 (["no-such-model"], "unknown model"),
                 (["--port", "0", "--policy", "fixed", "--draft-max", "99"], "draft-max")]
        for args, message in cases:
            proc = serve(*args)
            assert proc.returncode == 1 and proc.stderr.startswith("Error: ") and proc.stderr.count("\n") == 1, \
                (args, proc.stderr)
            assert message in proc.stderr and "Traceback" not in proc.stderr


def test_fields_left_out_take_the_chat_defaults(server, reference):
    """A request with only a seed samples with CHAT_SAMPLING (temperature 0.8, repeat penalty 1.1...)."""
    question = "What is the capital of Italy?"
    reply = server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                                    max_tokens=16, seed=5)
    expected = engine_output(reference, [Message("user", question)], max_tokens=16, seed=5)
    assert reply.choices[0].message.content == expected.text


def test_modelfile_parameters_are_a_models_defaults(smollm2):
    from localspec.store.models import ModelSpec
    from localspec.server.params import ServeDefaults, generation_config
    from localspec.server.schemas import CompletionRequest

    spec = ModelSpec("m", smollm2, parameters={"temperature": 0.2, "repeat_penalty": 1.3, "stop": ["END"],
                                               "num_predict": 50})
    defaults = ServeDefaults.for_model(spec, n_ctx=CTX, max_tokens=None, spec_enabled=True, policy=POLICY)
    config = generation_config(CompletionRequest(prompt="x", top_k=7), defaults, None)
    assert config.sampling == SamplingParams(**{**asdict(CHAT_SAMPLING), "temperature": 0.2, "repeat_penalty": 1.3,
                                                "top_k": 7})
    assert config.stop == ("END",) and config.max_tokens == 50
    config = generation_config(CompletionRequest(prompt="x", max_tokens=3, stop="."), defaults, 3)
    assert config.stop == (".",) and config.max_tokens == 3
