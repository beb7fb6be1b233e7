"""Plain vs auto with and without one busy core, at several thread settings, interleaved.

    python bench/under_load.py --prompts bench/easy.jsonl:2 --prompts bench/heldout.jsonl:6 \
        -n 96 --threads 1,2,default --json load.json

``FILE:K`` takes every K-th prompt of FILE. For each round, prompt set and thread setting
(``default``: no ``--threads``, the engine's adaptive choice) it runs ``localspec bench --json``
once on an idle machine and once beside ``sh -c 'while :; do :; done'`` pinned to one core, and
prints plain and auto tok/s, auto/plain over the set and the per-prompt range, with the 1-minute
load average when each run started (other work on the machine shows there). ``--cmd LABEL=COMMAND``
(repeatable) replaces the ``localspec`` command, e.g. an older checkout's beside this one: every
configuration then runs each command back to back. ``default`` is skipped for a command labelled
``before`` (adaptive threads did not exist there). For people who measure; CI does not run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def prompt_slice(spec: str, tmp: Path) -> tuple[str, Path]:
    path, _, every = spec.partition(":")
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    k = int(every or 1)
    out = tmp / f"{Path(path).stem}-{k}.jsonl"
    out.write_text("\n".join(lines[::k]) + "\n")
    return f"{Path(path).stem}" + (f"/{k}" if k > 1 else ""), out


def busy_core() -> subprocess.Popen:
    proc = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        os.sched_setaffinity(proc.pid, {max(os.sched_getaffinity(0))})
    except (AttributeError, OSError):
        pass
    return proc


def run_bench(cmd: list[str], prompts: Path, threads: str, n: int, busy: bool) -> dict:
    args = cmd + ["bench", "--prompts", str(prompts), "-n", str(n), "--json"]
    if threads != "default":
        args += ["--threads", threads]
    load = os.getloadavg()[0]
    hog = busy_core() if busy else None
    try:
        time.sleep(0.5 if busy else 0.0)
        proc = subprocess.run(args, capture_output=True, text=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    if proc.returncode != 0:
        raise SystemExit(f"Error: {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    data = json.loads(proc.stdout)
    per = [p["speedup"] for p in data["per_prompt"]]
    return {"plain": data["plain_tokens_per_second"], "auto": data["spec_tokens_per_second"],
            "ratio": data["speedup"], "per_prompt_min": min(per), "per_prompt_max": max(per),
            "load1": round(load, 2), "policy_choices": data["modes"]["auto"]["policy_choices"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", action="append", required=True, help="FILE or FILE:K (every K-th prompt)")
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("--threads", default="1,2", help="comma-separated: numbers and/or 'default'")
    ap.add_argument("--busy", default="0,1", help="0: no busy core, 1: one busy core (both: 0,1)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--cmd", action="append", help="LABEL=COMMAND, repeatable (default: localspec)")
    ap.add_argument("--json", type=Path, help="write the results here too")
    opts = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # the busy loop ends with us
    cmds = [c.partition("=")[::2] if "=" in c else ("", c) for c in (opts.cmd or ["localspec"])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sets = [prompt_slice(s, Path(tmp)) for s in opts.prompts]
        for r in range(opts.rounds):
            for name, path in sets:
                for threads in opts.threads.split(","):
                    for busy, (label, cmd) in ((b == "1", c) for b in opts.busy.split(",") for c in cmds):
                        if threads == "default" and label == "before":
                            continue
                        res = run_bench(shlex.split(cmd), path, threads, opts.max_tokens, busy)
                        res.update(round=r, set=name, threads=threads, busy=busy, cmd=label)
                        rows.append(res)
                        print(f"{label:7}{name:12} t={threads:7} busy={int(busy)} load={res['load1']:5.2f}  "
                              f"plain {res['plain']:7.1f}  auto {res['auto']:7.1f}  auto/plain {res['ratio']:.3f}  "
                              f"per prompt {res['per_prompt_min']:.2f}-{res['per_prompt_max']:.2f}", flush=True)
    if opts.json:
        opts.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
