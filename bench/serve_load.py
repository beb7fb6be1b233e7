"""Serving under load: ``localspec serve --parallel N`` against ``llama-server -np N``, with and
without its ``--spec-type ngram-mod``, at C = 1, 2, 4, 8 concurrent streaming clients.

    python bench/serve_load.py --parallel 4 --threads 2 -n 128 [--concurrency 1,2,4,8] \\
        [--prompts bench/chat.jsonl bench/coding.jsonl] [--servers localspec,localspec-plain,llama-server,llama-server-ngram-mod] \\
        [--requests R] [--model NAME | --target T.gguf] [--ctx 2048] [--json results.json]

Every server gets the same target GGUF (the model's, default: the embedded Q4_0 SmolLM2; localspec
also its drafter, unless ``--target`` names a file alone), the same
threads, the same slots and context per slot, and the same requests: the prompts as chat messages,
streamed with the ``openai`` client, greedy (temperature 0), penalties off (``repeat_penalty`` 1),
``max_tokens`` = ``-n``. At each concurrency C, C clients take the next request from one shared
list (``--requests``, default max(2 C, 8), cycling through the prompts) until it is empty. Per
server and C it prints: aggregate tok/s (completion tokens of all requests over the level's wall
time), time to first token p50/p95, request latency p50/p95, the slowest request over the median
(starvation), refused requests (429), and for localspec the drafted tokens per request (where
speculation turns off as the batch grows: the crossover of the cost model's batch pricing).

llama-server is built once from the pinned llama-cpp-python sdist's vendored llama.cpp, as
``bench/peer_llamacpp.py`` builds its tool (``--cache``, default ``~/.cache/localspec/peer``;
about 20 minutes on 2 cores the first time). ``--servers localspec`` runs without it (a smoke run:
``--servers localspec --concurrency 1,2 -n 8 --requests 4``). Measure on an idle machine; CI does
not run this.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import median

import httpx
import openai

from localspec.runtime.bench import load_prompts
from localspec.store.models import resolve

SERVERS = ("localspec", "localspec-plain", "llama-server", "llama-server-ngram-mod")
NATIVE_SPEC = {"llama-server": [], "llama-server-ngram-mod": ["--spec-type", "ngram-mod"]}
BENCH = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Running:
    """A server process on a loopback port, up once /health answers 200."""

    def __init__(self, name: str, cmd: list[str], port: int, log: Path, env: dict | None = None) -> None:
        self.name, self.port, self.log = name, port, log
        with open(log, "w") as sink:
            self.proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{name} exited (code {self.proc.returncode}):\n{log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        self.stop()
        raise SystemExit(f"{name} did not come up:\n{log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(name: str, args, target: Path, port: int, log: Path) -> Running:
    if name.startswith("localspec"):   # the model (its drafter too), or --target alone; -plain: --no-spec
        model = ["--target", str(args.target)] if args.target else ([args.model] if args.model else [])
        cmd = [sys.executable, "-m", "localspec", "serve", *model, "--port", str(port),
               "--parallel", str(args.parallel), "--ctx", str(args.ctx), "--queue-size", "64"]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        if name == "localspec-plain":
            cmd += ["--no-spec"]
        if args.gpu_layers:
            cmd += ["--gpu-layers", str(args.gpu_layers)]
        cmd += shlex.split(args.localspec_args)
        return Running(name, cmd, port, log, env=dict(os.environ, LOCALSPEC_THREADS=str(args.threads or "")))
    from peer_llamacpp import build_tool

    binary = build_tool(args.cache, "llama-server")
    cmd = [str(binary), "-m", str(target), "--port", str(port), "--host", "127.0.0.1", "-np", str(args.parallel),
           "-c", str(args.ctx * args.parallel), "--jinja", *NATIVE_SPEC[name]]
    if args.threads:
        cmd += ["-t", str(args.threads), "-tb", str(args.threads)]
    cmd += ["-ngl", str(args.gpu_layers)]
    return Running(name, cmd, port, log)


def calibrated(server: Running, name: str, timeout: float = 120.0) -> None:
    """A localspec server calibrates in the background once (its log says when): wait for that, so
    no level is timed while it runs (it pauses for requests, but takes idle moments between them)."""
    if name != "localspec":
        return
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        text = server.log.read_text(errors="replace") if server.log.is_file() else ""
        if "calibrated" in text or "calibration failed" in text:
            return
        time.sleep(0.5)


def one_request(url: str, model: str, prompt, n: int) -> dict:
    """One streamed chat completion: time to first token, latency, tokens, drafted (localspec)."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    first, chunks, usage = None, 0, None
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt.prompt}], max_tokens=n, temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body={"repeat_penalty": 1.0})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                chunks += 1
                if first is None:
                    first = time.perf_counter() - t0
            if chunk.usage is not None:
                usage = chunk.usage
    except openai.RateLimitError:
        return {"refused": True}
    extra = getattr(usage, "model_extra", None) or {}
    return {"refused": False, "ttft": first if first is not None else time.perf_counter() - t0,
            "latency": time.perf_counter() - t0,
            "tokens": usage.completion_tokens if usage is not None else chunks,
            "drafted": (extra.get("speculative") or {}).get("drafted")}


