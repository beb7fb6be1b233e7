"""The one rule for a model's name, matched against the whole string (``re.fullmatch``: a ``$``
would let a trailing newline through). The CLI, the store and both APIs check names with it."""

from __future__ import annotations

import re

from .errors import LocalspecError

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
RULE = ("letters, digits, '.', '_' and '-', starting with a letter or digit, at most 100 characters, "
        "not ending in .gguf")
LATEST = ":latest"   # Ollama's one tag: ``name:latest`` is ``name``


def is_model_name(name: object) -> bool:
    """Whether ``name`` is a valid model name, as a whole."""
    return (isinstance(name, str) and NAME_PATTERN.fullmatch(name) is not None
            and not name.lower().endswith(".gguf"))


def shown(name: object) -> str:
    """``name`` as an error message quotes it: control characters escaped, at most 120 characters."""
    text = name if isinstance(name, str) else repr(name)
    text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 120 else text[:117] + "..."


def check_model_name(name: object, what: str = "model name") -> str:
    """``name`` if it is valid; else one LocalspecError that says the rule."""
    if not is_model_name(name):
        raise LocalspecError(f"invalid {what} '{shown(name)}' ({RULE})")
    return name  # type: ignore[return-value]


def without_latest(name: str) -> str:
    """``name`` without Ollama's ``:latest`` tag."""
    return name[: -len(LATEST)] if name.endswith(LATEST) else name
