"""Throughput of `localspec train`'s data generation: batched greedy decoding against one stream.

    .venv/bin/python bench/datagen_throughput.py [--target T.gguf] [--parallel 1,16,32] [--threads 2] [--json]

Side by side in one run: generated tokens/s with 1 sequence per llama.cpp batch (the single-stream
baseline) and with N, through the same loop (`localspec.train.datagen.generate_batched`); and the
target's prefill rate (512-token batches of one sequence, logits for the last row only). Batched
decoding cannot beat that prefill rate: it is what the hardware does with full batches, so the
ratio prefill / single stream is the ceiling for the batched speed-up on this machine.
"""

from __future__ import annotations

import argparse
import json
import time

from localspec.formats.gguf_info import read_gguf
from localspec.llama.process import set_verbose
from localspec.llama.llama_model import Context, Model
from localspec.store.models import default_target
from localspec.train.datagen import measure_throughput
from localspec.train.pipeline import prompt_token_ids
from localspec.train.prompts import load_prompts


def prefill_rate(model: Model, n_threads: int | None, seconds: float = 4.0, n_batch: int = 512) -> float:
    ctx = Context(model, n_ctx=4096, n_batch=n_batch, n_threads=n_threads)
    try:
        toks = [(100 + i) % model.n_vocab for i in range(n_batch)]
        ctx.decode(toks, 0, all_logits=False)   # warm-up
        pos, n, t0 = n_batch, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            if pos + n_batch > ctx.n_ctx:
                ctx.clear()
                pos = 0
            ctx.decode(toks, pos, all_logits=False)
            pos += n_batch
            n += n_batch
        return n / (time.perf_counter() - t0)
    finally:
        ctx.close()


def _counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated counts, e.g. 1,16,32 (got '{text}')") from None
    if any(n < 1 or n > 256 for n in counts):
        raise argparse.ArgumentTypeError("sequences per batch must be between 1 and 256")
    return counts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=None)
    ap.add_argument("--parallel", default="1,16,32", type=_counts,
                    help="sequences per batch to measure (1 = single stream)")
    ap.add_argument("--prompts", type=int, default=64, help="prompts per measurement (the default training set's first)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--prefill-seconds", type=float, default=4.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    set_verbose(False)
    target = args.target or default_target()
    info = read_gguf(target)
    model = Model(target)
    prompts = prompt_token_ids(info, model, load_prompts()[:args.prompts])
    rows = {}
    for n in args.parallel:
        rows[n] = measure_throughput(model, prompts, n_seq=n, max_new=args.max_new, n_threads=args.threads)
    ceiling = prefill_rate(model, args.threads, args.prefill_seconds)
    single = rows.get(1)
    report = {"target": str(target), "threads": args.threads, "prompts": len(prompts), "max_new": args.max_new,
              "tok_s": rows, "prefill_tok_s": ceiling,
              "speedup": {n: v / single for n, v in rows.items()} if single else None,
              "ceiling_speedup": ceiling / single if single else None}
    model.close()
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{'sequences/batch':>16} {'tok/s':>8} {'x single':>9}")
    for n, v in rows.items():
        print(f"{n:>16} {v:>8.1f} {v / single if single else float('nan'):>9.2f}")
    print(f"{'prefill ceiling':>16} {ceiling:>8.1f} {ceiling / single if single else float('nan'):>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
