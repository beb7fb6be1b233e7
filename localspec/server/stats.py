"""What a finished generation reports on both APIs: the finish-reason table and localspec's
``speculative`` block (what the speculation did for the request), and llama-server's ``timings``."""

from __future__ import annotations

from ..core.events import DoneEvent

# the engine's finish reason -> the one both APIs answer (OpenAI's finish_reason, Ollama's done_reason)
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}


def finish_reason(done: DoneEvent) -> str:
    return FINISH_REASONS.get(done.finish_reason, "stop")


def speculative(done: DoneEvent, drafts: int) -> dict:
    """localspec's own block: drafts made, tokens drafted and accepted, per position and per source."""
    s = done.stats
    return {
        "enabled": s.spec,
        "drafts": drafts,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "acceptance_rate": round(s.acceptance_rate, 4),
        "cycles": s.cycles,
        "tokens_per_cycle": round(s.tokens_per_cycle, 4),
        "accepted_per_position": list(s.accepted_per_position),
        "drafted_per_position": list(s.drafted_per_position),
        "sources": {name: {"drafts": c, "drafted": d, "accepted": a}
                    for name, (c, d, a) in sorted(s.sources.items())},
    }


def timings(done: DoneEvent) -> dict:
    """llama-server's ``timings`` object."""
    s = done.stats
    return {
        "prompt_n": s.prompt_tokens,
        "prompt_ms": round(s.prompt_seconds * 1e3, 3),
        "prompt_per_second": round(s.prompt_tokens_per_second, 2),
        "predicted_n": s.generated_tokens,
        "predicted_ms": round(s.generation_seconds * 1e3, 3),
        "predicted_per_second": round(s.tokens_per_second, 2),
    }
