"""Plain vs speculative decoding on the same prompts, side by side in one run.

Besides the contract pair (plain, and the chosen ``--policy``), ``modes`` runs more ways of decoding
on each prompt back to back: ``auto``, ``chain`` (auto without draft trees), ``fixedK`` (EAGLE
chain of depth K), ``treeK`` (EAGLE draft tree of depth K, see ``speculation.tree``), ``lookup`` (the auto
policy with n-gram lookup drafts only), ``lookupK`` (lookup drafts of depth K, no policy), ``eagle``
(the auto policy with the drafter only) and ``llama-lookup`` (llama-cpp-python's own prompt-lookup
decoding, ``LlamaPromptLookupDecoding`` as the ``draft_model`` of ``llama_cpp.Llama``). With
``repeats`` > 1 every (prompt, mode) runs that many times, interleaved, and the fastest run counts:
other processes on a shared machine only ever add time.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..formats.chat_format import Message
from .engine import Engine, GenerationConfig
from ..core import options
from ..core.errors import LocalspecError
from ..core.userfile import PROMPTS_LIMIT, read_bytes
from ..core.events import DoneEvent, GenerationStats
from ..speculation.policy import PolicyConfig

LLAMA_LOOKUP = "llama-lookup"
DEFAULT_MODES = ("plain", "auto", "chain", "lookup", "lookup8", "fixed1", "fixed2", "fixed3", "fixed4", "fixed6",
                 "fixed8", "tree2", "tree4", "tree6", LLAMA_LOOKUP)


@dataclass
class BenchPrompt:
    prompt: str
    category: str = "default"
    system: str | None = None


@dataclass
class Divergence:
    position: int
    plain_token: int
    spec_token: int
    plain_margin: float   # top-1 minus top-2 logit of plain decoding at that position


@dataclass
class ModeRun:
    """One mode on one prompt: tokens and timings (llama-lookup has no stats of ours)."""

    tokens: list[int]
    seconds: float
    stats: GenerationStats | None = None
    divergence: Divergence | None = None

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PromptResult:
    prompt: BenchPrompt
    plain: DoneEvent
    spec: DoneEvent
    divergence: Divergence | None
    llama_cpp: tuple[int, float] | None = None  # (decode steps, seconds) of llama-cpp-python's Llama
    modes: dict[str, ModeRun] = field(default_factory=dict)

    def to_dict(self) -> dict:
        p, s = self.plain.stats, self.spec.stats
        return {
            "category": self.prompt.category,
            "prompt": self.prompt.prompt[:80],
            "plain_tokens": p.generated_tokens,
            "plain_tokens_per_second": round(p.tokens_per_second, 2),
            "spec_tokens": s.generated_tokens,
            "spec_tokens_per_second": round(s.tokens_per_second, 2),
            "speedup": round(s.tokens_per_second / p.tokens_per_second, 4) if p.tokens_per_second else 0.0,
            "greedy_identical": self.divergence is None,
            "divergence": None if self.divergence is None else vars(self.divergence),
            "drafted": s.drafted,
            "accepted": s.accepted,
            "acceptance_rate": round(s.acceptance_rate, 4),
            "tokens_per_cycle": round(s.tokens_per_cycle, 4),
            "time_split": s.to_dict()["time_split"],
            "sources": s.to_dict()["sources"],
            "policy_choices": dict(s.policy_choices),
            **({"llama_cpp_tokens_per_second": round(self.llama_cpp[0] / self.llama_cpp[1], 2)}
               if self.llama_cpp else {}),
            "modes": {name: self._mode_dict(run) for name, run in self.modes.items()},
        }

    def _mode_dict(self, run: ModeRun) -> dict:
        plain = self.plain.stats.tokens_per_second
        out = {"tokens": len(run.tokens), "tokens_per_second": round(run.tokens_per_second, 2),
               "speedup": round(run.tokens_per_second / plain, 4) if plain else 0.0,
               "greedy_identical": run.divergence is None,
               "divergence": None if run.divergence is None else vars(run.divergence)}
        if run.stats is not None:
            out.update(tokens_per_cycle=round(run.stats.tokens_per_cycle, 4),
                       acceptance_rate=round(run.stats.acceptance_rate, 4),
                       policy_choices=dict(run.stats.policy_choices))
        return out


def _mode_summary(results: list[PromptResult], name: str) -> dict:
    """One mode over all prompts: throughput against plain, time split, and the bound
    tau * V(1) / (V(k+1) + k d) from the run's own measurements (V(1): plain decoding's target
    time per step; V(k+1) and d: this mode's target and drafter time per cycle)."""
    runs = [(r, r.modes[name]) for r in results if name in r.modes]
    if not runs:
        return {}
    toks = sum(len(m.tokens) for _, m in runs)
    secs = sum(m.seconds for _, m in runs)
    p_toks = sum(r.plain.stats.generated_tokens for r, _ in runs)
    p_secs = sum(r.plain.stats.generation_seconds for r, _ in runs)
    tps, p_tps = toks / max(secs, 1e-9), p_toks / max(p_secs, 1e-9)
    out = {"tokens_per_second": round(tps, 2), "speedup": round(tps / p_tps, 4) if p_tps else 0.0,
           "greedy_identical": all(m.divergence is None for _, m in runs),
           "divergences": sum(m.divergence is not None for _, m in runs)}
    stats = [m.stats for _, m in runs if m.stats is not None]
    if len(stats) != len(runs):
        return out
    cycles = sum(s.cycles for s in stats)
    target = sum(s.target_seconds for s in stats)
    drafter = sum(s.drafter_seconds for s in stats)
    python = sum(s.overhead_seconds for s in stats)
    gen = sum(s.generation_seconds for s in stats)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    steps = sum(s.generated_tokens - 1 for s in stats)
    tau = steps / cycles if cycles else 0.0
    p_cycles = sum(r.plain.stats.cycles for r, _ in runs)
    v1 = sum(r.plain.stats.target_seconds for r, _ in runs) / p_cycles if p_cycles else 0.0
    per_cycle = (target + drafter) / cycles if cycles else 0.0
    bound = tau * v1 / per_cycle if per_cycle else 0.0
    by_batch: dict[int, list[float]] = {}
    choices: dict[str, int] = {}
    for s in stats:
        for b, (n, t) in s.verify_by_batch.items():
            e = by_batch.setdefault(b, [0, 0.0])
            e[0] += n
            e[1] += t
        for c, n in s.policy_choices.items():
            choices[c] = choices.get(c, 0) + n
    out.update(
        tokens_per_cycle=round(tau, 4),
        acceptance_rate=round(accepted / drafted, 4) if drafted else 0.0,
        drafted=drafted, accepted=accepted, cycles=cycles,
        time_split={"target": round(target / gen, 4) if gen else 0.0,
                    "drafter": round(drafter / gen, 4) if gen else 0.0,
                    "python": round(python / gen, 4) if gen else 0.0},
        python_ms_per_cycle=round(python / cycles * 1e3, 4) if cycles else 0.0,
        v1_ms=round(v1 * 1e3, 3),
        cycle_ms=round(per_cycle * 1e3, 3),
        verify_ms_by_batch={str(b): round(t / n * 1e3, 3) for b, (n, t) in sorted(by_batch.items())},
        drafter_ms_per_draft=round(drafter / drafted * 1e3, 3) if drafted else None,
        bound=round(bound, 4),
        speedup_over_bound=round((tps / p_tps) / bound, 4) if bound and p_tps else 0.0,
        policy_choices=choices,
    )
    return out


