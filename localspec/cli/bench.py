"""``localspec bench``: plain vs speculative decoding on a prompt file, in one run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..core import jsonout
from ..core.errors import LocalspecError
from ..runtime.bench import load_prompts, parse_modes, run_bench
from ..runtime.generation_options import GenerationOptions
from ..speculation.sources import registered
from .app import app
from .common import DraftOpt, ModelArg, TargetOpt, VerboseOpt, open_engine
from .flags import check_flags, with_options

# the declared options (localspec.core.options) `bench` takes
BENCH_OPTIONS = ("max_tokens", "policy", "draft_max", "source", "tree", "n_ctx", "threads", "gpu_layers")


@app.command()
@with_options(*BENCH_OPTIONS, max_tokens=dict(default=128, help="Most tokens to generate per prompt."),
              source=dict(help="Draft source of the compared policy."))
def bench(
    model: Optional[str] = ModelArg,
    prompts: Path = typer.Option(..., "--prompts", help='JSONL file, one {"prompt": ...} per line.'),
    target: Optional[Path] = TargetOpt,
    draft: Optional[Path] = DraftOpt,
    modes: Optional[str] = typer.Option(
        None, "--modes", show_default=False,
        help="More modes to run on each prompt, comma-separated: auto, eagle, lookup, fixed1..8 (EAGLE chains), "
             "tree1..8 (EAGLE draft trees of that depth), chain (auto without trees), "
             "lookup8 (lookup drafts of fixed depth), llama-lookup (llama-cpp-python's prompt lookup); "
             "'all' for a standard set."),
    repeats: int = typer.Option(1, "--repeats", help="Runs of each prompt and mode, interleaved; the fastest counts."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    profile: bool = typer.Option(False, "--profile",
                                 help="Time split per mode (target, drafter, Python) and the speedup bound."),
    llama_baseline: bool = typer.Option(False, "--llama-baseline",
                                        help="Also time llama-cpp-python's Llama API on the same prompts."),
    verbose: bool = VerboseOpt,
    **flags,
) -> None:
    """Greedy plain and speculative decoding of each prompt, side by side."""
    from ..runtime.bench import DEFAULT_MODES

    check_flags(flags)
    ctx, threads, gpu_layers = flags.pop("ctx"), flags.pop("threads"), flags.pop("gpu_layers")
    policy, source, tree = flags["policy"], flags["source"], flags["tree"]
    items = load_prompts(prompts)
    config = GenerationOptions.from_values(flags).to_config()
    draft_max = config.policy.draft_max   # the policy's default when --draft-max was not given
    mode_list = list(DEFAULT_MODES) if modes == "all" else parse_modes(modes) if modes else []
    if repeats < 1:
        raise LocalspecError("--repeats must be at least 1")
    model_spec, engine = open_engine(model, target, draft, ctx=ctx, threads=threads, gpu_layers=gpu_layers, verbose=verbose,
                                     source=source)
    report_mode = policy.value if source == "auto" else f"{policy.value}-{source}"
    with engine:
        report = run_bench(engine, items, config, _progress(report_mode, len(items), quiet=as_json),
                           llama_baseline=llama_baseline, modes=mode_list, repeats=repeats)
    summary = report.to_dict()
    summary.update(model=model_spec.name, policy=policy.value, source=source, tree=tree.value, draft_max=draft_max,
                   max_tokens=config.max_tokens, threads=engine.ctx.n_threads, repeats=repeats)
    if as_json:
        print(jsonout.dumps(summary, ensure_ascii=False), flush=True)
        if report.interrupted:   # the finished prompts are printed, marked "partial"; then exit 130
            raise KeyboardInterrupt
        return
    if report.interrupted and not report.results:
        raise KeyboardInterrupt
    _print_text(report, summary, f"localspec bench: {model_spec.name} (policy {policy.value}, source {source}, "
                                 f"draft-max {draft_max}, {engine.ctx.n_threads} threads)", profile, len(items))


def _progress(report_mode: str, n_prompts: int, *, quiet: bool):
    """One line on stderr per finished prompt (none with --json)."""
    console = Console(stderr=True)

    def progress(i: int, result) -> None:
        if not quiet:
            r = result.to_dict()
            more = "  ".join(f"{n} {m['speedup']:.2f}x" for n, m in r["modes"].items()
                             if n not in ("plain", report_mode))
            console.print(f"[{i + 1}/{n_prompts}] {r['category']}: {report_mode} {r['speedup']:.2f}x, "
                          f"{r['tokens_per_cycle']:.2f} tok/cycle  {more}")

    return progress


def _print_text(report, summary: dict, title: str, profile: bool, n_prompts: int) -> None:
    """The report as tables on stdout (exit 130 after a partial one)."""
    out = Console()
    if not out.is_terminal:  # files and pipes get the whole table
        out = Console(width=200)
    _print_table(out, report, summary, title)
    if profile:
        _print_profile(out, report, summary)
    if "llama_cpp_tokens_per_second" in summary:
        out.print(f"plain decoding: localspec {summary['plain_decode_tokens_per_second']:.1f} tok/s, "
                  f"llama-cpp-python Llama {summary['llama_cpp_tokens_per_second']:.1f} tok/s "
                  f"(ratio {summary['plain_vs_llama_cpp']:.3f})")
    if report.interrupted:
        out.print(f"partial: interrupted after {len(report.results)} of {n_prompts} prompts")
        raise KeyboardInterrupt


def _print_table(out: Console, report, summary: dict, title: str) -> None:
    """Per prompt and overall: each mode's speedup over plain decoding, and whether outputs agree."""
    names = [n for n in report.modes if n != "plain"]
    table = Table(title=title)
    table.add_column("category", justify="left")
    table.add_column("plain tok/s", justify="right")
    for n in names:
        table.add_column(n, justify="right")
    table.add_column("identical", justify="right")
    for r in summary["per_prompt"]:
        div = r["divergence"]
        cells = []
        for n in names:
            m = r["modes"][n]
            cells.append(f"{m['speedup']:.2f}x" + ("" if m["greedy_identical"] else "*"))
        table.add_row(r["category"], f"{r['plain_tokens_per_second']:.1f}", *cells,
                      "yes" if div is None else f"no @{div['position']} (gap {div['plain_margin']})")
    ms = summary["modes"]
    table.add_row("all", f"{summary['plain_tokens_per_second']:.1f}",
                  *[f"{ms[n]['speedup']:.2f}x" for n in names],
                  "yes" if summary["greedy_identical"] else "no", style="bold")
    out.print(table)
    out.print("speedup = tok/s of the mode / tok/s of plain decoding on the same prompt "
              "(* : greedy output differs from plain; see --json for position and top-2 gap)")
    for note in summary.get("notes", []):
        out.print(f"note: {note}")
    out.print(f"time outside llama.cpp (Python): {summary['python_overhead_share']:.1%} of speculative generation")


