"""Plain vs speculative decoding on the same prompts, side by side in one run."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .chat_format import Message
from .engine import Engine, GenerationConfig
from .errors import LocalspecError
from .events import DoneEvent


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
class PromptResult:
    prompt: BenchPrompt
    plain: DoneEvent
    spec: DoneEvent
    divergence: Divergence | None
    llama_cpp: tuple[int, float] | None = None  # (decode steps, seconds) of llama-cpp-python's Llama

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
            **({"llama_cpp_tokens_per_second": round(self.llama_cpp[0] / self.llama_cpp[1], 2)}
               if self.llama_cpp else {}),
        }


@dataclass
class BenchReport:
    results: list[PromptResult] = field(default_factory=list)

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
            "per_prompt": [r.to_dict() for r in self.results],
            **self._llama_cpp_summary(),
        }

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
    p = Path(path)
    if not p.is_file():
        raise LocalspecError(f"{p}: no such prompts file")
    prompts = []
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LocalspecError(f"{p}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise LocalspecError(f'{p}:{lineno}: expected an object with a non-empty "prompt" string')
        prompts.append(BenchPrompt(obj["prompt"], str(obj.get("category", "default")), obj.get("system")))
    if not prompts:
        raise LocalspecError(f"{p}: no prompts")
    return prompts


def _first_divergence(plain: DoneEvent, spec: DoneEvent) -> Divergence | None:
    a, b = plain.tokens, spec.tokens
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            margin = plain.margins[i] if plain.margins and i < len(plain.margins) else float("nan")
            return Divergence(i, a[i], b[i], round(margin, 4))
    if len(a) != len(b):
        i = min(len(a), len(b))
        return Divergence(i, a[i] if i < len(a) else -1, b[i] if i < len(b) else -1, float("nan"))
    return None


def _run(engine: Engine, messages, config: GenerationConfig) -> DoneEvent:
    for event in engine.generate(messages, config):
        if isinstance(event, DoneEvent):
            return event
    raise LocalspecError("internal: generation ended without a result")


class LlamaCppBaseline:
    """llama-cpp-python's own high-level API on the same target, greedy, for an outside reference.

    Its context leaves flash attention on, as ours does by default ("auto" enables it on CPU)."""

    def __init__(self, engine: Engine) -> None:
        import llama_cpp

        self.llm = llama_cpp.Llama(str(engine.target_info.path), n_ctx=engine.n_ctx, n_threads=engine.ctx.n_threads,
                                   n_threads_batch=engine.ctx.n_threads, flash_attn=True, verbose=False)

    def run(self, tokens: list[int], n_tokens: int) -> tuple[int, float]:
        """Decode steps and seconds for ``n_tokens`` greedy tokens after the prompt."""
        self.llm.reset()
        count, t_first = 0, 0.0
        for _ in self.llm.generate(tokens, temp=0.0, top_k=1, reset=True):
            count += 1
            if count == 1:
                t_first = time.perf_counter()
            if count >= n_tokens:
                break
        return count - 1, time.perf_counter() - t_first

    def close(self) -> None:
        self.llm.close()


def run_bench(engine: Engine, prompts: list[BenchPrompt], base: GenerationConfig,
              progress: Callable[[int, PromptResult], None] | None = None, *,
              llama_baseline: bool = False) -> BenchReport:
    """Greedy plain then speculative decoding of each prompt, back to back (and llama-cpp-python's
    Llama for the same number of tokens, with ``llama_baseline``)."""
    if engine.drafter is None:
        raise LocalspecError("bench compares speculative with plain decoding: this model has no drafter (--draft PATH)")
    plain_cfg = GenerationConfig(max_tokens=base.max_tokens, spec=False, record_margins=True, stop=base.stop)
    spec_cfg = GenerationConfig(max_tokens=base.max_tokens, spec=True, policy=base.policy, stop=base.stop)
    _run(engine, [Message("user", "Hello")], GenerationConfig(max_tokens=8, spec=True))  # warm-up
    baseline = LlamaCppBaseline(engine) if llama_baseline else None
    report = BenchReport()
    try:
        for i, bp in enumerate(prompts):
            messages = ([Message("system", bp.system)] if bp.system else []) + [Message("user", bp.prompt)]
            plain = _run(engine, messages, plain_cfg)
            spec = _run(engine, messages, spec_cfg)
            result = PromptResult(bp, plain, spec, _first_divergence(plain, spec))
            if baseline is not None and plain.stats.generated_tokens > 1:
                result.llama_cpp = baseline.run(engine.prompt_tokens(messages), plain.stats.generated_tokens)
            report.results.append(result)
            if progress:
                progress(i, result)
    finally:
        if baseline is not None:
            baseline.close()
    return report
