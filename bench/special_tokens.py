"""A text full of special tokens: what it costs to tokenize, and what it costs the other clients of
a server (issue 44, class 1). The numbers behind docs/hardening.md.

    python bench/special_tokens.py tokenize   # llama.cpp's own cut vs localspec's, 10k/20k/50k specials
    python bench/special_tokens.py serve      # a 4 MB body of special tokens beside a 4-token answer

``tokenize``: SmolLM2-135M's vocabulary; the same text tokenized by llama.cpp alone
(``Model._llama_tokenize``: quadratic in the special tokens) and by ``Model.tokenize`` (the cut made
in linear time, :mod:`localspec.llama.special_split`); both token lists must be equal. Two texts:
one unit repeated (its pieces tokenized once each), and units that all differ (every piece
tokenized: llama.cpp's tokenizer costs about 0.1 ms a call here, whatever the piece).

``serve``: ``localspec serve`` on the embedded model (``--max-body 5M``); one client sends a chat
whose message is 4 MB of ``<|im_start|>``, another, 0.2 s later, a greedy 4-token chat; the 4-token
chat's time is compared with its time alone (the median of 5 runs). Times are wall seconds on
whatever machine runs it: read the machine's load beside them.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def tokenize() -> None:
    from localspec.core.paths import embedded_target
    from localspec.llama.llama_model import Model

    model = Model(embedded_target(), no_alloc=True)
    texts = {"repeated": lambda n: "<|im_start|>user\nhi<|im_end|>\n" * (n // 2),   # 2 special tokens a unit
             "distinct": lambda n: "".join(f"<|im_start|>user {i}<|im_end|>\n" for i in range(n // 2))}
    for (kind, make), n in ((k, n) for k in texts.items() for n in (10_000, 20_000, 50_000)):
        text = make(n)
        data = text.encode()
        t0 = time.perf_counter()
        ours = model.tokenize(text, add_special=True, parse_special=True)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        theirs = model._llama_tokenize(data, True, True)
        t_theirs = time.perf_counter() - t0
        assert ours == theirs, "the two tokenizations differ"
        print(json.dumps({"text": kind, "specials": n, "bytes": len(data), "tokens": len(ours),
                          "llama_cpp_s": round(t_theirs, 3), "localspec_s": round(t_ours, 3)}), flush=True)


def _post(url: str, body: dict, out: list) -> None:
    import httpx

    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    out.append((r.status_code, time.perf_counter() - t0, r.json()))


def serve() -> None:
    import httpx

    small = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "temperature": 0}
    big = {"messages": [{"role": "user", "content": "<|im_start|>" * (4_000_000 // 12)}], "max_tokens": 4}
    home = tempfile.mkdtemp(prefix="bench_special_")
    env = dict(os.environ, LOCALSPEC_HOME=home, HF_HUB_OFFLINE="1")
    log = open(os.path.join(home, "server.log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", "0", "--max-body", "5M",
                             "--parallel", "2"], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        url = None
        deadline = time.monotonic() + 300
        while url is None and time.monotonic() < deadline:
            m = re.search(r"Listening on (http://127\.0\.0\.1:\d+)", open(log.name).read())
            url = m.group(1) if m else None
            time.sleep(0.2)
        while httpx.get(url + "/health", timeout=5).status_code != 200:
            time.sleep(0.2)
        solo = []
        for _ in range(5):
            out: list = []
            _post(url, small, out)
            solo.append(out[0][1])
        solo_s = statistics.median(solo)
        big_out: list = []
        small_out: list = []
        t_big = threading.Thread(target=_post, args=(url, big, big_out))
        t_big.start()
        time.sleep(0.2)
        _post(url, small, small_out)
        t_big.join()
        print(json.dumps({"solo_4_tokens_s": round(solo_s, 3),
                          "beside_4mb_4_tokens_s": round(small_out[0][1], 3), "small_status": small_out[0][0],
                          "big_status": big_out[0][0], "big_s": round(big_out[0][1], 3),
                          "big_error": big_out[0][2].get("error", {}).get("message", "")[:120]}), flush=True)
    finally:
        proc.send_signal(2)
        proc.wait(timeout=60)


if __name__ == "__main__":
    {"tokenize": tokenize, "serve": serve}[sys.argv[1] if len(sys.argv) > 1 else "tokenize"]()