@dataclass
class BenchReport:
    results: list[PromptResult] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)
    spec_mode: str = "auto"
    notes: list[str] = field(default_factory=list)
    calibration: dict | None = None
    interrupted: bool = False   # Ctrl-C: only the prompts in ``results`` finished

    def _sum(self, which: str, attr: str) -> float:
        return sum(getattr(getattr(r, which).stats, attr) for r in self.results)

    def to_dict(self) -> dict:
        plain_tps = self._sum("plain", "generated_tokens") / max(self._sum("plain", "generation_seconds"), 1e-9)
        spec_tps = self._sum("spec", "generated_tokens") / max(self._sum("spec", "generation_seconds"), 1e-9)
        drafted, accepted = self._sum("spec", "drafted"), self._sum("spec", "accepted")
        cycles = self._sum("spec", "cycles")
        spec_secs = self._sum("spec", "generation_seconds")
        return {
            "prompts": len(self.results),
            "plain_tokens_per_second": round(plain_tps, 2),
            "spec_tokens_per_second": round(spec_tps, 2),
            "speedup": round(spec_tps / plain_tps, 4) if plain_tps else 0.0,
            "greedy_identical": all(r.divergence is None for r in self.results),
            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "tokens_per_cycle": round(self._sum("spec", "generated_tokens") / cycles, 4) if cycles else 0.0,
            "python_overhead_share": round(self._sum("spec", "overhead_seconds") / spec_secs, 4) if spec_secs else 0.0,
            "spec_mode": self.spec_mode,
            "modes": {name: _mode_summary(self.results, name) for name in self.modes},
            "categories": self._categories(),
            "per_prompt": [r.to_dict() for r in self.results],
            **({"calibration": self.calibration} if self.calibration else {}),
            **({"notes": self.notes} if self.notes else {}),
            **({"partial": True} if self.interrupted else {}),
            **self._llama_cpp_summary(),
        }

    def _categories(self) -> dict:
        cats: dict[str, list[PromptResult]] = {}
        for r in self.results:
            cats.setdefault(r.prompt.category, []).append(r)
        return {c: {name: _mode_summary(rs, name).get("speedup", 0.0) for name in self.modes if name != "plain"}
                for c, rs in cats.items()}

    def _llama_cpp_summary(self) -> dict:
        """Our plain decoding against llama-cpp-python's Llama on the same prompts and token counts,
        both as decode steps per second (the first token, from the prompt pass, excluded)."""
        runs = [r for r in self.results if r.llama_cpp]
        if not runs:
            return {}
        ours_steps = sum(r.plain.stats.generated_tokens - 1 for r in runs)
        ours_secs = sum(r.plain.stats.generation_seconds for r in runs)
        theirs = sum(r.llama_cpp[0] for r in runs) / sum(r.llama_cpp[1] for r in runs)
        ours = ours_steps / ours_secs
        return {"plain_decode_tokens_per_second": round(ours, 2),
                "llama_cpp_tokens_per_second": round(theirs, 2),
                "plain_vs_llama_cpp": round(ours / theirs, 4)}


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """A JSONL prompt file: one ``{"prompt": str, "category": str?, "system": str?}`` per line."""
    p = Path(path)
    if not p.is_file():
        raise LocalspecError(f"{p}: no such prompts file")
    data = read_bytes(p, "--prompts", PROMPTS_LIMIT)   # its size checked before a byte is read
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LocalspecError(f"{p}: not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})") from None
    prompts = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise LocalspecError(f"{where}: not valid JSON ({getattr(exc, 'msg', 'nested too deeply')})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise LocalspecError(f'{where}: expected an object with a non-empty "prompt" string')
        for key in ("category", "system"):
            if obj.get(key) is not None and not isinstance(obj[key], str):
                raise LocalspecError(f'{where}: "{key}" must be a string, got {type(obj[key]).__name__}')
            if obj.get(key) is not None:
                options.check_text(f'{where}: "{key}"', obj[key])
        options.check_text(f'{where}: "prompt"', obj["prompt"])
        prompts.append(BenchPrompt(obj["prompt"], str(obj.get("category") or "default"), obj.get("system")))
    if not prompts:
        raise LocalspecError(f"{p}: no prompts")
    return prompts


def first_divergence(plain: DoneEvent, tokens: list[int]) -> Divergence | None:
    a, b = plain.tokens, tokens
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            margin = plain.margins[i] if plain.margins and i < len(plain.margins) else float("nan")
            return Divergence(i, a[i], b[i], round(margin, 4))
    if len(a) != len(b):
        i = min(len(a), len(b))
        return Divergence(i, a[i] if i < len(a) else -1, b[i] if i < len(b) else -1, float("nan"))
    return None


def _run(engine: Engine, messages, config: GenerationConfig) -> DoneEvent:
    engine.clear_cache()  # every run prefills its whole prompt: the same KV rows for every mode
    for event in engine.generate(messages, config):
        if isinstance(event, DoneEvent):
            return event
    raise LocalspecError("internal: generation ended without a result")


class LlamaCppBaseline:
    """llama-cpp-python's own high-level API on the same target, greedy, for an outside reference;
    with ``lookup``, its prompt-lookup decoding (``LlamaPromptLookupDecoding`` as draft model).

    Its context leaves flash attention on, as ours does by default ("auto" enables it on CPU)."""

    def __init__(self, engine: Engine, *, lookup: bool = False) -> None:
        import llama_cpp

        kw = {}
        if lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            kw["draft_model"] = LlamaPromptLookupDecoding()
        self.llm = llama_cpp.Llama(str(engine.target_info.path), n_ctx=engine.n_ctx, n_threads=engine.ctx.n_threads,
                                   n_threads_batch=engine.ctx.n_threads, flash_attn=True, verbose=False, **kw)
        self.eos = self.llm.token_eos()

    def run(self, tokens: list[int], n_tokens: int) -> tuple[int, float]:
        """Decode steps and seconds for ``n_tokens`` greedy tokens after the prompt."""
        count, seconds, _ = self.run_tokens(tokens, n_tokens)
        return count - 1, seconds

    def run_tokens(self, tokens: list[int], n_tokens: int) -> tuple[int, float, list[int]]:
        """(tokens produced, seconds after the first, the tokens)."""
        self.llm.reset()
        out: list[int] = []
        t_first = 0.0
        for tok in self.llm.generate(tokens, temp=0.0, top_k=1, reset=True):
            if tok == self.eos:
                break
            out.append(tok)
            if len(out) == 1:
                t_first = time.perf_counter()
            if len(out) >= n_tokens:
                break
        return len(out), time.perf_counter() - t_first, out

    def close(self) -> None:
        self.llm.close()


def mode_config(name: str, base: GenerationConfig) -> GenerationConfig | None:
    """The generation settings of a bench mode (None: llama-lookup, not ours)."""
    if name == LLAMA_LOOKUP:
        return None
    common = dict(max_tokens=base.max_tokens, stop=base.stop)
    dm = base.policy.draft_max
    if name == "plain":
        return GenerationConfig(spec=False, record_margins=True, **common)
    if name in ("auto", "eagle", "lookup", "chain"):
        source = name if name in ("eagle", "lookup") else "auto"
        return GenerationConfig(policy=PolicyConfig("auto", dm, base.policy.p_min, base.policy.probe_every, source,
                                                    tree="off" if name == "chain" else "auto"), **common)
    m = re.fullmatch(r"(fixed|lookup|tree)(\d+)", name)
    if m and 1 <= int(m.group(2)) <= 32:
        source = "lookup" if m.group(1) == "lookup" else "eagle"
        return GenerationConfig(policy=PolicyConfig("fixed", int(m.group(2)), source=source,
                                                    tree="on" if m.group(1) == "tree" else "off"), **common)
    raise LocalspecError(f"unknown bench mode '{name}' (plain, auto, chain, eagle, lookup, fixedK, lookupK, treeK, "
                         f"{LLAMA_LOOKUP})")


def parse_modes(text: str) -> list[str]:
    """``plain,auto,fixed1..8,lookup`` -> names (``fixed1..8`` expands to fixed1 ... fixed8)."""
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"(fixed|lookup|tree)(\d+)\.\.(\d+)", part)
        names = [f"{m.group(1)}{k}" for k in range(int(m.group(2)), int(m.group(3)) + 1)] if m else [part]
        for name in names:
            mode_config(name, GenerationConfig())  # validates
            if name not in out:
                out.append(name)
    return out


