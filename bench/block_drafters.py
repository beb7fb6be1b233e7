"""Block drafters (DFlash, DSpark) under ``auto`` against plain decoding, on the tiny fixtures.

    python bench/block_drafters.py [--threads 1] [-n 256] [--rounds 3] [--targets tiny,costly] [--only dspark]

Writes the tiny llama target (``tiny``), the costly one (``costly``: 8 layers of a 8192-wide FFN,
whose step costs more than a block) and the block drafters of tests/dflash_models.py into a
temporary directory, calibrates the cost model on this machine (a fresh ``LOCALSPEC_HOME``; the
table gives its target step V(1) and block price D), then generates
each prompt greedily, plain and with ``--policy auto --source <drafter>``, alternating the two
``--rounds`` times, and prints tokens per second (the median of the rounds), the speed ratio,
the drafter's cycles, drafts and accepted drafts, and whether the text equals plain decoding's.
A drafter whose blocks are garbage must not make auto slower than plain (the issue's >= 0.97x);
one whose blocks are good must draft blocks where the target costs more than a block.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown",
           "Once upon a time there was a little house in the woods, and",
           "def fibonacci(n):\n    if n < 2:\n        return n\n"]


def _run(engine, prompt: str, n: int, spec: bool, source: str):
    from localspec import DoneEvent, GenerationConfig, PolicyConfig

    cfg = GenerationConfig(max_tokens=n, spec=spec, policy=PolicyConfig("auto", source=source))
    engine.clear_cache()
    return [e for e in engine.generate(prompt, cfg) if isinstance(e, DoneEvent)][0]


def bench(target: Path, drafter: Path, source: str, n: int, rounds: int, threads: int) -> dict:
    from localspec import Engine

    with Engine(target, drafter, n_ctx=1024, n_threads=threads) as engine:
        cost = engine.cost_model()
        plain, auto, same, stats = [], [], 0, [0, 0, 0]
        for prompt in PROMPTS:
            p_runs, a_runs = [], []
            for _ in range(rounds):
                p = _run(engine, prompt, n, False, source)
                a = _run(engine, prompt, n, True, source)
                p_runs.append(p.stats.tokens_per_second)
                a_runs.append(a.stats.tokens_per_second)
            plain.append(statistics.median(p_runs))
            auto.append(statistics.median(a_runs))
            same += a.tokens == p.tokens
            for i, v in enumerate(a.stats.sources.get(source, [0, 0, 0])):
                stats[i] += v
    return {"plain": sum(plain) / len(plain), "auto": sum(auto) / len(auto), "same": same, "sources": stats,
            "v1": cost.verify(1), "block": cost.drafter_step}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--targets", default="tiny,costly", help="comma-separated: tiny, costly")
    ap.add_argument("--only", default="", help="only the drafters whose name contains this (e.g. dspark)")
    args = ap.parse_args()
    from dflash_models import NOISE, build_costly_target, build_dflash
    from tiny_models import build_target

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        targets = {"tiny": lambda: build_target(d / "noisy.gguf", "noisy", noise=NOISE),
                   "costly": lambda: build_costly_target(d / "costly.gguf")}
        drafters = [("garbage dflash", build_dflash(d / "dflash_random.gguf", kind="random"), "dflash"),
                    ("garbage dspark", build_dflash(d / "dspark_random.gguf", kind="random", dspark=True), "dspark"),
                    ("repeat dflash", build_dflash(d / "dflash.gguf"), "dflash"),
                    ("repeat dspark", build_dflash(d / "dspark.gguf", dspark=True), "dspark")]
        print("| target | drafter | V(1) ms | block ms | plain tok/s | auto tok/s | auto / plain "
              "| cycles, drafted, accepted | same text |")
        print("|---|---|---|---|---|---|---|---|---|")
        for tname in args.targets.split(","):
            target = targets[tname]()
            for name, drafter, source in [c for c in drafters if args.only in c[0]]:
                os.environ["LOCALSPEC_HOME"] = str(d / f"home-{tname}")
                r = bench(target, drafter, source, args.n, args.rounds, args.threads)
                print(f"| {tname} | {name} | {r['v1'] * 1e3:.2f} | {r['block'] * 1e3:.2f} | {r['plain']:.1f} "
                      f"| {r['auto']:.1f} | {r['auto'] / r['plain']:.3f} | {', '.join(map(str, r['sources']))} "
                      f"| {r['same']}/{len(PROMPTS)} |", flush=True)


if __name__ == "__main__":
    main()
