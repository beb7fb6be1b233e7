"""Does a prompt's first-token logit row depend on what else the batch held, where its cells lie,
or a reused prefix? Each against the prompt decoded alone in a fresh cache, with and without exact
mode (``rows_match``), on the embedded SmolLM2 with 2 slots (issue 44, class 6).

    python bench/batch_shape.py [--threads 2]

Cases: ``cells moved`` (another slot's 100 cells first, so the prompt lands after them),
``batched beside`` (another slot's 40 prompt rows in the prompt's first batch), ``prefix reused``
(the first 30 tokens cached, the rest decoded after them). Prints the largest logit difference and
whether the argmax is the same.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [{"role": "user", "content": "Name three colours of the rainbow. Answer in JSON with a key colours."}]


def prefill(engine, seq: int, tokens: list[int], exact: bool, start: int = 0, beside=None) -> np.ndarray:
    """Decode ``tokens[start:]`` on ``seq`` in batches as the scheduler makes them (``beside``:
    (seq, tokens) of another slot in the first batch); the last row's logits."""
    from localspec.runtime.batch import Batch

    pos, first = start, True
    while pos < len(tokens):
        batch = Batch(engine.ctx, exact=exact)
        if first and beside is not None:
            batch.add(beside[0], beside[1], 0, all_logits=False)
        chunk = tokens[pos:pos + batch.rows_left()]
        offset = batch.add(seq, chunk, pos, all_logits=False)
        batch.decode()
        pos, first = pos + len(chunk), False
    return np.array(engine.ctx.logits(offset + len(chunk) - 1))


def cases(engine, p: list[int], q: list[int], exact: bool) -> dict[str, tuple[float, bool]]:
    """Prompt ``p`` in each case against ``p`` alone; ``q``: the other slot's tokens."""
    def fresh() -> None:
        for verifier in engine.verifiers:
            verifier.forget()

    fresh()
    base = prefill(engine, 0, p, exact)
    fresh()
    prefill(engine, 1, q[:100], exact)
    moved = prefill(engine, 0, p, exact)
    fresh()
    beside = prefill(engine, 0, p, exact, beside=(1, q[:40]))
    fresh()
    prefill(engine, 0, p[:30], exact)
    reused = prefill(engine, 0, p, exact, start=30)
    fresh()
    return {name: (float(np.abs(row - base).max()), int(np.argmax(row)) == int(np.argmax(base)))
            for name, row in (("cells moved", moved), ("batched beside", beside), ("prefix reused", reused))}


def main() -> None:
    from localspec import Engine
    from localspec.core.paths import default_target

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with Engine(default_target(), n_ctx=1024, n_threads=args.threads, parallel=2) as engine:
        if not engine.calibrator.acquire():
            raise SystemExit("the engine is busy")
        try:
            short = engine.prompt_tokens(PROMPT)
            long = engine.prompt_tokens([{"role": "user", "content": json.loads(
                (ROOT / "bench" / "summarize.jsonl").open().readline())["prompt"]}])
            for label, p, q in ((f"short prompt ({len(short)} tokens)", short, long),
                                (f"long prompt ({len(long)} tokens)", long, long[::-1])):
                for exact in (False, True):
                    for name, (diff, same) in cases(engine, p, q, exact).items():
                        print(f"{label}  rows_match={exact!s:5}  {name:15}  max |logit difference| {diff:.4g}  "
                              f"argmax {'same' if same else 'DIFFERENT'}")
        finally:
            engine.calibrator.release()


if __name__ == "__main__":
    main()
