"""``localspec chat``: a streaming multi-turn chat over the engine's event stream.

The app never imports torch and never calls llama.cpp from the UI thread: the engine is built and
every reply is generated in Textual thread workers. A generation worker posts batched progress
messages (thread-safe ``post_message``) at most every ``FLUSH_SECONDS``, so the UI never blocks
the engine and the engine never blocks the UI. Esc sets the reply's cancel Event; the engine ends
with ``finish_reason="cancelled"`` and stays usable.

Messages are written to the conversation store as they happen (see localspec.store.conversations).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Callable

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message as TMessage
from textual.widgets import Footer, Input, LoadingIndicator, Static

from localspec.core.errors import LocalspecError
from localspec.core.events import CycleEvent, DoneEvent, GenerationStats, TokenEvent
from localspec.formats.chat_format import Message
from localspec.runtime.engine import Engine, GenerationConfig
from localspec.runtime.sampling import SamplingParams
from localspec.store.conversations import Conversation, ConversationStore

from .screens import ConversationsScreen, InfoScreen, SettingsScreen, memory_plan_rows
from .settings import ChatSettings
from .widgets import AssistantMessage, StatsPanel, UserMessage, chunks_to_spans

__all__ = ["ChatApp", "ChatSettings", "ConversationsScreen", "InfoScreen", "LOOKUP_NOTE", "SettingsScreen",
           "memory_plan_rows"]

WELCOME = ("Type a message and press Enter. Esc cancels a reply, Ctrl+T switches speculation, "
           "F2 edits the system prompt and settings, Ctrl+O resumes a saved chat, Ctrl+Q quits.")
FLUSH_SECONDS = 0.05     # batch tokens for the UI at most this often
SAVE_SECONDS = 0.5       # rewrite the streaming reply in the database at most this often
LOOKUP_NOTE = "n-gram lookup only (no drafter)"   # a pair without a drafter still drafts


def _error_text(exc: BaseException) -> str:
    """One line for the UI: our own errors as they are, anything else with its type."""
    if isinstance(exc, LocalspecError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# -- messages from the workers -------------------------------------------------------------------
class EngineLoaded(TMessage):
    def __init__(self, engine: Engine | None, error: str | None = None) -> None:
        super().__init__()
        self.engine = engine
        self.error = error


class ReplyProgress(TMessage):
    def __init__(self, reply: AssistantMessage, chunks: list[tuple[str, bool]], stats: GenerationStats | None) -> None:
        super().__init__()
        self.reply = reply
        self.chunks = chunks
        self.stats = stats


class ReplyDone(TMessage):
    def __init__(self, reply: AssistantMessage, done: DoneEvent | None, error: str | None = None) -> None:
        super().__init__()
        self.reply = reply
        self.done = done
        self.error = error


# -- the app -------------------------------------------------------------------------------------
class ChatApp(App):
    TITLE = "localspec chat"
    ENABLE_COMMAND_PALETTE = False
    CSS_PATH = "app.tcss"

    BINDINGS = [
        Binding("escape", "cancel_reply", "Cancel", priority=True),
        Binding("ctrl+t", "toggle_spec", "Spec", priority=True),
        Binding("ctrl+g", "toggle_highlight", "Drafts", priority=True),
        Binding("ctrl+n", "new_conversation", "New", priority=True),
        Binding("ctrl+o", "conversations", "Chats", priority=True),
        Binding("f2", "settings", "Setup", priority=True),
        Binding("f3", "info", "Info", priority=True),
        Binding("f4", "toggle_stats", "Stats", priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, engine_factory: Callable[[], Engine], *, model_name: str,
                 store: ConversationStore | None = None, settings: ChatSettings | None = None,
                 resume: int | None = None) -> None:
        super().__init__()
        self.engine_factory = engine_factory
        self.model_name = model_name
        self._own_store = store is None
        self.store = store if store is not None else ConversationStore()
        self.settings = settings or ChatSettings()
        self.resume_id = resume
        self.engine: Engine | None = None
        self.load_error: str | None = None
        self.conversation_id: int | None = None
        self.history: list[Message] = []        # user/assistant turns sent to the model
        self.spec_enabled = True
        self.highlight = False
        self.generating = False
        self.replies_done = 0                   # tests wait on this
        self._cancel: threading.Event | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._closing = False
        self._current: AssistantMessage | None = None
        self._last_save = 0.0

    # -- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        with Horizontal(id="main"):
            with VerticalScroll(id="chat"):
                yield LoadingIndicator(id="loading")
            yield StatsPanel(id="stats")
        yield Input(placeholder="Loading the model…", id="prompt", disabled=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if self.resume_id is not None:
            try:
                self._show_conversation(self.store.load(self.resume_id))
            except LocalspecError as exc:
                self._note(f"Error: {exc}", error=True)
        else:
            self._note(WELCOME)
        self._refresh_status()
        self._load_engine()

    # -- status line -----------------------------------------------------------------------------
    @property
    def has_drafter(self) -> bool:
        return self.engine is not None and self.engine.drafter is not None

    def status_text(self) -> Text:
        text = Text.assemble((f" {self.model_name} ", "bold"))
        if self.load_error:
            text.append("· model failed to load", style="bold red")
        elif self.engine is None:
            text.append("· loading…", style="yellow")
        elif self.spec_enabled:
            text.append("· speculation ON", style="bold green")
            if not self.has_drafter:
                text.append(f" · {LOOKUP_NOTE}", style="yellow")
        else:
            text.append("· speculation OFF", style="bold red")
        if self.highlight:
            text.append(" · drafts highlighted", style="green")
        if self.conversation_id is not None:
            text.append(f" · chat #{self.conversation_id}", style="dim")
        if self.generating:
            text.append(" · generating (Esc cancels)", style="italic")
        calibrator = getattr(self.engine, "calibrator", None)   # last: it comes and goes (runtime.calibrator)
        if self.spec_enabled and calibrator is not None and (calibrator.busy or calibrator.state == "failed"):
            text.append(f" · {calibrator.describe()}", style="yellow")
        return text

    def _refresh_status(self) -> None:
        self.query_one("#status", Static).update(self.status_text())
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "cancel_reply" and (not self.generating or len(self.screen_stack) > 1):
            # Esc then reaches the dialogs and inputs that use it
            return False
        return True

    # -- engine loading --------------------------------------------------------------------------
    @work(thread=True, group="load", exit_on_error=False)
    def _load_engine(self) -> None:
        try:
            engine = self.engine_factory()
        except BaseException as exc:  # noqa: BLE001 - shown in the UI, never as a traceback
            self.post_message(EngineLoaded(None, _error_text(exc)))
            return
        if self._closing:
            engine.close()
            return
        self.post_message(EngineLoaded(engine))

    def on_engine_loaded(self, message: EngineLoaded) -> None:
        for widget in self.query("#loading"):
            widget.remove()
        prompt = self.query_one("#prompt", Input)
        if message.engine is None:
            self.load_error = message.error
            self._note(f"Error: the model did not load: {message.error}", error=True)
            prompt.placeholder = "The model did not load (Ctrl+Q quits)"
            self._refresh_status()
            return
        self.engine = message.engine
        note = getattr(getattr(self.engine, "memory_plan", None), "context_note", None)
        if note:   # the memory plan used a smaller context than asked for
            self._note(f"Note: {note}")
        prompt.disabled = False
        prompt.placeholder = "Message (Enter sends)"
        prompt.focus()
        self._calibrate()
        self._refresh_status()

    def _calibrate(self) -> None:
        """The cost model measured in the background (a reply never waits for it), its state on
        the status line."""
        calibrator = getattr(self.engine, "calibrator", None)
        if calibrator is None:
            return

        def changed(_state: str) -> None:
            if self._closing:
                return
            try:
                self.call_from_thread(self._refresh_status)
            except RuntimeError:   # on the app's own thread
                self._refresh_status()
        calibrator.listeners.append(changed)
        self.engine.calibrate_in_background()

    # -- conversation display --------------------------------------------------------------------
    def _note(self, text: str, *, error: bool = False) -> None:
        chat = self.query_one("#chat", VerticalScroll)
        chat.mount(Static(Text(text, style="bold red" if error else "dim"),
                          classes="note error-note" if error else "note"))
        chat.scroll_end(animate=False)

    def _clear_chat(self) -> None:
        chat = self.query_one("#chat", VerticalScroll)
        for child in list(chat.children):
            if child.id != "loading":
                child.remove()

    def _show_conversation(self, conv: Conversation) -> None:
        self._clear_chat()
        self.conversation_id = conv.id
        self.settings = replace(self.settings, system=conv.system)
        self.history = []
        chat = self.query_one("#chat", VerticalScroll)
        widgets = []
        for m in conv.messages:
            if m.role == "user":
                widgets.append(UserMessage(m.content))
            else:
                widgets.append(AssistantMessage(m.content, finish_reason=m.finish_reason, meta=m.meta))
            if m.content or m.role == "user":
                self.history.append(Message(m.role, m.content))
        if widgets:
            chat.mount_all(widgets)
        if not conv.messages:
            self._note(f"Conversation #{conv.id} is empty.")
        chat.scroll_end(animate=False)

    # -- sending ---------------------------------------------------------------------------------
    @on(Input.Submitted, "#prompt")
    def _submitted(self, event: Input.Submitted) -> None:
        self.send(event.value)

    def send(self, text: str) -> bool:
        text = text.strip()
        if not text:
            return False
        if self.engine is None:
            self.notify("The model is not loaded." if self.load_error else "The model is still loading.",
                        severity="warning")
            return False
        if self.generating:
            self.notify("A reply is being generated: Esc cancels it.", severity="warning")
            return False
        try:
            config = self.settings.config(self.spec_enabled)
            if self.conversation_id is None:
                self.conversation_id = self.store.create(model=self.model_name, system=self.settings.system)
            self.store.add_message(self.conversation_id, "user", text)
            reply = AssistantMessage(streaming=True)
            reply.message_id = self.store.add_message(self.conversation_id, "assistant", "", finish_reason=None)
        except LocalspecError as exc:
            self._note(f"Error: {exc}", error=True)
            return False
        self.query_one("#prompt", Input).value = ""
        self.history.append(Message("user", text))
        chat = self.query_one("#chat", VerticalScroll)
        chat.mount_all([UserMessage(text), reply])
        reply.highlight = self.highlight
        chat.scroll_end(animate=False)
        messages = ([Message("system", self.settings.system)] if self.settings.system else []) + list(self.history)
        self._cancel = threading.Event()
        self._current = reply
        self.generating = True
        self._idle.clear()
        self._last_save = time.monotonic()
        self.query_one(StatsPanel).start_reply()
        self._refresh_status()
        self._generate(messages, config, self._cancel, reply)
        return True

    def _fit_history(self, messages: list[Message], config: GenerationConfig) -> list[Message]:
        """Drop the oldest turns until the prompt and the reply fit in the context."""
        engine = self.engine
        assert engine is not None
        system = [m for m in messages if m.role == "system"]
        turns = [m for m in messages if m.role != "system"]
        while len(turns) > 1:
            n = len(engine.prompt_tokens(system + turns))
            if n + min(config.max_tokens, 64) < engine.n_ctx:
                break
            turns = turns[2:] if len(turns) > 2 else turns[1:]
        return system + turns

    @work(thread=True, group="generate", exit_on_error=False)
    def _generate(self, messages: list[Message], config: GenerationConfig, cancel: threading.Event,
                  reply: AssistantMessage) -> None:
        engine = self.engine
        chunks: list[tuple[str, bool]] = []
        stats: GenerationStats | None = None
        done: DoneEvent | None = None
        last_flush = time.monotonic()
        try:
            assert engine is not None
            messages = self._fit_history(messages, config)
            for event in engine.generate(messages, config, cancel=cancel):
                if isinstance(event, TokenEvent):
                    if event.text:
                        chunks.append((event.text, event.from_draft))
                elif isinstance(event, CycleEvent):
                    stats = event.stats
                elif isinstance(event, DoneEvent):
                    done = event
                now = time.monotonic()
                if now - last_flush >= FLUSH_SECONDS and (chunks or stats is not None):
                    self.post_message(ReplyProgress(reply, chunks, stats))
                    chunks, stats, last_flush = [], None, now
            if chunks or stats is not None:
                self.post_message(ReplyProgress(reply, chunks, stats))
            self.post_message(ReplyDone(reply, done))
        except BaseException as exc:  # noqa: BLE001 - shown in the UI, never as a traceback
            if chunks or stats is not None:
                self.post_message(ReplyProgress(reply, chunks, stats))
            self.post_message(ReplyDone(reply, None, _error_text(exc)))
        finally:
            self._idle.set()

    async def on_reply_progress(self, message: ReplyProgress) -> None:
        reply = message.reply
        if message.chunks:
            await reply.add_chunks(message.chunks)
        if message.stats is not None:
            self.query_one(StatsPanel).update_stats(message.stats)
        self.query_one("#chat", VerticalScroll).scroll_end(animate=False)
        now = time.monotonic()
        if reply.message_id is not None and now - self._last_save >= SAVE_SECONDS:
            self._last_save = now
            self._save(reply, None)

    def _save(self, reply: AssistantMessage, finish_reason: str | None, meta: dict | None = None) -> None:
        try:
            self.store.update_message(reply.message_id, reply.content, finish_reason=finish_reason, meta=meta)
        except LocalspecError as exc:
            self.notify(str(exc), severity="error")

    async def on_reply_done(self, message: ReplyDone) -> None:
        reply, done = message.reply, message.done
        if done is not None:
            finish = done.finish_reason
            self.query_one(StatsPanel).update_stats(done.stats)
            meta = {"stats": done.stats.to_dict(), "drafted_spans": chunks_to_spans(reply.chunks)}
        else:
            finish = "error"
            meta = {"error": message.error}
        await reply.finish(finish, meta)
        if reply.message_id is not None:
            self._save(reply, finish, meta)
        if reply.content:
            self.history.append(Message("assistant", reply.content))
        if message.error:
            self._note(f"Error: {message.error}", error=True)
        self.generating = False
        self._cancel = None
        self._current = None
        self.replies_done += 1
        self._refresh_status()
        self.query_one("#chat", VerticalScroll).scroll_end(animate=False)

    # -- actions ---------------------------------------------------------------------------------
    def action_cancel_reply(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.notify("Cancelling the reply…", timeout=2)

    def action_toggle_spec(self) -> None:
        self.spec_enabled = not self.spec_enabled
        state = "on" if self.spec_enabled else "off"
        self.notify(f"Speculation {state} from the next reply.", timeout=2)
        self._refresh_status()

    def action_toggle_highlight(self) -> None:
        self.highlight = not self.highlight
        for reply in self.query(AssistantMessage):
            reply.set_highlight(self.highlight)
        self._refresh_status()

    def action_toggle_stats(self) -> None:
        panel = self.query_one(StatsPanel)
        panel.display = not panel.display

    def action_new_conversation(self) -> None:
        if self.generating:
            self.notify("Wait for the reply or cancel it (Esc) first.", severity="warning")
            return
        self._clear_chat()
        self.conversation_id = None
        self.history = []
        self._note("New conversation.")
        self._refresh_status()

    def action_conversations(self) -> None:
        if self.generating:
            self.notify("Wait for the reply or cancel it (Esc) first.", severity="warning")
            return
        self.push_screen(ConversationsScreen(self.store), self._resume)

    def _resume(self, conversation_id: int | None) -> None:
        if conversation_id is None:
            return
        try:
            self._show_conversation(self.store.load(conversation_id))
        except LocalspecError as exc:
            self._note(f"Error: {exc}", error=True)
        self._refresh_status()

    def action_settings(self) -> None:
        self.push_screen(SettingsScreen(self.settings), self._apply_settings)

    def _apply_settings(self, settings: ChatSettings | None) -> None:
        if settings is None:
            return
        changed_system = settings.system != self.settings.system
        self.settings = settings
        if changed_system and self.conversation_id is not None:
            try:
                self.store.set_system(self.conversation_id, settings.system)
            except LocalspecError as exc:
                self.notify(str(exc), severity="error")
        self.notify("Settings saved for the next reply.", timeout=2)

    def info_rows(self) -> list[tuple[str, str]]:
        rows: list[tuple[str, str]] = [("Models", "")]
        engine = self.engine
        if engine is None or self.model_name != engine.target_info.path.name:
            rows.append(("model", self.model_name))
        if engine is None:
            rows.append(("state", "failed to load" if self.load_error else "loading…"))
            return rows
        t = engine.target_info
        rows.append(("target", f"{t.path.name}"))
        rows.append(("  arch / layers", f"{t.arch}, {t.n_layer} blocks, {t.weight_type}"))
        d = engine.drafter_info
        if engine.drafter is not None and getattr(engine, "mtp_heads", 0):
            rows.append(("drafter", f"the target's own MTP heads ({engine.mtp_heads}): source mtp"))
        elif d is None or engine.drafter is None:
            rows.append(("drafter", f"none: {LOOKUP_NOTE}"))
        elif d.is_assistant:   # Gemma 4's assistant: reads the target's KV cache
            rows.append(("drafter", f"{d.path.name}: Gemma 4's assistant, source assistant"))
            rows.append(("  layers / width", f"{d.n_layer} blocks, {d.n_embd} wide, no KV cache of its own"))
        elif d.is_block_drafter:   # DFlash / DSpark: a block of drafts per drafter decode
            rows.append(("drafter", f"{d.path.name}: {d.block_kind} block drafter, source {d.block_kind}"))
            rows.append(("  block / target layers", f"{engine.drafter.max_depth} drafts, layers "
                                                    + ", ".join(str(x) for x in (d.target_layers or ()))))
        else:
            rows.append(("drafter", d.path.name))
            rows.append(("  variant", str(d.variant or "eagle3")))
            rows.append(("  target layers", ", ".join(str(x) for x in (d.target_layers or ()))))
            if d.draft_vocab:
                rows.append(("  draft vocab", str(d.draft_vocab)))
        rows.append(("Policy", ""))
        rows.append(("speculation", "on" if self.spec_enabled else "off"))
        rows.append(("policy", f"{self.settings.policy}, draft max {self.settings.effective_draft_max}"))
        rows.append(("exact mode", "on (rows_match)" if self.settings.rows_match else "off"))
        rows.append(("sampling", f"temperature {self.settings.temperature:g}, top-k {self.settings.top_k}, "
                                 f"top-p {self.settings.top_p:g}"))
        s = self.settings
        penalties = SamplingParams(repeat_penalty=s.repeat_penalty, repeat_last_n=s.repeat_last_n,
                                   presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty)
        named = [f"{name} {value:g}" for name, value, off in (("repeat", s.repeat_penalty, 1.0),
                                                              ("presence", s.presence_penalty, 0.0),
                                                              ("frequency", s.frequency_penalty, 0.0)) if value != off]
        window = "all tokens" if s.repeat_last_n < 0 else f"last {s.repeat_last_n} tokens"
        rows.append(("penalties", f"{', '.join(named)} ({window})" if penalties.penalized else "off"))
        rows.append(("max tokens", str(self.settings.max_tokens)))
        rows.append(("Memory", ""))
        rows.extend(memory_plan_rows(engine))
        return rows

    def action_info(self) -> None:
        self.push_screen(InfoScreen(self.info_rows()))

    # -- shutdown --------------------------------------------------------------------------------
    def on_unmount(self) -> None:
        self._closing = True
        if self._cancel is not None:
            self._cancel.set()
        # the generate loop checks the cancel Event every cycle (and between calibration decodes);
        # wait for it before closing
        idle = self._idle.wait(timeout=30)
        reply = self._current
        if reply is not None and reply.message_id is not None:
            self._save(reply, "cancelled")   # quit mid-reply: keep what was shown
        if self.engine is not None:
            if idle:
                self.engine.close()
            # else a decode is still running in the worker (a very slow machine): freeing the model
            # under it would crash the process; the worker holds the engine, freed when it ends
            self.engine = None
        if self._own_store:
            self.store.close()
