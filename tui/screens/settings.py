"""The settings screen (F2): the system prompt and generation settings for the next reply."""

from __future__ import annotations

from dataclasses import replace

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from localspec.core import options
from localspec.core.errors import LocalspecError
from localspec.core.options import check_text

from ..settings import ChatSettings

POLICIES = options.OPTIONS["policy"].choices   # the options table's words, as the engine's policy reads them


# the numeric settings in the dialog's order, two to a row: the setting, its label in the dialog, the
# name an error gives it (also checked against the ranges of localspec.core.options), its type
_NUMBERS = (
    ("max_tokens", "Max tokens", "max tokens", int),
    ("temperature", "Temperature", "temperature", float),
    ("top_k", "Top-k", "top-k", int),
    ("top_p", "Top-p", "top-p", float),
    ("min_p", "Min-p", "min-p", float),
    ("repeat_penalty", "Rep. penalty", "repeat penalty", float),
    ("repeat_last_n", "Rep. last-n", "repeat last-n", int),
    ("presence_penalty", "Presence pen.", "presence penalty", float),
    ("frequency_penalty", "Freq. penalty", "frequency penalty", float),
)


def _widget_id(name: str) -> str:
    return "set-" + name.replace("_", "-")


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Edit the system prompt and generation settings; bad values are named, nothing is applied."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, settings: ChatSettings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(classes="dialog", id="settings-dialog"):
            yield Static("Settings (apply to the next reply)", classes="dialog-title")
            yield Label("System prompt")
            yield TextArea(s.system, id="set-system", soft_wrap=True)
            for row in range(0, len(_NUMBERS), 2):  # two to a row
                with Horizontal(classes="field-row"):
                    for name, short, _label, _kind in _NUMBERS[row:row + 2]:
                        yield Label(short, classes="field-label")
                        yield Input(str(getattr(s, name)), id=_widget_id(name), compact=True)
            with Horizontal(classes="field-row"):
                yield Label("Policy", classes="field-label")
                yield Select([(p, p) for p in POLICIES], value=s.policy, allow_blank=False, id="set-policy",
                             compact=True)
                yield Label("Draft max", classes="field-label")
                yield Input(str(s.effective_draft_max), id="set-draft-max", compact=True)
            with Horizontal(classes="field-row"):   # rows_match (docs/speculation.md#exact-mode)
                yield Label("Exact mode", classes="field-label")
                yield Select([("off", False), ("on: greedy text as plain decoding's", True)], value=s.rows_match,
                             allow_blank=False, id="set-rows-match", compact=True)
            yield Static("", id="settings-error")
            with Horizontal(classes="buttons"):
                yield Button("Save", id="save", variant="primary", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def _draft_max(self, number) -> int | None:
        """Left as shown while the settings follow the policy's default: still the policy's default
        (so choosing fixed drafts 4, as everywhere else); any other value is the user's."""
        raw = self.query_one("#set-draft-max", Input).value.strip()
        if self.settings.draft_max is None and raw == str(self.settings.effective_draft_max):
            return None
        return number("#set-draft-max", int, "draft max")

    def _read(self) -> ChatSettings:
        def number(widget_id: str, kind, label: str):
            raw = self.query_one(widget_id, Input).value.strip()
            try:
                return kind(raw)
            except ValueError:
                raise LocalspecError(f"{label}: '{raw}' is not a{'n integer' if kind is int else ' number'}") from None

        s = replace(
            self.settings,   # what the dialog does not show stays as it was
            system=self.query_one("#set-system", TextArea).text.strip(),
            **{name: number(f"#{_widget_id(name)}", kind, label) for name, _short, label, kind in _NUMBERS},
            policy=str(self.query_one("#set-policy", Select).value),
            draft_max=self._draft_max(number),
            rows_match=bool(self.query_one("#set-rows-match", Select).value),
        )
        # the ranges of localspec.core.options, named as the dialog labels them
        for name, label in [(n, label) for n, _short, label, _kind in _NUMBERS] + [("draft_max", "draft max")]:
            opt = options.OPTIONS[name]
            value = getattr(s, name) if name != "draft_max" else s.effective_draft_max
            opt.check(value, where=None if label == (opt.label or opt.name) else label)
        check_text("the system prompt", s.system)
        s.config(True)  # and everything else the configuration checks
        return s

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        try:
            settings = self._read()
        except LocalspecError as exc:
            self.query_one("#settings-error", Static).update(Text(f"Error: {exc}", style="bold red"))
            return
        self.dismiss(settings)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
