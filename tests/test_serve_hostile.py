"""``localspec serve`` against hostile clients and shutdown, as a process: bodies the JSON parser or
the schema cannot take, text that is not Unicode, clients that close mid-body, Ctrl-C and SIGTERM
while requests run and wait, and ``--host`` beyond loopback without a key. Every answer is OpenAI's
error shape, the log holds no traceback, and the exit code is the signal's (130, 143)."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time

import httpx
import pytest

from serve_checks import Served
from tiny_models import build_target


def error_of(response: httpx.Response) -> dict:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """A tiny target on every interface (0.0.0.0), without an API key."""
    home = tmp_path_factory.mktemp("hostile_home")
    target = build_target(home / "tiny.gguf", "repeat")
    served = Served(home, "--target", str(target), "--host", "0.0.0.0", "--ctx", "256", "--max-body", "1M")
    yield served
    assert served.stop() == 130
    assert "Traceback" not in served.text(), served.text()


CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]
DEEP = 100_000

# (path, raw body, expected param (None: none), expected code (None: any)); all are 400s
HOSTILE = [
    (CHAT, b"[" * DEEP + b"]" * DEEP, None, "invalid_json"),
    (CHAT, b'{"messages": ' + b"[" * DEEP + b"]" * DEEP + b"}", None, "invalid_json"),
    (CHAT, b'{"messages": [], "metadata": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}", None, "invalid_json"),
    (CHAT, b'{"model": ' + b"[" * 900 + b"]" * 900 + b', "messages": [{"role": "user", "content": "x"}]}',
     "model", None),
    (CHAT, b'{"model": "gpt\\ud800", "messages": [{"role": "user", "content": "x"}]}', "model", "invalid_text"),
    (CHAT, b'{"messages": [{"role": "user", "content": [{"type": "\\udfff"}]}]}', "messages.0.content.0.type",
     "invalid_text"),
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\udc80b"}]}', "messages.0.content", "invalid_text"),
    (CHAT, b'{"messages": [{"role": "user\\ud800", "content": "x"}]}', "messages.0.role", "invalid_text"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "stop": ["\\ud83d"]}', "stop.0", "invalid_text"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "\\ud800": 1}', "\\ud800", "invalid_text"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "user": "\\ud800"}', "user", "invalid_text"),
    ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 2}', "prompt", "invalid_text"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 2, "temperature": NaN}', None, "invalid_json"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": -Infinity}', None, "invalid_json"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1e400}', "max_tokens", None),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", None, "invalid_json"),
    ("/v1/completions", b'{"prompt": "\xff\xfe\x00"}', None, "invalid_json"),
    ("/v1/completions", b'{"prompt": "x", "model": "' + "\u00e9".encode("latin-1") + b'"}', None, "invalid_json"),
    ("/v1/completions", b'"just a string"', None, None),
    ("/v1/completions", b"", None, "invalid_json"),
    (CHAT, b'{"messages": [{"role": "user", "content": [{"type": "image_url\\ud800x", "text": "y"}]}]}',
     "messages.0.content.0.type", "invalid_text"),
]


@pytest.mark.parametrize("path,body,param,code", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_a_body_the_parser_or_the_schema_cannot_take_is_a_400(tiny_server, path, body, param, code):
    r = httpx.post(tiny_server.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    error = error_of(r)
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    assert "Traceback" not in tiny_server.text()


def test_an_unknown_models_name_is_quoted_back_escaped(tiny_server):
    """An error that quotes what the client sent stays encodable, whatever was sent."""
    r = httpx.post(tiny_server.url + CHAT, json={"model": "no-such-model", "messages": HI}, timeout=60)
    assert r.status_code == 404 and "no-such-model" in error_of(r)["message"]
    from localspec.server.errors import APIError, unknown_model

    error = unknown_model("gpt\ud800", ["m"])
    assert "gpt\\ud800" in error.message and error.response().status_code == 404
    assert APIError(400, "x", param="a\udfffb").body()["error"]["param"] == "a\\udfffb"


def test_clients_that_close_mid_body_leave_nothing_in_the_log(tiny_server):
    before = tiny_server.text()
    port = int(tiny_server.url.rsplit(":", 1)[1])
    for i in range(10):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 5000\r\n\r\n{\"prompt\": \"" + b"a" * (i * 100))
    time.sleep(1.0)
    after = tiny_server.text()
    assert after.startswith(before)
    # The model's background calibration may finish meanwhile and say so; nothing else may appear.
    added = [line for line in after[len(before):].splitlines() if ": calibrat" not in line]
    assert added == []
    r = httpx.post(tiny_server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_a_server_beyond_loopback_without_a_key_warns_in_one_line(tiny_server, tmp_path):
    warnings = [line for line in tiny_server.text().splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "0.0.0.0" in warnings[0] and "--api-key" in warnings[0], warnings
    from localspec.cli.serve import bind, is_loopback

    for host, loopback in (("127.0.0.1", True), ("localhost", True), ("0.0.0.0", False)):
        with bind(host, 0) as sock:
            assert is_loopback(sock) is loopback, host


# -- shutdown ----------------------------------------------------------------------------------------
# long enough to be running when the signal comes, also on a fast machine (speculation off: it would
# race through a counting sequence)
LONG = {"prompt": "1, 2, 3, 4,", "max_tokens": 4000, "temperature": 0}


def sse_lines(url: str, body: dict, out: dict) -> None:
    """Read one streamed answer to its end; ``out``: status, data lines."""
    try:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
            out["status"] = r.status_code
            out["lines"] = []
            for line in r.iter_lines():
                if line:
                    out["lines"].append(line)
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)


def whole(url: str, body: dict, out: dict) -> None:
    try:
        r = httpx.post(url + "/v1/completions", json=body, timeout=120)
        out["status"], out["json"] = r.status_code, r.json()
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)


def wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.parametrize("sig,running_streams", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["sigint-stream-running", "sigterm-whole-answer-running"])
def test_shutdown_ends_every_request_cleanly(tmp_path, sig, running_streams):
    """A signal while one request runs and one waits: the engine stops at its next cycle, the
    running stream ends with an error event and [DONE] (or the running whole answer gets 503),
    the waiting one gets 503, one log line each, exit 128 + the signal, no traceback."""
    served = Served(tmp_path, "--ctx", "4096", "--queue-size", "4", "--no-spec", "--parallel", "1")   # one runs, one waits
    try:
        running: dict = {}
        waiting: dict = {}
        first, second = (sse_lines, whole) if running_streams else (whole, sse_lines)
        threads = [threading.Thread(target=first, args=(served.url, LONG, running))]
        threads[0].start()
        if running_streams:
            wait_for(lambda: len(running.get("lines", [])) >= 3, "the first chunks")
        else:
            wait_for(lambda: served.health()["requests_processing"] == 1, "the request to run")
        threads.append(threading.Thread(target=second, args=(served.url, LONG, waiting)))
        threads[1].start()
        wait_for(lambda: served.health()["requests_deferred"] == 1, "the second request to wait")
        time.sleep(0.5)
        served.proc.send_signal(sig)
        for t in threads:
            t.join(timeout=60)
        code = served.proc.wait(timeout=60)
    finally:
        served.stop()
    log = served.text()
    assert code == 128 + sig, (code, log)
    assert "Traceback" not in log and "ERROR" not in log, log
    if running_streams:
        assert running["status"] == 200 and running["lines"][-1] == "data: [DONE]", running
        error = json.loads(running["lines"][-2][len("data: "):])["error"]
        assert error["code"] == "server_shutting_down" and error["type"] == "server_error", running
        assert any('"text"' in line for line in running["lines"][:-2])
    else:
        assert running["status"] == 503 and running["json"]["error"]["code"] == "server_shutting_down", running
    assert waiting.get("status") == 503 and "server_shutting_down" in str(waiting), waiting
    stopped = [line for line in log.splitlines() if "shutting down: stopped" in line]
    refused_lines = [line for line in log.splitlines() if "shutting down: refused" in line]
    assert len(stopped) == 1 and len(refused_lines) == 1, log
    n = int(re.search(r"after (\d+) generated tokens?", stopped[0]).group(1))
    assert n < LONG["max_tokens"] / 2, log   # the engine stopped, it did not run on through the grace
    if sig == signal.SIGINT:
        assert log.rstrip().endswith("Interrupted."), log


def test_a_response_cancelled_at_shutdown_still_ends_properly():
    """uvicorn cancels what outlives its grace period (or a second Ctrl-C): a stream that had begun
    ends with an error event and [DONE], a response not begun is a 503, nothing escapes."""
    import asyncio
    import types

    from starlette.responses import StreamingResponse

    from localspec.server.app import QuietShutdown

    async def endless():
        yield b"data: {}\n\n"
        await asyncio.Event().wait()

    async def streaming_app(scope, receive, send):
        await StreamingResponse(endless(), media_type="text/event-stream")(scope, receive, send)

    async def stalled_app(scope, receive, send):
        await asyncio.Event().wait()

    async def serve(app, closing: bool) -> list[dict]:
        sent: list[dict] = []

        async def send(message):
            sent.append(message)

        async def receive():
            await asyncio.Event().wait()

        scope = {"type": "http", "path": "/v1/completions", "headers": [], "asgi": {"spec_version": "2.4"}}
        task = asyncio.ensure_future(QuietShutdown(app, types.SimpleNamespace(closing=closing))(scope, receive, send))
        await asyncio.sleep(0.2)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            sent.append({"type": "cancelled"})
        return sent

    sent = asyncio.run(serve(streaming_app, True))
    assert sent[-1]["type"] == "http.response.body" and sent[-1]["more_body"] is False
    assert sent[-1]["body"].endswith(b"data: [DONE]\n\n") and b"server_shutting_down" in sent[-1]["body"]
    sent = asyncio.run(serve(stalled_app, True))
    assert sent[0]["status"] == 503 and b"server_shutting_down" in sent[-1]["body"]
    assert asyncio.run(serve(stalled_app, False))[-1] == {"type": "cancelled"}   # not shutting down: not ours
