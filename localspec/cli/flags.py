"""The Typer options of the values declared in :mod:`localspec.core.options`: the flag, short flag,
default, help text and choices come from the declaration, so a command's option and the table
cannot disagree.

A command takes a group of them with :func:`with_options` (keyword arguments by the option's
``cli_name``, gathered in ``**values``), or one at a time with :func:`option` as a parameter default.
"""

from __future__ import annotations

import inspect
from enum import Enum
from typing import Any, Callable, Optional

import typer

from ..core.options import OPTIONS, check

_DECLARED = object()   # option(): the declared default


def _choice_enum(name: str, class_name: str) -> type[Enum]:
    """The Typer choice type of a str option: an Enum whose members are its words."""
    return Enum(class_name, [(word, word) for word in OPTIONS[name].choices], type=str, module=__name__)


Policy = _choice_enum("policy", "Policy")
Source = _choice_enum("source", "Source")   # its words; the flag takes a comma list of them too (parsed as text)
Tree = _choice_enum("tree", "Tree")
KvLayout = _choice_enum("kv_layout", "KvLayout")
# options parsed as a choice of words; a ``listed`` one (--source mtp,lookup) is parsed as text and
# checked by the table (check_flags: one clear error naming the flag)
CHOICES: dict[str, type[Enum]] = {"policy": Policy, "tree": Tree, "kv_layout": KvLayout}


def flag_default(name: str, *, chat: bool = False) -> Any:
    """The default a command shows for option ``name``: the declared one (the chat's with ``chat``)."""
    opt = OPTIONS[name]
    return opt.chat_default if chat else opt.default


def option(name: str, *, chat: bool = False, default: Any = _DECLARED, help: str | None = None,
           **more: Any) -> Any:
    """``typer.Option`` for option ``name``: its flags, default (``chat``: the chat's; ``default``: a
    command's own), help text (``help``: a command's own) and, for words, its choices."""
    opt = OPTIONS[name]
    value = flag_default(name, chat=chat) if default is _DECLARED else default
    if value is not None and name in CHOICES:
        value = CHOICES[name](value)
    if value is None:
        more.setdefault("show_default", False)
    decls = [opt.flag] + ([opt.short] if opt.short else [])
    return typer.Option(value, *decls, help=opt.help if help is None else help, **more)


def annotation(name: str) -> Any:
    """The Python type Typer parses option ``name`` as (Optional: None means 'not given')."""
    kind = CHOICES.get(name, OPTIONS[name].kind)
    return Optional[kind]


def with_options(*names: str, chat: bool = False, **overrides: dict) -> Callable:
    """Add the options ``names`` to a Typer command that takes them as ``**values`` (by
    ``cli_name``: ``n_ctx`` arrives as ``ctx``). ``overrides``: :func:`option`'s keyword arguments
    per option, for a command's own default or help (``max_tokens=dict(default=128)``).
    Use below ``@app.command()``."""
    def decorate(command: Callable) -> Callable:
        sig = inspect.signature(command, eval_str=True)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        for name in names:
            info = option(name, chat=chat, **overrides.get(name, {}))
            params.append(inspect.Parameter(OPTIONS[name].cli_name, inspect.Parameter.KEYWORD_ONLY,
                                            default=info, annotation=annotation(name)))
        command.__signature__ = sig.replace(parameters=params)
        return command

    return decorate


def check_flags(values: dict[str, Any]) -> None:
    """Every value of a declared option in ``values`` (keys: ``cli_name``; None: not given) in its
    range; errors name the value and its flag (``top_p must be in (0, 1], got 2 (--top-p)``)."""
    by_cli = {opt.cli_name: opt for opt in OPTIONS.values() if opt.flag}
    for key, value in values.items():
        opt = by_cli.get(key)
        if opt is not None and value is not None:
            check(opt.name, value.value if isinstance(value, Enum) else value, where=opt.flag)


def is_default(cli: typer.Context) -> Callable[[str], bool]:
    """Whether a command's parameter was left at its default (a Modelfile's PARAMETER may fill it)."""
    return lambda name: getattr(cli.get_parameter_source(name), "name", "DEFAULT") == "DEFAULT"
