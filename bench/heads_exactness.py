"""Greedy text with the drafters a model brings (MTP heads, chained heads, a hybrid Qwen target's
head and lookup, Gemma 4's assistant) against plain decoding, at a thread count of your choice
(the test suite runs llama.cpp on one thread; users on every core).

    python bench/heads_exactness.py [--threads 2] [-n 48]

It writes the tiny fixtures of tests/ (tests/hybrid_models.py, mtp_models.py, gemma4_models.py),
generates each prompt plainly and with each source (fixed chains of 4, and auto), and prints
whether the tokens are the same and what was drafted and accepted. Exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown", "One, two, three, four, five, six, seven",
           "Once upon a time, in a small village by the sea, there lived"]


def pairs(d: Path) -> dict:
    from gemma4_models import build_gemma4_assistant, build_gemma4_target
    from hybrid_models import build_hybrid_target
    from mtp_models import build_mtp_target

    return {
        "qwen35 + its head": (build_hybrid_target(d / "q.gguf", with_head=True), None, ["lookup", "mtp", "auto"]),
        "step35, 3 chained heads": (build_mtp_target(d / "s.gguf", heads=3), None, ["mtp", "auto"]),
        "gemma4 + assistant": (build_gemma4_target(d / "g.gguf"), build_gemma4_assistant(d / "a.gguf"),
                               ["assistant", "auto"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=48)
    args = ap.parse_args(argv)
    from localspec import Engine, GenerationConfig
    from localspec.core.events import DoneEvent
    from localspec.speculation.policy import PolicyConfig

    def done(engine, prompt: str, **kw) -> DoneEvent:
        engine.clear_cache()
        return [e for e in engine.generate(prompt, GenerationConfig(max_tokens=args.n, **kw))
                if isinstance(e, DoneEvent)][0]

    same = runs = 0
    with tempfile.TemporaryDirectory() as d:
        for name, (target, drafter, sources) in pairs(Path(d)).items():
            with Engine(target, drafter, n_ctx=512, n_threads=args.threads) as engine:
                for prompt in PROMPTS:
                    plain = done(engine, prompt, spec=False).tokens
                    for source in sources:
                        policy = PolicyConfig() if source == "auto" else PolicyConfig("fixed", 4, source=source)
                        out = done(engine, prompt, policy=policy)
                        same += out.tokens == plain
                        runs += 1
                        print(f"{name:24s} {source:9s} {prompt[:24]!r:28s} "
                              f"{'same' if out.tokens == plain else 'DIFFERENT'}  drafted {out.stats.drafted}, "
                              f"accepted {out.stats.accepted}", flush=True)
    print(f"{same}/{runs} identical to plain decoding at {args.threads} threads")
    return 0 if same == runs else 1


if __name__ == "__main__":
    sys.exit(main())
