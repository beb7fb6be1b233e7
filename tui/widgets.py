"""Widgets of the chat app: messages, the live statistics panel, its histogram."""

from __future__ import annotations

from collections import deque
from typing import Iterable, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Sparkline, Static

from localspec.core.events import GenerationStats

DRAFT_STYLE = "bold black on #8fd19e"
SPARK_SAMPLES = 40
BAR_WIDTH = 10


def describe_finish(finish_reason: str | None, stats: dict | None = None) -> str:
    """The dim line under a reply: why it ended and how fast it ran."""
    parts: list[str] = []
    if stats:
        parts.append(f"{stats.get('n_tokens', 0)} tok")
        tps = stats.get("tokens_per_second")
        if tps:
            parts.append(f"{tps:.1f} tok/s")
        if stats.get("spec") and stats.get("drafted", 1):
            parts.append(f"accepted {stats.get('acceptance_rate', 0):.0%}")
            parts.append(f"{stats.get('tokens_per_cycle', 0):.2f} tok/cycle")
        elif stats.get("spec"):
            parts.append("speculation on, nothing drafted")
        else:
            parts.append("plain")
    notes = {
        None: "interrupted (the app was closed)",
        "cancelled": "cancelled",
        "length": "stopped at max tokens",
        "context": "stopped at the end of the context",
        "error": "failed",
    }
    if finish_reason in notes:
        parts.append(notes[finish_reason])
    return " · ".join(parts)


def render_histogram(accepted: Sequence[int], drafted: Sequence[int], width: int = BAR_WIDTH) -> Text:
    """One bar per draft position: the share of drafts at that depth that the target accepted."""
    text = Text()
    if not drafted or not any(drafted):
        text.append("no drafts yet", style="dim")
        return text
    for i, (a, d) in enumerate(zip(accepted, drafted)):
        rate = a / d if d else 0.0
        eighths = round(rate * width * 8)
        full, part = divmod(eighths, 8)
        bar = "█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")
        if i:
            text.append("\n")
        text.append(f"d{i + 1:<2}", style="bold")
        text.append(bar.ljust(width), style="green")
        text.append(f" {rate:4.0%}")
        text.append(f" {d}", style="dim")
    return text


def render_reply(chunks: Iterable[tuple[str, bool]], highlight: bool) -> Text:
    """A reply as plain text, with the tokens that came from accepted drafts highlighted."""
    text = Text()
    for piece, drafted in chunks:
        text.append(piece, style=DRAFT_STYLE if (highlight and drafted) else "")
    return text


class UserMessage(Static):
    def __init__(self, content: str) -> None:
        super().__init__(Text(content), classes="user-message", markup=False)
        self.message = content


class AssistantMessage(Vertical):
    """A reply: Markdown by default; the highlighted text view when drafted tokens are shown."""

    def __init__(self, content: str = "", *, finish_reason: str | None = "stop", meta: dict | None = None,
                 streaming: bool = False) -> None:
        super().__init__(classes="assistant-message")
        self.chunks: list[tuple[str, bool]] = [(content, False)] if content else []
        if meta and meta.get("drafted_spans") and content:
            self.chunks = spans_to_chunks(content, meta["drafted_spans"])
        self.finish_reason = finish_reason
        self.meta = meta or {}
        self.streaming = streaming
        self.highlight = False
        self.message_id: int | None = None

    @property
    def content(self) -> str:
        return "".join(piece for piece, _ in self.chunks)

    def compose(self) -> ComposeResult:
        yield Markdown(self.content, classes="reply-markdown")
        yield Static("", classes="reply-text")
        yield Static(self._meta_line(), classes="reply-meta")

    def on_mount(self) -> None:
        self._show_mode()

    def _meta_line(self) -> str:
        if self.streaming:
            return "…"
        return describe_finish(self.finish_reason, self.meta.get("stats"))

    def _show_mode(self) -> None:
        md = self.query_one(".reply-markdown", Markdown)
        plain = self.query_one(".reply-text", Static)
        md.display = not self.highlight
        plain.display = self.highlight
        if self.highlight:
            plain.update(render_reply(self.chunks, True))

    def set_highlight(self, on: bool) -> None:
        if on == self.highlight:
            return
        self.highlight = on
        if not on:
            self.query_one(".reply-markdown", Markdown).update(self.content)
        self._show_mode()

    async def add_chunks(self, chunks: list[tuple[str, bool]]) -> None:
        self.chunks.extend(c for c in chunks if c[0])
        if self.highlight:
            self.query_one(".reply-text", Static).update(render_reply(self.chunks, True))
        else:
            new = "".join(piece for piece, _ in chunks)
            if new:
                await self.query_one(".reply-markdown", Markdown).append(new)

    async def finish(self, finish_reason: str | None, meta: dict) -> None:
        self.streaming = False
        self.finish_reason = finish_reason
        self.meta = meta
        if not self.highlight:
            # one full parse at the end: the streamed appends may have split a block
            await self.query_one(".reply-markdown", Markdown).update(self.content)
        self.query_one(".reply-meta", Static).update(self._meta_line())


