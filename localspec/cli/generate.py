"""``localspec generate``: one prompt, streamed to stdout, statistics to stderr (or one JSON object)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ..core import jsonout
from ..formats.chat_format import Message
from ..runtime.engine import GenerationConfig
from ..core.events import DoneEvent, TokenEvent
from ..store.models import apply_model_defaults, resolve
from ..core import options
from ..core.errors import LocalspecError
from ..core.options import check_text
from ..formats.json_grammar import schema_grammar
from ..runtime.generation_options import GenerationOptions
from ..memory.live import memory_report
from .app import app
from ..core.userfile import read_text
from ..llama.grammar import check_grammar_shape
from .common import DraftOpt, ModelArg, TargetOpt, VerboseOpt, VramOpt, open_engine
from .flags import check_flags, is_default, with_options
from .spec_options import NoSpecOpt, Policy, Source, SPEC_OPTIONS, Tree, default_draft_max  # noqa: F401


# the declared options (localspec.core.options) `generate` takes; one more is one more name here
GENERATE_OPTIONS = (*SPEC_OPTIONS, "max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty",
                    "repeat_last_n", "presence_penalty", "frequency_penalty", "seed", "n_ctx", "threads", "gpu_layers", "rows_match")


def _read_text(flag: str, path: Path) -> str:
    """A file a flag names: its size checked before it is read (core.userfile), UTF-8, no NUL."""
    return check_text(f"{flag} {path}", read_text(path, flag))


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise LocalspecError(f"the JSON schema is not JSON: {exc}") from None
    except RecursionError:
        raise LocalspecError("the JSON schema is nested too deeply to read") from None


def structured_config(config: GenerationConfig, *, grammar: Path | None, json_schema: Path | None,
                      logprobs: int | None, prediction: Path | None) -> GenerationConfig:
    """``config`` with the structured-output, logprobs and Predicted Outputs flags."""
    if grammar is not None and json_schema is not None:
        raise LocalspecError("--grammar and --json-schema exclude each other")
    gbnf = _read_text("--grammar", grammar) if grammar is not None else None
    if gbnf is not None:   # bounded before any model loads (llama.cpp crashes or stalls beyond the limits)
        try:
            check_grammar_shape(gbnf)
        except LocalspecError as exc:
            raise LocalspecError(f"--grammar {grammar}: {exc}") from None
    if json_schema is not None:
        text = _read_text("--json-schema", json_schema)   # its errors name the flag and file already
        try:
            gbnf = schema_grammar(_json(text))
        except LocalspecError as exc:
            raise LocalspecError(f"--json-schema {json_schema}: {exc}") from None
    if logprobs is not None:
        logprobs = options.check("top_logprobs", logprobs, where="--logprobs")
    text = _read_text("--prediction", prediction) if prediction is not None else None
    return replace(config, grammar=gbnf, logprobs=logprobs, prediction=text)


def _logprob_json(lp) -> dict:
    return {"token": lp.text, "id": lp.token, "bytes": list(lp.bytes), "logprob": lp.logprob,
            "top_logprobs": [{"token": t.text, "id": t.token, "bytes": list(t.bytes), "logprob": t.logprob}
                             for t in lp.top]}


def build_config(*, no_spec: bool = False, no_special: bool = False, **values) -> GenerationConfig:
    """The configuration from option values by name (flags, after the model's PARAMETERs), through
    the one builder every front end uses (localspec.runtime.generation_options)."""
    return GenerationOptions.from_values(values, spec=not no_spec, parse_special=not no_special).to_config()


def format_stats(stats) -> str:
    line = (f"prompt {stats.prompt_tokens} tok @ {stats.prompt_tokens_per_second:.1f} tok/s | "
            f"generated {stats.generated_tokens} tok @ {stats.tokens_per_second:.1f} tok/s")
    if stats.spec:
        line += (f" | drafted {stats.drafted}, accepted {stats.accepted} "
                 f"({stats.acceptance_rate:.0%}) | {stats.tokens_per_cycle:.2f} tok/cycle")
        if stats.sources:
            line += " | " + ", ".join(f"{name} {a}/{d} accepted" for name, (_, d, a) in sorted(stats.sources.items()))
    return line


@app.command()
@with_options(*GENERATE_OPTIONS)
def generate(
    cli: typer.Context,
    model: Optional[str] = ModelArg,
    prompt: str = typer.Option(..., "--prompt", "-p", help="The user message (or raw text with --raw)."),
    target: Optional[Path] = TargetOpt,
    draft: Optional[Path] = DraftOpt,
    no_spec: bool = NoSpecOpt,
    stop: list[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    system: Optional[str] = typer.Option(None, "--system", help="System prompt."),
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as raw text, without the chat template; "
                                                  "special tokens such as <|im_start|> in it are parsed."),
    no_special: bool = typer.Option(False, "--no-special",
                                    help="With --raw: special-token text stays plain text."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    grammar: Optional[Path] = typer.Option(None, "--grammar", metavar="FILE.gbnf",
                                           help="Constrain the output to a GBNF grammar (root rule 'root')."),
    json_schema: Optional[Path] = typer.Option(None, "--json-schema", metavar="FILE",
                                               help="Constrain the output to JSON that matches this JSON schema."),
    logprobs: Optional[int] = typer.Option(None, "--logprobs", metavar="K",
                                           help="With --json: each token's log-probability and its K (0-20) "
                                                "most probable alternatives."),
    prediction: Optional[Path] = typer.Option(None, "--prediction", metavar="FILE",
                                              help="Predicted Outputs: text the answer is expected to repeat "
                                                   "(the file being edited), used as drafts."),
    vram: Optional[str] = VramOpt,
    verbose: bool = VerboseOpt,
    **flags,
) -> None:
    """Generate a reply to one prompt."""
    resolved = resolve(model, target=target, draft=draft)
    if no_special and not raw:
        raise typer.BadParameter("--no-special applies to --raw prompts only", param_hint="--no-special")
    values = apply_model_defaults(resolved, {**flags, "stop": stop}, is_default(cli))
    check_flags(values)
    ctx, threads, gpu_layers = values.pop("ctx"), values.pop("threads"), values.pop("gpu_layers")
    rows_match = values.pop("rows_match")
    check_text("the prompt", prompt)
    if logprobs is not None and not as_json:
        raise typer.BadParameter("--logprobs prints them in the --json output: add --json", param_hint="--logprobs")
    if system is not None:
        check_text("the system prompt", system)
    config = structured_config(build_config(**values, no_spec=no_spec, no_special=no_special),
                               grammar=grammar, json_schema=json_schema, logprobs=logprobs, prediction=prediction)
    model_spec, engine = open_engine(model, target, draft, ctx=ctx, threads=threads, gpu_layers=gpu_layers, verbose=verbose,
                                     vram=vram, model_spec=resolved, source=values.get("source"),
                                     rows_match=rows_match)
    with engine:
        if config.spec:   # a cached calibration at once, else measured while idle: the reply never waits
            engine.calibrate_in_background()
        request = prompt if raw else _messages(prompt, system, model_spec)
        if not as_json and engine.drafter is None and not no_spec and engine.spec_note is None:
            print(f"note: no drafter for {model_spec.name}: n-gram lookup drafts only", file=sys.stderr)
        elif not as_json and engine.mtp_heads and not no_spec:
            print(f"note: {model_spec.name} drafts with its own MTP heads ({engine.mtp_heads})", file=sys.stderr)
        warmup = _warm_up(engine, config)
        done = None
        for event in engine.generate(request, config):
            if isinstance(event, TokenEvent) and not as_json:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, DoneEvent):
                done = event
        assert done is not None
        _report(done, model_spec, engine, as_json, warmup)
        _finish_calibration(engine)


def _warm_up(engine, config: GenerationConfig) -> float:
    """Seconds of a one-token generation of a one-token prompt, its cache then forgotten: llama.cpp's
    first decode pays one-time costs that would otherwise count as prompt time, so it is paid here,
    as llama.cpp's own tools do (docs/cli.md, "generate")."""
    start = time.perf_counter()
    warm = replace(config, max_tokens=1, stop=(), grammar=None, grammar_triggers=(), logprobs=None, prediction=None)
    tokens = engine.prompt_tokens("\n", parse_special=False)[:2] or [0]   # any token will do
    for _ in engine.generate(tokens, warm):
        pass
    engine.clear_cache()
    return time.perf_counter() - start


def _finish_calibration(engine) -> None:
    """After the reply: a calibration that started, or was paused for it, completes before the
    process ends (bounded; once per machine and model files), so the next run plans with it."""
    if engine.calibrator.busy:
        print("note: measuring this machine's decode costs, once per model (after the reply; "
              "Ctrl-C skips it)", file=sys.stderr)
        engine.calibrator.wait(CALIBRATION_WAIT)
        if engine.calibrator.state == "budget":
            print("note: the machine was too busy for figures worth keeping; measured again next time",
                  file=sys.stderr)


CALIBRATION_WAIT = 60.0   # seconds at most (the calibration's own budget is cost_measure.BUDGET_SECONDS)


def _messages(prompt: str, system: str | None, model_spec) -> list[Message]:
    """The conversation: the system prompt (the flag's, else the Modelfile's SYSTEM), the
    Modelfile's MESSAGEs, then the prompt."""
    system = system if system is not None else model_spec.system
    return (([Message("system", system)] if system else [])
            + [Message(role, content) for role, content in model_spec.messages] + [Message("user", prompt)])


def _report(done: DoneEvent, model_spec, engine, as_json: bool, warmup: float) -> None:
    """The end of a generation: one JSON object, or the statistics line (and notes) on stderr;
    ``warmup``: the seconds of the warm-up before it (not prompt time)."""
    stats = done.stats
    if as_json:
        result = {
            "text": done.text,
            "finish_reason": done.finish_reason,
            "model": model_spec.name,
            "target": str(model_spec.target),
            "drafter": str(model_spec.drafter) if model_spec.drafter and engine.drafter else None,
            "mtp_heads": engine.mtp_heads,   # the target's own draft heads it drafted with (source mtp)
            **stats.to_dict(),
            "warmup_seconds": round(warmup, 4),
            **({"logprobs": [_logprob_json(lp) for lp in done.logprobs]} if done.logprobs is not None else {}),
            "memory": memory_report(engine),  # llama.cpp's buffers vs the memory plan (localspec fit)
        }
        print(jsonout.dumps(result, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        print(f"{format_stats(stats)} | warm-up {warmup:.2f} s", file=sys.stderr)
        if done.finish_reason == "context":
            print("note: stopped at the end of the context window (raise --ctx)", file=sys.stderr)
