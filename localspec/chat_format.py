"""Chat prompts from the Jinja template stored in the target GGUF, rendered in a sandbox."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Iterable

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import LocalspecError

# Used when a model carries no template (ChatML: the most common convention).
FALLBACK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Message:
    role: str
    content: str


def _raise(message: str) -> None:
    raise TemplateError(message)


class ChatFormatter:
    def __init__(self, template: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
        self.source = template or FALLBACK_TEMPLATE
        try:
            self._template = env.from_string(self.source)
        except TemplateError as exc:
            raise LocalspecError(f"the model's chat template does not parse: {exc}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: Iterable[Message | dict], *, add_generation_prompt: bool = True) -> str:
        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
        try:
            return self._template.render(
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as exc:
            raise LocalspecError(f"the chat template rejected the conversation: {exc}") from None
