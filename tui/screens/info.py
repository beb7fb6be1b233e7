"""The info screen (F3): the model pair, drafter variant, policy choices and memory plan."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from localspec.core.units import format_size
from localspec.memory.planner import kv_bytes, layout
from localspec.runtime.engine import Engine


def _plan_rows(plan) -> list[tuple[str, str]]:
    """Rows from a ``localspec.memory`` Plan (what the engine was built from)."""
    rows: list[tuple[str, str]] = []
    for part in (plan.target, plan.drafter, getattr(plan, "mtp", None)):   # mtp: the target's MTP heads
        if part is None:
            continue
        rows.append((part.role, f"{format_size(part.total_bytes)} total, {part.layers_on_gpu()}"))
        rows.append(("  weights", format_size(part.weights_bytes + part.repack_bytes)))
        rows.append((f"  KV ({part.kv_type})", format_size(part.kv_bytes)))
        rows.append(("  compute + output", format_size(part.compute_bytes + part.output_bytes)))
    rows.append(("context", f"{plan.n_ctx} tokens, {plan.kv_type} KV"))
    for dev in plan.devices:
        rows.append((dev.name, f"{format_size(dev.used_bytes)} of {format_size(dev.budget_bytes)}"
                               f"{'' if dev.fits else ' (over budget)'}"))
    if not plan.fits and plan.reason:
        rows.append(("warning", plan.reason))
    return rows


def memory_plan_rows(engine: Engine) -> list[tuple[str, str]]:
    """What the memory panel shows: the ``localspec fit`` plan the engine was built from when it
    has one (``engine.memory_plan``), else file sizes, context and an f16 KV estimate."""
    plan = getattr(engine, "memory_plan", None)
    if plan is not None:
        try:
            return _plan_rows(plan)
        except (AttributeError, TypeError):
            pass  # a plan of another shape: fall back to what the files say
    rows = [("target weights", format_size(engine.target_info.size_bytes))]
    if engine.drafter_info is not None:
        rows.append(("drafter weights", format_size(engine.drafter_info.size_bytes)))
    rows.append(("context", f"{engine.n_ctx} tokens"))
    kv = kv_bytes(layout(engine.target_info), engine.n_ctx, "f16")   # the planner's rule
    if kv is not None:
        rows.append(("target KV (f16, est.)", format_size(kv)))
    if engine.drafter_info is not None:
        dkv = kv_bytes(layout(engine.drafter_info), engine.n_ctx, "f16")
        if dkv is not None:
            rows.append(("drafter KV (f16, est.)", format_size(dkv)))
    rows.append(("plan", "none (engine built without `localspec fit`)"))
    return rows


class InfoScreen(ModalScreen[None]):
    """The model pair, drafter variant, policy choices and memory plan."""

    BINDINGS = [Binding("escape,f3,q", "dismiss", "Close")]

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        text = Text()
        for i, (key, value) in enumerate(self.rows):
            if i:
                text.append("\n")
            if not value:
                text.append(("\n" if i else "") + key, style="bold underline")
                continue
            text.append(f"{key:<22}", style="dim")
            text.append(value)
        with VerticalScroll(classes="dialog", id="info-dialog"):
            yield Static("Model, drafter and memory (Esc closes)", classes="dialog-title")
            yield Static(text, id="info-body")

    def on_mount(self) -> None:
        self.query_one("#info-dialog").focus()      # arrows and PgUp/PgDn scroll it

    def action_dismiss(self) -> None:
        self.dismiss(None)
