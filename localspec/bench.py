"""Plain vs speculative decoding on the same prompts, side by side in one run."""

from __future__ import annotations

import json
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
        }


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


def run_bench(engine: Engine, prompts: list[BenchPrompt], base: GenerationConfig,
              progress: Callable[[int, PromptResult], None] | None = None) -> BenchReport:
    """Greedy plain then speculative decoding of each prompt, back to back."""
    if engine.drafter is None:
        raise LocalspecError("bench compares speculative with plain decoding: this model has no drafter (--draft PATH)")
    plain_cfg = GenerationConfig(max_tokens=base.max_tokens, spec=False, record_margins=True, stop=base.stop)
    spec_cfg = GenerationConfig(max_tokens=base.max_tokens, spec=True, policy=base.policy, stop=base.stop)
    _run(engine, [Message("user", "Hello")], GenerationConfig(max_tokens=8, spec=True))  # warm-up
    report = BenchReport()
    for i, bp in enumerate(prompts):
        messages = ([Message("system", bp.system)] if bp.system else []) + [Message("user", bp.prompt)]
        plain = _run(engine, messages, plain_cfg)
        spec = _run(engine, messages, spec_cfg)
        result = PromptResult(bp, plain, spec, _first_divergence(plain, spec))
        report.results.append(result)
        if progress:
            progress(i, result)
    return report
