"""How often, and where, greedy speculative output departs from plain greedy decoding, and why.

    python bench/exactness.py [--model NAME] [--threads 1,2] [-n 64] [--limit 4] \\
        [--prompts bench/chat.jsonl bench/copy.jsonl bench/summarize.jsonl] [--modes lookup,auto,eagle] \\
        [--native --tool PATH] [--rows-match] [--json out.json]

For every prompt, thread count and mode: a plain greedy run and a speculative one from the same
empty cache (penalties off), the first token where they differ, and at that point a check that
separates llama.cpp's batch-shape arithmetic from a bug:
- ``one_row``: the logits plain decoding chose from there (the prompt in one batch, then one row
  per token, as plain decoding runs): its top-1 minus top-2 margin, and the rank in them of the
  token the speculative run chose;
- ``batched``: the same prefix, then the rows of the speculative run's verify batch that covered
  that position (its size and the row's place in it, from the run's own cycle events; rows past
  the committed text are filler: a row's logits depend on the rows before it, not after) decoded
  as one batch: whether that batch alone reproduces the speculative token, and the largest
  difference of any logit between the two.
A departure is ``batch-shape`` when the batched row reproduces the speculative token and that
token is the one-row logits' runner-up within the difference the batch shape makes; otherwise it
is ``unexplained`` (a bug until shown otherwise). With ``--native``, llama.cpp's
``llama-speculative-simple`` decodes the same prompts with ``ngram-mod`` and with no drafts
(plain), on the same thread counts: whether its own speculative text departs from its own plain
text (the same kernels: the same effect, or none).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from localspec.core.events import CycleEvent, DoneEvent
from localspec.formats.chat_format import Message
from localspec.runtime.bench import load_prompts
from localspec.runtime.config import SamplingParams
from localspec.runtime.engine import Engine, GenerationConfig
from localspec.speculation.policy import PolicyConfig
from localspec.store.models import resolve

BENCH = Path(__file__).resolve().parent
GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
MODES = {
    "lookup": PolicyConfig("fixed", 4, source="lookup"),        # a fixed chain of 4 n-gram drafts
    "auto": PolicyConfig("auto"),                                # the default (deep lookup drafts, EAGLE)
    "eagle": PolicyConfig("fixed", 4, source="eagle", tree="off"),
}


def run(engine: Engine, tokens: list[int], n: int, policy: PolicyConfig | None) -> tuple[DoneEvent, list]:
    """One greedy generation from an empty cache: its result and, per cycle, (emitted, batch rows)."""
    engine.clear_cache()
    config = GenerationConfig(max_tokens=n, sampling=GREEDY, spec=policy is not None,
                              **({"policy": policy} if policy is not None else {}))
    cycles, seen = [], {}
    done = None
    for event in engine.generate(tokens, config):
        if isinstance(event, CycleEvent):
            by = event.stats.verify_by_batch
            rows = next((b for b, (c, _) in by.items() if c != seen.get(b, 0)), 1)
            seen = {b: c for b, (c, _) in by.items()}
            cycles.append((event.emitted, rows))
        elif isinstance(event, DoneEvent):
            done = event
    return done, cycles


def _logits(ctx, row: int) -> np.ndarray:
    return np.array(ctx.logits(row), dtype=np.float32)


def one_row(engine: Engine, prompt: list[int], out: list[int], i: int) -> np.ndarray:
    """Plain decoding's logits for output token ``i``."""
    engine.clear_cache()
    ctx = engine.ctx
    ctx.decode(prompt, 0, all_logits=False)
    if i == 0:
        return _logits(ctx, -1)
    for j, tok in enumerate(out[:i]):
        ctx.decode([tok], len(prompt) + j, all_logits=False)
    return _logits(ctx, -1)


def batched(engine: Engine, prompt: list[int], spec: list[int], i: int, cycles: list) -> tuple[np.ndarray, int] | None:
    """The speculative run's verify batch that chose output token ``i``, decoded after a one-row
    prefix: the row's logits and the batch's size (None: token ``i`` came from the prompt pass)."""
    emitted = 1   # the prompt pass chose output token 0
    for count, rows in cycles:
        if emitted + count > i:
            break
        emitted += count
    else:
        return None
    if i == 0:
        return None
    start = emitted - 1                      # the batch's first row: the last committed token
    engine.clear_cache()
    ctx = engine.ctx
    ctx.decode(prompt, 0, all_logits=False)
    for j, tok in enumerate(spec[:start]):
        ctx.decode([tok], len(prompt) + j, all_logits=False)
    rows_tokens = (spec[start:start + rows] + [spec[start]] * rows)[:rows]
    ctx.decode(rows_tokens, len(prompt) + start, all_logits=True)
    return _logits(ctx, i - start - 1), rows   # row r (token start + r) chose token start + r + 1


