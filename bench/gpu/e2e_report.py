"""The tables of bench/gpu/e2e.sh's results, as Markdown for docs/gpu.md.

    python bench/gpu/e2e_report.py OUT_DIR > gpu_e2e.md

Reads host_time.json (bench/host_time.py), peer.json (bench/peer_llamacpp.py) and serve.json
(bench/serve_load.py) where they exist; a missing one is said, not guessed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def host_table(data: dict) -> list[str]:
    rows = ["| source | host µs / cycle | host µs / drafted token | host share | llama.cpp ms / cycle | cycles |",
            "|---|---:|---:|---:|---:|---:|"]
    for mode, r in data["results"].items():
        rows.append(f"| {mode} | {r.get('host_us_per_cycle')} | {r.get('host_us_per_drafted') or '-'} | "
                    f"{r.get('host_share')} | {r.get('native_ms_per_cycle')} | {r.get('cycles')} |")
    return [f"Host time per cycle ({data.get('model')}, {data.get('threads')} threads, -n {data.get('n')}, "
            f"load {data.get('load')}):", "", *rows]


def peer_table(data: dict) -> list[str]:
    out = [f"End to end ({data.get('target')}, {data.get('max_tokens')} tokens, greedy; ratios to native plain):", ""]
    for path, res in data["results"].items():
        out += [f"**{Path(path).stem}**", "", "| run | tok/s | ratio | accept | greedy = plain | vs best n-gram |",
                "|---|---:|---:|---:|---|---:|"]
        for name, r in res.items():
            if name == "per_prompt":
                continue
            same = {True: "yes", False: f"no (gap {r.get('divergence_margin_max')})"}.get(r.get("greedy_identical"), "")
            out.append(f"| {name} | {r['tokens_per_second']} | {r['ratio']}x | {r.get('acceptance_rate') or '-'} | "
                       f"{same} | {r.get('vs_best_ngram', '')} |")
        out.append("")
    return out


def serve_table(data: dict) -> list[str]:
    out = ["Serving (streamed chat requests, greedy):", "",
           "| server | C | tok/s | TTFT p50 s | TTFT p95 s | latency p50 s | drafted / request |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for name, levels in data["results"].items():
        for c, r in levels.items():
            d = "-" if r.get("drafted_per_request") is None else f"{r['drafted_per_request']:.1f}"
            out.append(f"| {name} | {c} | {r['tok_s']:.1f} | {r['ttft_p50']:.3f} | {r['ttft_p95']:.3f} | "
                       f"{r['lat_p50']:.2f} | {d} |")
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path(".")
    lines: list[str] = []
    for name, table in (("host_time.json", host_table), ("peer.json", peer_table), ("serve.json", serve_table)):
        data = _load(out / name)
        lines += (table(data) if data is not None else [f"({name}: no results; see steps.log)"]) + [""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