def run_bench(engine: Engine, prompts: list[BenchPrompt], base: GenerationConfig,
              progress: Callable[[int, PromptResult], None] | None = None, *,
              llama_baseline: bool = False, modes: list[str] | None = None, repeats: int = 1) -> BenchReport:
    """Greedy plain then speculative decoding (``base.policy``) of each prompt, back to back; each of
    ``modes`` too; and llama-cpp-python's Llama for the same number of tokens, with ``llama_baseline``."""
    spec_mode = base.policy.name if base.policy.source == "auto" else f"{base.policy.name}-{base.policy.source}"
    plain_cfg = mode_config("plain", base)
    spec_cfg = GenerationConfig(max_tokens=base.max_tokens, spec=True, policy=base.policy, stop=base.stop)
    report = BenchReport(spec_mode=spec_mode)
    wanted = list(modes or [])
    configs: dict[str, GenerationConfig | None] = {}
    for name in wanted:
        if name in ("plain", spec_mode):
            continue
        cfg = mode_config(name, base)
        if cfg is not None and engine.drafter is None and cfg.policy.source == "eagle":
            report.notes.append(f"{name}: skipped (no drafter)")
            continue
        configs[name] = cfg
    report.modes = ["plain", spec_mode] + [n for n in configs]
    try:
        _run_prompts(engine, prompts, report, plain_cfg, spec_cfg, configs, progress, llama_baseline, repeats)
    except KeyboardInterrupt:   # Ctrl-C: the report holds the prompts finished so far
        report.interrupted = True
    return report


