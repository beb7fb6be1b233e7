"""What llama.cpp actually allocated for a loaded engine, and how it compares with the memory plan
the engine was built from. Reads the engine (its models, contexts and ``memory_plan``); the engine
never imports this module."""

from __future__ import annotations

from .planner import Part
from .probe import parse_buffers

_KIND_KEY = {"model": "weights_bytes", "kv": "kv_bytes", "compute": "compute_bytes", "output": "output_bytes"}


def rss_bytes() -> int:
    """This process's resident set size (0 where /proc is not there)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def actual_memory(engine) -> dict:
    """llama.cpp's own buffer sizes for the engine's models and contexts (from their load logs):
    per role, weights (model buffers, mapped + repacked), KV and compute, per device."""
    out: dict = {}
    parts = [("target", engine.model, engine.ctx)]
    if engine.drafter is not None:   # MTP heads: weights of the target's model, a context of their own
        model = None if engine.drafter.model is engine.model else engine.drafter.model
        parts.append(("drafter", model, engine.drafter.ctx))
    for role, model, ctx in parts:
        bufs = parse_buffers(getattr(model, "load_log", [])) + parse_buffers(getattr(ctx, "load_log", []))
        entry = {"weights_bytes": 0, "kv_bytes": 0, "compute_bytes": 0, "output_bytes": 0, "buffers": {}}
        for name, kind, n in bufs:
            entry[_KIND_KEY[kind]] += n
            entry["buffers"][f"{name} {kind}"] = entry["buffers"].get(f"{name} {kind}", 0) + n
        entry["total_bytes"] = entry["weights_bytes"] + entry["kv_bytes"] + entry["compute_bytes"] + entry["output_bytes"]
        out[role] = entry
    out["total_bytes"] = sum(v["total_bytes"] for v in out.values() if isinstance(v, dict))
    out["rss_bytes"] = rss_bytes()
    return out


def _planned(p: Part | None) -> dict | None:
    if p is None:
        return None
    return {"weights_bytes": p.weights_bytes + p.repack_bytes, "kv_bytes": p.kv_bytes,
            "compute_bytes": p.compute_bytes, "output_bytes": p.output_bytes,
            "total_bytes": p.total_bytes, "gpu_layers": p.gpu_layers}


def memory_report(engine) -> dict:
    """Planned vs actual (llama.cpp's load-time buffers; the logits buffers grow later and are
    planned): ``{"actual": ..., "planned": ...}``, "planned" only when the engine has a memory plan.
    The ``memory`` field of ``generate --json``."""
    report = {"actual": actual_memory(engine)}
    plan = getattr(engine, "memory_plan", None)
    if plan is not None:
        # "mtp": the target's MTP heads (their weights are in the target's actual model buffers, their
        # context's KV and compute in the actual "drafter")
        report["planned"] = {"target": _planned(plan.target), "drafter": _planned(plan.drafter),
                             "mtp": _planned(getattr(plan, "mtp", None)),
                             "total_bytes": plan.total_bytes, "n_ctx": plan.n_ctx, "kv_type": plan.kv_type,
                             "fits": plan.fits}
    return report
