"""Predicted Outputs on edit prompts: plain, auto, and auto with the prediction, interleaved.

    python bench/prediction.py --prompts bench/copy.jsonl -n 128 --repeats 3 --json pred.json

Each prompt of the file is an instruction, a blank line or a newline, then the text to edit (the
shape of ``bench/copy.jsonl``); the prediction is that text, as an editor sends the file being
edited (OpenAI's ``prediction: {"type": "content", ...}``). For every prompt and round the three
modes run back to back with the prompt cache cleared (greedy, penalties off, the engine's default
pair); the fastest of the rounds counts. It prints tok/s per mode, each mode's ratio to plain over
the set, the accepted and rejected prediction tokens, and whether every mode's text equals plain
decoding's. For people who measure on an idle machine; CI does not run it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from localspec.cli.common import open_engine
from localspec.core.events import DoneEvent
from localspec.formats.chat_format import Message
from localspec.runtime.config import GenerationConfig
from localspec.runtime.sampling import SamplingParams

MODES = ("plain", "auto", "auto+prediction")


def edited_text(prompt: str) -> str:
    """The text an edit prompt quotes: what follows its first line."""
    head, _, rest = prompt.partition("\n")
    return rest.strip("\n") or head


def run(engine, prompt: str, mode: str, n: int) -> dict:
    engine.clear_cache()   # every run prefills the whole prompt
    config = GenerationConfig(max_tokens=n, sampling=SamplingParams(temperature=0.0), spec=mode != "plain",
                              prediction=edited_text(prompt) if mode == "auto+prediction" else None)
    done = next(e for e in engine.generate([Message("user", prompt)], config) if isinstance(e, DoneEvent))
    s = done.stats
    return {"tokens": s.generated_tokens, "seconds": s.generation_seconds, "text": done.text,
            "accepted_prediction_tokens": s.accepted_prediction_tokens,
            "rejected_prediction_tokens": s.rejected_prediction_tokens, "drafted": s.drafted, "accepted": s.accepted}


def bench(engine, prompts: list[dict], n: int, repeats: int) -> list[dict]:
    best: list[dict] = [{} for _ in prompts]
    for _ in range(repeats):
        for i, item in enumerate(prompts):
            for mode in MODES:
                r = run(engine, item["prompt"], mode, n)
                old = best[i].get(mode)
                if old is None or r["seconds"] < old["seconds"]:
                    best[i][mode] = r
    return best


def report(prompts: list[dict], best: list[dict]) -> dict:
    totals = {m: [sum(b[m]["tokens"] for b in best), sum(b[m]["seconds"] for b in best)] for m in MODES}
    rate = {m: t / s for m, (t, s) in totals.items()}
    out = {"tokens_per_second": rate, "speedup_vs_plain": {m: rate[m] / rate["plain"] for m in MODES},
           "prediction_vs_auto": rate["auto+prediction"] / rate["auto"],
           "identical": all(b[m]["text"] == b["plain"]["text"] for b in best for m in MODES),
           "accepted_prediction_tokens": sum(b["auto+prediction"]["accepted_prediction_tokens"] or 0 for b in best),
           "rejected_prediction_tokens": sum(b["auto+prediction"]["rejected_prediction_tokens"] or 0 for b in best),
           "per_prompt": [{"category": p.get("category"),
                           **{m: round(b[m]["tokens"] / b[m]["seconds"], 1) for m in MODES},
                           "identical": all(b[m]["text"] == b["plain"]["text"] for m in MODES)}
                          for p, b in zip(prompts, best)]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, default=Path(__file__).with_name("copy.jsonl"))
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    _, engine = open_engine(None, None, None, ctx=4096, threads=args.threads, gpu_layers=None, verbose=False)
    with engine:
        out = report(prompts, bench(engine, prompts, args.max_tokens, args.repeats))
    for row in out["per_prompt"]:
        print(f"{row['category'] or '-':16} " + "  ".join(f"{m} {row[m]:6.1f}" for m in MODES)
              + ("" if row["identical"] else "  (text differs)"))
    print("tok/s: " + ", ".join(f"{m} {v:.1f}" for m, v in out["tokens_per_second"].items()))
    print("vs plain: " + ", ".join(f"{m} {v:.2f}x" for m, v in out["speedup_vs_plain"].items())
          + f"; prediction vs auto {out['prediction_vs_auto']:.2f}x")
    print(f"prediction tokens accepted {out['accepted_prediction_tokens']}, rejected "
          f"{out['rejected_prediction_tokens']}; text identical to plain: {out['identical']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
