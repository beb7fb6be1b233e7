"""What ``auto`` with a garbage block drafter costs beyond plain decoding, by thread CPU time.

    python bench/block_rest_overhead.py [--source dflash|dspark] [--rounds 4]

On the tiny target (tests/dflash_models.py), generates each prompt 256 tokens greedily with
spec off and with ``auto --source <source>`` (a drafter whose blocks are garbage), alternated, and
splits each generation's thread CPU time into the target's decodes (``llama_decode``, timed around
each call, by the C host loop where it runs them) and the rest (the cycle's Python). A whole run's ratio moves with the decode's time on
a shared machine; the rest's difference per cycle, auto minus spec-off, is what ``auto`` itself
adds (docs/speculation.md, DFlash / DSpark). Run with ``PYTHONPATH`` at another checkout to
compare two versions.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PROMPTS = ["The quick brown fox jumps over the lazy dog. The quick brown",
           "Once upon a time there was a little house in the woods, and",
           "def fibonacci(n):\n    if n < 2:\n        return n\n"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default="dflash", choices=("dflash", "dspark"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("-n", type=int, default=256)
    args = ap.parse_args()
    import llama_cpp

    from dflash_models import NOISE, build_dflash
    from localspec import DoneEvent, Engine, GenerationConfig, PolicyConfig
    from localspec.llama import hostloop, llama_model
    from tiny_models import build_target

    spent = [0.0, 0]
    decode = llama_cpp.llama_decode

    def timed(ctx, batch):
        t = time.thread_time()
        rc = decode(ctx, batch)
        spent[0] += time.thread_time() - t
        spent[1] += 1
        return rc

    llama_model.llama_cpp.llama_decode = timed   # the target's decodes (the drafter's go through llama_process)
    hostloop.count_decode_cpu()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.environ["LOCALSPEC_HOME"] = str(d / "home")
        target = build_target(d / "noisy.gguf", "noisy", noise=NOISE)
        drafter = build_dflash(d / "garbage.gguf", kind="random", dspark=args.source == "dspark")

        def run(engine, prompt: str, spec: bool) -> tuple[float, float, int]:
            cfg = GenerationConfig(max_tokens=args.n, spec=spec, policy=PolicyConfig("auto", source=args.source))
            engine.clear_cache()
            spent[:] = [0.0, 0]
            t0, (_, c0, n0) = time.thread_time(), hostloop.decode_clock()
            [e for e in engine.generate(prompt, cfg) if isinstance(e, DoneEvent)]
            _, c1, n1 = hostloop.decode_clock()   # the decodes the C host loop ran (the target's, where built)
            return time.thread_time() - t0, spent[0] + c1 - c0, spent[1] + n1 - n0

        with Engine(target, drafter, n_ctx=1024, n_threads=1) as engine:
            engine.cost_model()
            for p in PROMPTS:   # warm-up
                run(engine, p, True), run(engine, p, False)
            sums = {True: [0.0, 0.0, 0], False: [0.0, 0.0, 0]}
            for r in range(args.rounds):
                for p in PROMPTS:
                    for spec in ((False, True) if r % 2 else (True, False)):
                        for i, v in enumerate(run(engine, p, spec)):
                            sums[spec][i] += v
    rest = {spec: (t - dec) / n for spec, (t, dec, n) in sums.items()}
    for spec, name in ((False, "spec off"), (True, f"auto {args.source}")):
        t, dec, n = sums[spec]
        print(f"{name:12s} thread CPU {t:.3f} s: decodes {dec:.3f} s ({n}, {dec / n * 1e6:.0f} µs each), "
              f"the rest {rest[spec] * 1e6:.1f} µs a cycle")
    print(f"auto adds {(rest[True] - rest[False]) * 1e6:.1f} µs a cycle; plain / auto by thread CPU "
          f"{sums[False][0] / sums[True][0]:.4f}, with spec-off's decodes timed as auto's "
          f"{(sums[False][0] - sums[False][1] + sums[True][1]) / sums[True][0]:.4f}")


if __name__ == "__main__":
    main()
