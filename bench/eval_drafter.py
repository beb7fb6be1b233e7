"""Held-out evaluation of a drafter: tokens per cycle by category, against a bigram baseline.

    .venv/bin/python bench/eval_drafter.py --draft localspec/data/smollm2-135m-eagle3.1.gguf \
        --data localspec/data/smollm2-135m-train.jsonl.gz [--prompts bench/heldout.jsonl] [--tree] [--json]

Runs the same comparison as ``localspec bench --policy fixed --draft-max 4`` (plain, then
speculative greedy decoding of each prompt) and simulates a bigram drafter (the most frequent next
token in the training data, chained to the same depth) on the plain greedy responses. ``--tree``
also drafts EAGLE-2 trees of the same depth (bench mode ``treeK``) and reports their tokens per cycle.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from localspec.runtime.bench import load_prompts, run_bench
from localspec.runtime.engine import Engine, GenerationConfig
from localspec.store.models import default_target
from localspec.speculation.policy import PolicyConfig
from localspec.train.baseline import bigram_table, simulate_tokens_per_cycle
from localspec.train.dataset import load_sequences


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target", default=None)
    ap.add_argument("--data", required=True, help="the drafter's training dataset (for the bigram table)")
    ap.add_argument("--prompts", default=str(Path(__file__).with_name("heldout.jsonl")))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--tree", action="store_true", help="also draft trees of the same depth (mode treeK)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    prompts = load_prompts(args.prompts)
    seqs = load_sequences(Path(args.data))
    table = bigram_table([s.prompt + s.response for s in seqs])
    with Engine(args.target or default_target(), args.draft, n_ctx=2048, n_threads=args.threads) as eng:
        cfg = GenerationConfig(max_tokens=args.max_tokens, policy=PolicyConfig(name="fixed", draft_max=args.depth))
        tree_mode = f"tree{args.depth}"
        report = run_bench(eng, prompts, cfg, modes=[tree_mode] if args.tree else [])
        rows = defaultdict(lambda: {"tokens": 0, "cycles": 0, "bigram_tokens": 0, "bigram_cycles": 0.0, "n": 0,
                                    "identical": True, "plain_tps": [], "spec_tps": [], "tree_tokens": 0,
                                    "tree_cycles": 0})
        for r in report.results:
            c = rows[r.prompt.category]
            s = r.spec.stats
            c["n"] += 1
            c["tokens"] += s.generated_tokens
            c["cycles"] += s.cycles
            c["identical"] &= r.divergence is None
            if tree_mode in r.modes:
                t = r.modes[tree_mode]
                c["tree_tokens"] += t.stats.generated_tokens
                c["tree_cycles"] += t.stats.cycles
                c["identical"] &= t.divergence is None
            c["plain_tps"].append(r.plain.stats.tokens_per_second)
            c["spec_tps"].append(s.tokens_per_second)
            messages = ([{"role": "system", "content": r.prompt.system}] if r.prompt.system else []) + \
                [{"role": "user", "content": r.prompt.prompt}]
            prompt_toks = eng.prompt_tokens(messages)
            resp = r.plain.tokens
            tpc = simulate_tokens_per_cycle(table, prompt_toks, resp, args.depth)
            if tpc:
                c["bigram_tokens"] += len(resp) - 1
                c["bigram_cycles"] += (len(resp) - 1) / tpc
    out = {}
    for cat, c in rows.items():
        out[cat] = {
            "prompts": c["n"],
            "tokens_per_cycle": round(c["tokens"] / max(c["cycles"], 1), 3),
            "bigram_tokens_per_cycle": round(c["bigram_tokens"] / max(c["bigram_cycles"], 1e-9), 3),
            "greedy_identical": c["identical"],
            "speedup": round(sum(c["spec_tps"]) / max(sum(c["plain_tps"]), 1e-9), 3),
        }
        if args.tree:
            out[cat]["tree_tokens_per_cycle"] = round(c["tree_tokens"] / max(c["tree_cycles"], 1), 3)
    total = report.to_dict()
    bt = sum(c["bigram_tokens"] for c in rows.values())
    bc = sum(c["bigram_cycles"] for c in rows.values())
    out["all"] = {"prompts": total["prompts"], "tokens_per_cycle": total["tokens_per_cycle"],
                  "bigram_tokens_per_cycle": round(bt / max(bc, 1e-9), 3), "greedy_identical": total["greedy_identical"],
                  "speedup": total["speedup"], "acceptance_rate": total["acceptance_rate"]}
    if args.tree:
        out["all"]["tree_tokens_per_cycle"] = round(sum(c["tree_tokens"] for c in rows.values())
                                                    / max(sum(c["tree_cycles"] for c in rows.values()), 1), 3)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{'category':10} {'prompts':>7} {'tok/cycle':>9} {'bigram':>7} {'tree':>6} {'speedup':>8} identical")
        for cat, c in out.items():
            print(f"{cat:10} {c['prompts']:7d} {c['tokens_per_cycle']:9.3f} {c['bigram_tokens_per_cycle']:7.3f} "
                  f"{c.get('tree_tokens_per_cycle', 0):6.3f} {c['speedup']:8.3f} {c['greedy_identical']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