def _run_prompts(engine: Engine, prompts: list[BenchPrompt], report: BenchReport, plain_cfg: GenerationConfig,
                 spec_cfg: GenerationConfig, configs: dict[str, GenerationConfig | None],
                 progress: Callable[[int, PromptResult], None] | None, llama_baseline: bool, repeats: int) -> None:
    spec_mode = report.spec_mode
    if any(c is not None and c.policy.name == "auto" for c in [spec_cfg, *configs.values()]):
        report.calibration = engine.cost_model().to_dict()
    _run(engine, [Message("user", "Hello")], GenerationConfig(max_tokens=8, spec=True))  # warm-up
    baseline = llama_lookup = None
    try:
        baseline = LlamaCppBaseline(engine) if llama_baseline else None
        llama_lookup = LlamaCppBaseline(engine, lookup=True) if LLAMA_LOOKUP in configs else None
        for i, bp in enumerate(prompts):
            messages = ([Message("system", bp.system)] if bp.system else []) + [Message("user", bp.prompt)]
            best: dict[str, DoneEvent] = {}
            llama_best: tuple[int, float, list[int]] | None = None
            order = ["plain", spec_mode, *configs]
            for _ in range(max(1, repeats)):
                for name in order:
                    if name == LLAMA_LOOKUP:
                        n = best["plain"].stats.generated_tokens
                        got = llama_lookup.run_tokens(engine.prompt_tokens(messages), n)
                        if llama_best is None or got[1] < llama_best[1]:
                            llama_best = got
                        continue
                    cfg = plain_cfg if name == "plain" else spec_cfg if name == spec_mode else configs[name]
                    done = _run(engine, messages, cfg)
                    if name not in best or done.stats.generation_seconds < best[name].stats.generation_seconds:
                        best[name] = done
            plain, spec = best["plain"], best[spec_mode]
            result = PromptResult(bp, plain, spec, first_divergence(plain, spec.tokens))
            for name in order:
                if name == LLAMA_LOOKUP:
                    # timed from its first token (the prompt pass's), as our runs are
                    _, secs, toks = llama_best
                    result.modes[name] = ModeRun(toks, secs, divergence=first_divergence(plain, toks))
                else:
                    d = best[name]
                    result.modes[name] = ModeRun(d.tokens, d.stats.generation_seconds, d.stats,
                                                 first_divergence(plain, d.tokens))
            if baseline is not None and plain.stats.generated_tokens > 1:
                result.llama_cpp = baseline.run(engine.prompt_tokens(messages), plain.stats.generated_tokens)
            report.results.append(result)
            if progress:
                progress(i, result)
    finally:
        for b in (baseline, llama_lookup):
            if b is not None:
                b.close()