def _choices(ch: dict) -> str:
    """plain / model / lookup cycles: every model source's (each counts under its own name) summed."""
    model = sum(ch.get(s.name, 0) for s in registered() if s.model)
    return f"{ch.get('plain', 0)}/{model}/{ch.get('lookup', 0)}"


def _print_profile(out: Console, report, summary: dict) -> None:
    """--profile: each mode's time split, the speedup bound, and the measured verify costs."""
    ms = summary["modes"]
    prof = Table(title="profile (whole run, per mode)")
    for col in ("mode", "tok/s", "speedup", "tok/cycle", "accept", "target", "drafter", "python",
                "py ms/cycle", "bound", "speedup/bound", "choices (plain/model/lookup)"):
        prof.add_column(col, justify="left" if col == "mode" else "right")
    for n in report.modes:
        m = ms.get(n) or {}
        if "time_split" not in m:
            prof.add_row(n, f"{m.get('tokens_per_second', 0):.1f}", f"{m.get('speedup', 0):.2f}x", *["-"] * 9)
            continue
        ts, ch = m["time_split"], m.get("policy_choices", {})
        prof.add_row(n, f"{m['tokens_per_second']:.1f}", f"{m['speedup']:.2f}x", f"{m['tokens_per_cycle']:.2f}",
                     f"{m['acceptance_rate']:.0%}", f"{ts['target']:.0%}", f"{ts['drafter']:.0%}",
                     f"{ts['python']:.1%}", f"{m['python_ms_per_cycle']:.3f}", f"{m['bound']:.2f}",
                     f"{m['speedup_over_bound']:.2f}",
                     _choices(ch) if ch else "-")
    out.print(prof)
    plain_v = ms.get("plain", {}).get("verify_ms_by_batch", {})
    out.print("V(k) ms, measured in this run (batch: ms): " + ", ".join(
        f"{b}: {v}" for b, v in sorted(
            {int(b): v for m in ms.values() for b, v in m.get("verify_ms_by_batch", {}).items()}.items())))
    if plain_v:
        out.print(f"V(1) of plain decoding: {plain_v.get('1')} ms; bound = tau * V(1) / (V(k+1) + k d), "
                  "from each mode's own target and drafter time per cycle")
    if summary.get("calibration"):
        cal = summary["calibration"]
        out.print(f"calibration (cached per machine + model): V(1..9) ms {cal['verify_ms']}, "
                  f"drafter step ms {cal['drafter_step_ms']}")
