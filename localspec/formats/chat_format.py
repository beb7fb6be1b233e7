"""Chat prompts from a Jinja chat template (the target GGUF's, or a Modelfile's TEMPLATE), rendered
in a sandbox with limits.

A template is code from a model file. It renders in jinja2's immutable sandbox, and besides:
- within :data:`RENDER_SECONDS`: a trace function, set on this thread only while rendering, sees
  every line the compiled template runs and stops it past the deadline (so nested loops that print
  nothing are stopped too);
- within an output size (:data:`OUTPUT_CHARS` plus a few times the conversation's own size);
- with ``range()`` capped (jinja2's sandbox caps it at 100,000 items) and ``*`` / ``**`` checked before
  they run (``"x" * 10**10`` or ``9**9**9`` would otherwise allocate or compute in C, beyond reach
  of the deadline).
Every failure, of any exception type, becomes one :class:`LocalspecError` naming the template.
"""

from __future__ import annotations

import datetime
import json
import operator
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterable

from jinja2 import TemplateError, meta
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from ..core.errors import LocalspecError

# Used when a model carries no template (ChatML: the most common convention).
FALLBACK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
RENDER_SECONDS = 2.0          # a template renders in milliseconds; past this it is runaway
OUTPUT_CHARS = 1 << 20        # output allowed besides RENDER_GROWTH x the conversation's size
RENDER_GROWTH = 8
MAX_POWER_BITS = 4096         # ``a ** b`` results of at most this many bits
MAX_REPEAT = 1 << 20          # ``"x" * n`` / ``[..] * n`` results of at most this many items


@dataclass(frozen=True)
class ToolCall:
    """A call an assistant made: the function's name, its arguments as JSON text, the call's id."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()     # an assistant message's calls (see formats.tool_calls)
    tool_call_id: str | None = None           # a tool message: the call it answers
    name: str | None = None                   # a tool message: the tool's name


# Ollama's Go-template actions: {{ .Prompt }}, {{ if .System }}, {{ range .Messages }}, {{ end }}, ...
GO_TEMPLATE = re.compile(r"\{\{-?\s*(?:\.|\$|(?:if|range|with|template|block|define)\s|else\b|end\s*-?\}\})")


class _Runaway(Exception):
    """Raised inside the template's own frames when it runs past its limits."""


def _raise(message: str) -> None:
    raise TemplateError(message)


def _size(x: Any) -> int | None:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else None


class _LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The immutable sandbox with ``*`` and ``**`` checked before they compute."""

    intercepted_binops = frozenset(["*", "**"])

    def call_binop(self, context, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                if right * max(1, abs(left).bit_length()) > MAX_POWER_BITS:
                    raise SecurityError(f"{left} ** {right} is too large")
            return operator.pow(left, right)
        for seq, n in ((left, right), (right, left)):
            if _size(seq) is not None and isinstance(n, int) and _size(seq) * n > MAX_REPEAT:
                raise SecurityError(f"a repetition of {_size(seq) * n} items is too large")
        return operator.mul(left, right)


def _environment() -> _LimitedEnvironment:
    env = _LimitedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(str(fmt))
    return env


def check_template(source: str) -> None:
    """A Modelfile TEMPLATE must be a Jinja chat template (like a GGUF's tokenizer.chat_template)
    that renders ``messages``; LocalspecError (one line) otherwise."""
    if GO_TEMPLATE.search(source):
        raise LocalspecError("TEMPLATE is an Ollama Go template; only Jinja chat templates are supported "
                             "(e.g. {% for message in messages %}...{% endfor %}, as in a GGUF's chat template)")
    try:
        ast = _environment().parse(source)
    except Exception as exc:   # TemplateSyntaxError, or anything the parser trips on
        raise LocalspecError(f"TEMPLATE is not a valid Jinja chat template: {_one_line(exc)}") from None
    if "messages" not in meta.find_undeclared_variables(ast):
        raise LocalspecError("TEMPLATE never uses `messages`: a Jinja chat template renders the conversation "
                             "from messages (e.g. {% for message in messages %}...{% endfor %})")


class ChatFormatter:
    def __init__(self, template: str | None, *, bos_token: str = "", eos_token: str = "",
                 name: str = "the chat template", from_modelfile: bool = False) -> None:
        self.source = template or FALLBACK_TEMPLATE
        self.name = name
        if from_modelfile:  # a TEMPLATE stored before create checked it: the same one-line reason
            check_template(self.source)
        try:
            self._template = _environment().from_string(self.source)
        except Exception as exc:  # TemplateSyntaxError, or anything the compiler trips on
            raise LocalspecError(f"{name} does not parse: {_one_line(exc)}") from None
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: Iterable[Message | dict], *, add_generation_prompt: bool = True) -> str:
        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content} for m in messages]
        return self.render_variables({"messages": msgs}, add_generation_prompt=add_generation_prompt)

    def render_variables(self, variables: dict, *, add_generation_prompt: bool = True) -> str:
        """The template rendered with ``variables`` (``messages`` as dicts, and e.g. ``tools``)."""
        size = len(json.dumps(variables, ensure_ascii=False, default=str))
        limit = OUTPUT_CHARS + RENDER_GROWTH * size
        try:
            return _render_limited(self._template, limit, **variables, add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as exc:   # raise_exception() in the template: its own words
            raise LocalspecError(f"{self.name} rejected the conversation: {_one_line(exc)}") from None
        except _Runaway as exc:
            raise LocalspecError(f"{self.name} {exc}") from None
        except RecursionError:
            raise LocalspecError(f"{self.name} failed: it recursed too deeply") from None
        except Exception as exc:
            raise LocalspecError(f"{self.name} failed: {type(exc).__name__}: {_one_line(exc)}") from None


def _render_limited(template, limit: int, **variables) -> str:
    """``template.render(**variables)`` stopped past :data:`RENDER_SECONDS` or ``limit`` characters."""
    deadline = time.monotonic() + RENDER_SECONDS
    steps = 0

    def local(frame, event, arg):
        nonlocal steps
        steps += 1
        if steps & 255 == 0 and time.monotonic() > deadline:
            raise _Runaway(f"ran for more than {RENDER_SECONDS:g} s (a runaway loop?)")
        return local

    def tracer(frame, event, arg):
        # only the template's compiled code is traced line by line
        return local if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        out, size = [], 0
        for chunk in template.generate(**variables):
            out.append(chunk)
            size += len(chunk)
            if size > limit:
                raise _Runaway(f"wrote more than {limit} characters (a runaway loop?)")
        return "".join(out)
    finally:
        sys.settrace(previous)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")
