"""``serve --stream-interval-ms``: a stream's later text waits for the next steps' tokens, so each
chunk carries several (each chunk costs the event loop ~0.25 ms of Python on the cores llama.cpp
needs); the first text and the end go at once, and nothing is lost: the streamed text is the whole
answer's, on OpenAI's API and Ollama's."""

from __future__ import annotations

import json

from serve_checks import KEY, running_server

MESSAGES = [{"role": "user", "content": "Count from one to twenty in words."}]


def test_a_long_stream_interval_sends_a_few_chunks_of_the_whole_answer(tmp_path):
    with running_server(tmp_path, "--no-spec", "--ctx", "512", "--api-key", KEY, "--stream-interval-ms", "1000") as server:
        client = server.client()
        whole = client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=48, temperature=0)
        tokens = whole.usage.completion_tokens
        chunks = [c.choices[0].delta.content for c in client.chat.completions.create(
            model="smollm2-135m", messages=MESSAGES, max_tokens=48, temperature=0, stream=True)
            if c.choices and c.choices[0].delta.content]
        lines = []
        with server.http.stream("POST", "/api/chat", timeout=600, json={
                "model": "smollm2-135m", "messages": MESSAGES, "options": {"num_predict": 48, "temperature": 0}}) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(json.loads(line))
    assert tokens >= 24, whole
    assert "".join(chunks) == whole.choices[0].message.content
    # the first token alone, then a chunk a second at most (a 48-token answer takes ~1-3 s here)
    assert 2 <= len(chunks) <= tokens // 4, (len(chunks), tokens)
    texts = [line["message"]["content"] for line in lines]   # the last line carries the text that came with the end
    assert "".join(texts) == whole.choices[0].message.content and 2 <= len(texts) <= tokens // 4, (len(texts), tokens)
    assert lines[-1]["done"] and lines[-1]["eval_count"] == tokens
