"""``localspec train``: self-distil an EAGLE-3.1 drafter for a target GGUF (needs torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..core.errors import LocalspecError
from .app import app
from .flags import option


@app.command()
def train(
    target: Optional[Path] = typer.Option(None, "--target", help="Target GGUF (default: the embedded SmolLM2-135M as Q4_0)."),
    out: Path = typer.Option(..., "--out", "-o", help="Drafter GGUF to write."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="Prompt file (JSONL or .txt); default: localspec's own set."),
    data: Optional[Path] = typer.Option(None, "--data", help="Train on this token-id dataset (.jsonl[.gz]) instead of generating."),
    save_data: Optional[Path] = typer.Option(None, "--save-data", help="Also write the dataset here (.jsonl.gz)."),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="Work files (default: OUT without .gguf + .train/)."),
    device: str = typer.Option("cpu", "--device", help="Training device: cpu, cuda or mps."),
    time_budget: str = typer.Option("30m", "--time-budget", help="Whole run, e.g. 600, 45m, 1.5h."),
    gen_time: Optional[str] = typer.Option(None, "--gen-time", help="Data generation limit (default: 40% of the budget)."),
    max_steps: int = option("max_steps"),
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run in the work directory."),
    parallel: int = option("parallel", default=16, help="Sequences per llama.cpp batch while generating."),
    max_new: int = option("max_new"),
    draft_vocab: int = option("draft_vocab"),
    ttt_steps: int = option("ttt_steps"),
    lr: float = option("lr"),
    batch_tokens: int = option("batch_tokens"),
    outtype: str = typer.Option("f16", "--outtype", help="Drafter weights: f16, bf16, q8_0 or f32."),
    threads: Optional[int] = option("threads", help="llama.cpp threads (generation, features)."),
    train_threads: Optional[int] = option("train_threads"),
    seed: int = option("seed", default=0, help="Seed of the run: data order and initial weights (training is always seeded)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT if it exists."),
) -> None:
    """Train an EAGLE-3.1 drafter on the target's own responses (self-distillation)."""
    from ..core.options import check_cli

    check_cli(dict(parallel=parallel, max_new=max_new, draft_vocab=draft_vocab, ttt_steps=ttt_steps,
                   batch_tokens=batch_tokens, max_steps=max_steps, lr=lr, threads=threads,
                   train_threads=train_threads, seed=seed))
    if seed == -1:   # training is always seeded (reproducible runs)
        raise LocalspecError("seed must be between 0 and 4294967295 for training, got -1 (--seed)")
    if out.expanduser().is_file() and not (force or resume):   # as `convert`: never overwrite unasked
        raise LocalspecError(f"{out} exists (use --force to overwrite)")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise LocalspecError("training needs torch: pip install 'localspec[torch]'") from None
    from ..store.models import default_target
    from ..train.pipeline import TrainOptions, parse_duration, run
    from .train_progress import ProgressView

    opts = TrainOptions(
        target=target or default_target(), out=out, prompts=prompts, data=data, work_dir=work_dir, device=device,
        time_budget_s=parse_duration(time_budget), gen_time_s=parse_duration(gen_time) if gen_time else None,
        max_steps=max_steps, resume=resume, n_seq=parallel, max_new=max_new, draft_vocab=draft_vocab,
        ttt_steps=ttt_steps, lr=lr, batch_tokens=batch_tokens, outtype=outtype, threads=threads, train_threads=train_threads, seed=seed,
        save_data=save_data)
    with ProgressView(enabled=not quiet) as view:
        opts.log = view.log
        opts.progress = view.update
        run(opts)
