"""The conversations screen (Ctrl+O): saved chats, newest first; Enter resumes, Del deletes."""

from __future__ import annotations

import time

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from localspec.store.conversations import ConversationStore


class ConversationsScreen(ModalScreen[int | None]):
    """Saved conversations, newest first; Enter resumes one."""

    BINDINGS = [Binding("escape", "cancel", "Close"), Binding("delete", "delete", "Delete")]

    def __init__(self, store: ConversationStore) -> None:
        super().__init__()
        self.store = store

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog", id="conversations-dialog"):
            yield Static("Conversations (Enter resumes, Del deletes, Esc closes)", classes="dialog-title")
            yield OptionList(id="conversation-list")

    def on_mount(self) -> None:
        self._fill()
        self.query_one(OptionList).focus()

    def _fill(self) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        items = self.store.list()
        if not items:
            options.add_option(Option("no saved conversations yet", disabled=True))
            return
        for c in items:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
            label = Text.assemble((f"#{c.id:<4}", "bold"), (f"{when}  ", "dim"), c.title or "(empty)",
                                  (f"  {c.n_messages} msg", "dim"))
            options.add_option(Option(label, id=str(c.id)))

    @on(OptionList.OptionSelected)
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.dismiss(int(event.option.id))

    def action_delete(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return
        option = options.get_option_at_index(options.highlighted)
        if option.id is not None:
            self.store.delete(int(option.id))
            self._fill()

    def action_cancel(self) -> None:
        self.dismiss(None)