def classify(engine: Engine, prompt: list[int], plain: DoneEvent, spec: DoneEvent, cycles: list) -> dict | None:
    a, b = plain.tokens, spec.tokens
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
    if i is None:
        return None
    l1 = one_row(engine, prompt, a, i)
    order = np.argsort(-l1)
    out = {"index": i, "plain_token": a[i], "spec_token": b[i], "one_row_margin": float(l1[order[0]] - l1[order[1]]),
           "spec_rank_one_row": int(np.where(order == b[i])[0][0]) + 1}
    rep = batched(engine, prompt, b, i, cycles)
    if rep is not None:
        l2, rows = rep
        out.update(batch_rows=rows, reproduced=int(np.argmax(l2)) == b[i],
                   max_logit_diff=float(np.max(np.abs(l1 - l2))))
        shape = out["reproduced"] and out["spec_rank_one_row"] == 2 and out["one_row_margin"] <= 2 * out["max_logit_diff"]
        out["kind"] = "batch-shape" if shape else "unexplained"
    else:
        out["kind"] = "prompt pass"
    return out


def native_texts(tool: Path, target: Path, text: str, n: int, threads: int) -> dict[str, str]:
    """llama-speculative-simple's generated text, plain (ngram-mod never matching) and ngram-mod."""
    from peer_llamacpp import NATIVE, NATIVE_ARGS
    out = {}
    for kind in ("plain", "ngram-mod"):
        cmd = [str(tool), "-m", str(target), "-p", text, "-n", str(n), "--temp", "0", "--seed", "1", "-c", "4096",
               "-t", str(threads), "-tb", str(threads), *NATIVE[kind], *NATIVE_ARGS.split()]
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        out[kind] = proc.stdout
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--prompts", type=Path, nargs="*",
                    default=[BENCH / "chat.jsonl", BENCH / "copy.jsonl", BENCH / "summarize.jsonl"])
    ap.add_argument("--modes", default="lookup,auto,eagle")
    ap.add_argument("--native", action="store_true")
    ap.add_argument("--tool", type=Path)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "localspec" / "peer")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rows-match", action="store_true",
                    help="the engine's rows_match: plain steps as two rows, verifies under 64 rows")
    args = ap.parse_args(argv)
    spec = resolve(args.model)
    modes = [m for m in args.modes.split(",") if m and (m != "eagle" or spec.drafter is not None)]
    results = []
    tool = None
    if args.native:
        sys.path.insert(0, str(BENCH))
        from peer_llamacpp import build_tool
        tool = args.tool or build_tool(args.cache)
    load = os.getloadavg()[0]
    for threads in [int(t) for t in args.threads.split(",")]:
        with Engine(spec.target, spec.drafter, n_ctx=4096, n_threads=threads, rows_match=args.rows_match) as engine:
            engine.cost_model()
            for path in args.prompts:
                for bp in load_prompts(path)[:args.limit]:
                    messages = ([Message("system", bp.system)] if bp.system else []) + [Message("user", bp.prompt)]
                    prompt = engine.prepare(messages)
                    plain, _ = run(engine, prompt, args.n, None)
                    row = {"set": path.stem, "threads": threads, "prompt_tokens": len(prompt), "modes": {}}
                    for mode in modes:
                        out, cycles = run(engine, prompt, args.n, MODES[mode])
                        row["modes"][mode] = classify(engine, prompt, plain, out, cycles)
                    if tool is not None:
                        text = engine.formatter.render(messages, add_generation_prompt=True)
                        nat = native_texts(tool, spec.target, text, args.n, threads)
                        row["native_departs"] = nat["plain"] != nat["ngram-mod"]
                    results.append(row)
                    print(json.dumps(row), flush=True)
    summary = summarize(results, modes)
    print(f"\nload {load:.2f} -> {os.getloadavg()[0]:.2f}")
    for line in summary["lines"]:
        print(line)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "summary": summary}, indent=1))
    return 0


def summarize(results: list[dict], modes: list[str]) -> dict:
    """Departures per mode, by thread count and source set, and how many were batch-shape."""
    lines = [f"{'mode':<8}{'threads':>8}{'set':>12}{'prompts':>9}{'departed':>10}{'batch-shape':>13}"
             f"{'unexplained':>13}{'native departs':>16}"]
    table = {}
    for mode in modes:
        for key in sorted({(r["threads"], r["set"]) for r in results}):
            rows = [r for r in results if (r["threads"], r["set"]) == key]
            d = [r["modes"][mode] for r in rows if r["modes"].get(mode)]
            shape = sum(1 for x in d if x["kind"] == "batch-shape")
            bad = sum(1 for x in d if x["kind"] == "unexplained")
            nat = [r["native_departs"] for r in rows if "native_departs" in r]
            table[f"{mode}/{key[0]}/{key[1]}"] = {"prompts": len(rows), "departed": len(d), "batch_shape": shape,
                                                 "unexplained": bad, "native_departed": sum(nat) if nat else None}
            lines.append(f"{mode:<8}{key[0]:>8}{key[1]:>12}{len(rows):>9}{len(d):>10}{shape:>13}{bad:>13}"
                         f"{(str(sum(nat)) + '/' + str(len(nat))) if nat else '-':>16}")
    return {"table": table, "lines": lines}


if __name__ == "__main__":
    sys.exit(main())