def level(url: str, model: str, prompts: list, c: int, n: int, requests: int) -> dict:
    """C clients over ``requests`` requests; the level's figures."""
    todo = [prompts[i % len(prompts)] for i in range(requests)]
    lock = threading.Lock()
    results: list[dict] = []

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                prompt = todo.pop(0)
            r = one_request(url, model, prompt, n)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [r for r in results if not r["refused"]]
    return summarize(done, len(results) - len(done), wall)


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else float("nan")


def summarize(done: list[dict], refused: int, wall: float) -> dict:
    lat = [r["latency"] for r in done]
    drafted = [r["drafted"] for r in done if r["drafted"] is not None]
    return {"requests": len(done), "refused": refused, "tok_s": sum(r["tokens"] for r in done) / wall,
            "ttft_p50": pct([r["ttft"] for r in done], 0.5), "ttft_p95": pct([r["ttft"] for r in done], 0.95),
            "lat_p50": pct(lat, 0.5), "lat_p95": pct(lat, 0.95),
            "slowest_over_median": max(lat) / median(lat) if lat else float("nan"),
            "drafted_per_request": sum(drafted) / len(drafted) if drafted else None}


def print_table(table: dict) -> None:
    head = f"{'server':<24} {'C':>2} {'tok/s':>8} {'TTFT p50':>9} {'p95':>7} {'lat p50':>8} {'p95':>7} " \
           f"{'max/med':>8} {'429':>4} {'drafted/req':>11}"
    print(head)
    for name, levels in table.items():
        for c, r in levels.items():
            d = "-" if r["drafted_per_request"] is None else f"{r['drafted_per_request']:.1f}"
            print(f"{name:<24} {c:>2} {r['tok_s']:>8.1f} {r['ttft_p50']:>9.3f} {r['ttft_p95']:>7.3f} "
                  f"{r['lat_p50']:>8.2f} {r['lat_p95']:>7.2f} {r['slowest_over_median']:>8.2f} {r['refused']:>4} {d:>11}")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a localspec model name (default: the default pair's target)")
    ap.add_argument("--target", type=Path, default=None, help="a target GGUF instead of --model")
    ap.add_argument("--parallel", type=int, default=4, help="slots of every server")
    ap.add_argument("--ctx", type=int, default=2048, help="context per slot")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128, help="max_tokens of every request")
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=None, help="requests per level (default: max(2 C, 8))")
    ap.add_argument("--prompts", nargs="+", type=Path, default=[BENCH / "chat.jsonl", BENCH / "coding.jsonl"])
    ap.add_argument("--servers", default=",".join(SERVERS))
    ap.add_argument("--localspec-args", default="", help="more flags for localspec serve (e.g. '--source lookup')")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "localspec" / "peer")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--gpu-layers", type=int, default=0, help="layers offloaded by every server (-ngl)")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    target = args.target or resolve(args.model).target
    prompts = [p for path in args.prompts for p in load_prompts(path)]
    levels = [int(c) for c in args.concurrency.split(",")]
    table: dict = {}
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    for name in args.servers.split(","):
        if name not in SERVERS:
            raise SystemExit(f"unknown server {name} ({', '.join(SERVERS)})")
        server = start(name, args, target, free_port(), logs / f"serve_load-{name}.log")
        try:
            model = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
            one_request(server.url, model, prompts[0], 4)   # warm: loads, caches nothing we time
            calibrated(server, name)
            table[name] = {}
            for c in levels:
                table[name][c] = level(server.url, model, prompts, c, args.n, args.requests or max(2 * c, 8))
                print(f"{name} C={c}: {table[name][c]['tok_s']:.1f} tok/s", file=sys.stderr)
        finally:
            server.stop()
    print_table(table)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": table},
                                        indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    main()
