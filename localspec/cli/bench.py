"""``localspec bench``: plain vs speculative decoding on a prompt file, in one run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..bench import load_prompts, run_bench
from ..engine import GenerationConfig
from ..speculation.policy import PolicyConfig
from . import app
from .common import CtxOpt, DraftOpt, GpuLayersOpt, ModelArg, TargetOpt, ThreadsOpt, VerboseOpt, open_engine
from .generate import Policy


@app.command()
def bench(
    model: Optional[str] = ModelArg,
    prompts: Path = typer.Option(..., "--prompts", help='JSONL file, one {"prompt": ...} per line.'),
    target: Optional[Path] = TargetOpt,
    draft: Optional[Path] = DraftOpt,
    max_tokens: int = typer.Option(128, "--max-tokens", "-n"),
    policy: Policy = typer.Option(Policy.auto, "--policy"),
    draft_max: int = typer.Option(4, "--draft-max"),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    llama_baseline: bool = typer.Option(False, "--llama-baseline",
                                        help="Also time llama-cpp-python's Llama API on the same prompts."),
    ctx: int = CtxOpt,
    threads: Optional[int] = ThreadsOpt,
    gpu_layers: int = GpuLayersOpt,
    verbose: bool = VerboseOpt,
) -> None:
    """Greedy plain and speculative decoding of each prompt, side by side."""
    items = load_prompts(prompts)
    config = GenerationConfig(max_tokens=max_tokens, policy=PolicyConfig(name=policy.value, draft_max=draft_max))
    spec, engine = open_engine(model, target, draft, ctx=ctx, threads=threads, gpu_layers=gpu_layers, verbose=verbose)
    console = Console(stderr=True)
    with engine:
        def progress(i: int, result) -> None:
            if not as_json:
                r = result.to_dict()
                console.print(f"[{i + 1}/{len(items)}] {r['category']}: {r['speedup']:.2f}x, "
                              f"{r['tokens_per_cycle']:.2f} tok/cycle")

        report = run_bench(engine, items, config, progress, llama_baseline=llama_baseline)
    summary = report.to_dict()
    summary.update(model=spec.name, policy=policy.value, draft_max=draft_max, max_tokens=max_tokens)
    if as_json:
        print(json.dumps(summary, ensure_ascii=False))
        return
    table = Table(title=f"localspec bench: {spec.name} (policy {policy.value}, draft-max {draft_max})")
    for col in ("category", "plain tok/s", "spec tok/s", "speedup", "accept", "tok/cycle", "identical"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for r in summary["per_prompt"]:
        div = r["divergence"]
        table.add_row(r["category"], f"{r['plain_tokens_per_second']:.1f}", f"{r['spec_tokens_per_second']:.1f}",
                      f"{r['speedup']:.2f}x", f"{r['acceptance_rate']:.0%}", f"{r['tokens_per_cycle']:.2f}",
                      "yes" if div is None else f"no @{div['position']} (gap {div['plain_margin']})")
    table.add_row("all", f"{summary['plain_tokens_per_second']:.1f}", f"{summary['spec_tokens_per_second']:.1f}",
                  f"{summary['speedup']:.2f}x", f"{summary['acceptance_rate']:.0%}", f"{summary['tokens_per_cycle']:.2f}",
                  "yes" if summary["greedy_identical"] else "no", style="bold")
    out = Console()
    out.print(table)
    out.print(f"time outside llama.cpp (Python): {summary['python_overhead_share']:.1%} of speculative generation")
    if "llama_cpp_tokens_per_second" in summary:
        out.print(f"plain decoding: localspec {summary['plain_decode_tokens_per_second']:.1f} tok/s, "
                  f"llama-cpp-python Llama {summary['llama_cpp_tokens_per_second']:.1f} tok/s "
                  f"(ratio {summary['plain_vs_llama_cpp']:.3f})")