def chunks_to_spans(chunks: Iterable[tuple[str, bool]]) -> list[list[int]]:
    """Character ranges [start, end) of drafted text, merged, for storage."""
    spans: list[list[int]] = []
    pos = 0
    for piece, drafted in chunks:
        end = pos + len(piece)
        if drafted and piece:
            if spans and spans[-1][1] == pos:
                spans[-1][1] = end
            else:
                spans.append([pos, end])
        pos = end
    return spans


def spans_to_chunks(content: str, spans: Sequence[Sequence[int]]) -> list[tuple[str, bool]]:
    chunks: list[tuple[str, bool]] = []
    pos = 0
    for start, end in spans:
        start, end = max(pos, int(start)), min(len(content), int(end))
        if start >= end:
            continue
        if start > pos:
            chunks.append((content[pos:start], False))
        chunks.append((content[start:end], True))
        pos = end
    if pos < len(content):
        chunks.append((content[pos:], False))
    return chunks


class StatsPanel(Vertical):
    """Live statistics: speed, acceptance, tokens per cycle, a tok/s sparkline, acceptance by depth."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rates: deque[float] = deque(maxlen=SPARK_SAMPLES)
        self._last: tuple[int, float] | None = None
        self.stats: GenerationStats | None = None

    def compose(self) -> ComposeResult:
        yield Static("Live statistics", classes="panel-title")
        yield Static(self._numbers(None), id="stats-numbers")
        yield Static("tok/s, recent", classes="panel-subtitle")
        yield Sparkline([], id="stats-spark")
        yield Static("acceptance by depth", classes="panel-subtitle")
        yield Static(self._histogram(None), id="stats-histogram")

    def _numbers(self, stats: GenerationStats | None) -> Text:
        def row(label: str, value: str) -> Text:
            return Text.assemble((f"{label:<11}", "dim"), value.rjust(11))

        if stats is None:
            rows = [row("speed", "—"), row("tokens", "—"), row("acceptance", "—"), row("tok/cycle", "—"),
                    row("prompt", "—")]
        else:
            spec = stats.spec and stats.drafted > 0
            rows = [
                row("speed", f"{stats.tokens_per_second:.1f} tok/s"),
                row("tokens", str(stats.generated_tokens)),
                row("acceptance", f"{stats.acceptance_rate:.0%}" if spec else "—"),
                row("tok/cycle", f"{stats.tokens_per_cycle:.2f}" if stats.cycles else "—"),
                row("prompt", f"{stats.prompt_tokens} tok"),
            ]
        return Text("\n").join(rows)

    def _histogram(self, stats: GenerationStats | None) -> Text:
        if stats is None:
            return render_histogram([], [])
        if not stats.spec:
            return Text("speculation off", style="dim")
        return render_histogram(stats.accepted_per_position, stats.drafted_per_position)

    def start_reply(self) -> None:
        self._last = None

    def update_stats(self, stats: GenerationStats) -> None:
        """A new snapshot from the engine (running totals of the current reply)."""
        self.stats = stats
        last = self._last
        if last is not None:
            dn = stats.generated_tokens - last[0]
            dt = stats.generation_seconds - last[1]
            if dt > 0.005 and dn >= 0:
                self.rates.append(dn / dt)
        elif stats.generation_seconds > 0.005 and stats.generated_tokens:
            self.rates.append(stats.tokens_per_second)
        self._last = (stats.generated_tokens, stats.generation_seconds)
        self.query_one("#stats-numbers", Static).update(self._numbers(stats))
        self.query_one("#stats-spark", Sparkline).data = list(self.rates)
        self.query_one("#stats-histogram", Static).update(self._histogram(stats))
