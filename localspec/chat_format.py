"""Chat prompts from a Jinja chat template (the target GGUF's, or a Modelfile's TEMPLATE), rendered
in a sandbox."""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Iterable

from jinja2 import TemplateError, meta
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


# Ollama's Go-template actions: {{ .Prompt }}, {{ if .System }}, {{ range .Messages }}, {{ end }}, ...
GO_TEMPLATE = re.compile(r"\{\{-?\s*(?:\.|\$|(?:if|range|with|template|block|define)\s|else\b|end\s*-?\}\})")


def _raise(message: str) -> None:
    raise TemplateError(message)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


def check_template(source: str) -> None:
    """A Modelfile TEMPLATE must be a Jinja chat template (like a GGUF's tokenizer.chat_template)
    that renders ``messages``; LocalspecError (one line) otherwise."""
    if GO_TEMPLATE.search(source):
        raise LocalspecError("TEMPLATE is an Ollama Go template; only Jinja chat templates are supported "
                             "(e.g. {% for message in messages %}...{% endfor %}, as in a GGUF's chat template)")
    try:
        ast = _environment().parse(source)
    except TemplateError as exc:
        raise LocalspecError(f"TEMPLATE is not a valid Jinja chat template: {exc}") from None
    if "messages" not in meta.find_undeclared_variables(ast):
        raise LocalspecError("TEMPLATE never uses `messages`: a Jinja chat template renders the conversation "
                             "from messages (e.g. {% for message in messages %}...{% endfor %})")


class ChatFormatter:
    def __init__(self, template: str | None, *, bos_token: str = "", eos_token: str = "",
                 from_modelfile: bool = False) -> None:
        self.source = template or FALLBACK_TEMPLATE
        if from_modelfile:  # a TEMPLATE stored before create checked it: the same one-line reason
            check_template(self.source)
        try:
            self._template = _environment().from_string(self.source)
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
