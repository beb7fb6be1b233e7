r'''Modelfiles: Ollama's model description format, plus ``DRAFT`` and speculative parameters.

Syntax (as Ollama defines it)::

    # a comment: a line whose first non-blank character is '#' ('#' later in a line is text)
    # FROM (required): the target model
    FROM ./Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf
    # DRAFT (localspec): the EAGLE-3 drafter
    DRAFT ./eagle3-llama3.1-8b.gguf
    PARAMETER temperature 0.6
    # stop may be repeated
    PARAMETER stop "<|eot_id|>"
    # speculative parameters: draft_max (depth), draft_policy, draft_tree, draft_p_min, draft_recall
    PARAMETER draft_max 6
    # TEMPLATE: a Jinja chat template, as a GGUF stores one (Ollama's Go templates are refused)
    TEMPLATE """{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}
    {% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"""
    SYSTEM You are a helpful assistant.
    # roles: system, user, assistant
    MESSAGE user Hello
    # LICENSE may be repeated
    LICENSE """..."""

Instructions are case-insensitive. A value is the rest of the line, a ``"double-quoted"`` string
on one line (backslash escapes ``\"`` and ``\\``), or a ``"""triple-quoted"""`` string
that may span lines. ``FROM`` is a target GGUF path, a model name (a created model, a catalog
entry or the embedded default) or a Hugging Face reference; ``DRAFT`` is a drafter GGUF path, a
drafter checkpoint directory (converted on ``create``) or a Hugging Face reference. Relative paths
are relative to the Modelfile's directory.

Every error is a :class:`LocalspecError` reading ``FILE:LINE: what was wrong (what was expected)``.
'''

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..core import options
from ..core.errors import LocalspecError
from ..core.userfile import CONFIG_LIMIT, read_bytes

INSTRUCTIONS = ("FROM", "DRAFT", "PARAMETER", "TEMPLATE", "SYSTEM", "MESSAGE", "LICENSE")
ROLES = ("system", "user", "assistant")
TRUE_WORDS = {"true": True, "false": False}


def _bool(v: str) -> bool:
    try:
        return TRUE_WORDS[v.lower()]
    except KeyError:
        raise ValueError(v) from None


_PARSE: dict[type, Callable[[str], Any]] = {int: lambda v: int(v, 10), float: float, bool: _bool, str: str}
_EXPECT = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


@dataclass(frozen=True)
class Parameter:
    """A Modelfile PARAMETER: its type in the file, the :mod:`localspec.core.options` entry whose
    range checks it (None: its type and ``check`` alone), the ``generate``/``serve``/``chat``
    option it is a default for (None: none, kept as Ollama documents it), the Ollama values that
    mean "automatic" or "no limit" (accepted, leaving localspec's own default in place). localspec's own
    parameters are named ``draft_*`` (:data:`SPEC_PARAMETERS`)."""

    kind: type
    option: str | None = None
    cli: str | None = None
    automatic: tuple = ()
    check: Callable[[Any], bool] | None = None
    rule: str = ""
    repeated: bool = False


def _declared() -> dict[str, Parameter]:
    """The PARAMETERs of the options that declare one (localspec.core.options: name, range,
    automatic values). ``draft_tree`` is true or false in a Modelfile (trees always, or chains only)
    where ``--tree`` takes auto, on or off."""
    out = {}
    for opt in options.OPTIONS.values():
        if opt.parameter == "draft_tree":
            out[opt.parameter] = Parameter(bool, None, opt.cli_name)
        elif opt.parameter:
            out[opt.parameter] = Parameter(opt.kind, opt.name, opt.cli_name, opt.automatic)
    return out


# The one table of PARAMETERs: localspec's options (generated from their declarations), then
# Ollama's documented parameters that localspec accepts and keeps but does not use (yet).
PARAMETERS: dict[str, Parameter] = {
    **_declared(),
    "stop": Parameter(str, None, "stop", check=lambda x: x != "", rule="not empty", repeated=True),
    "num_gpu": Parameter(int, "gpu_layers"),        # the memory plan decides offload; its range only
    "typical_p": Parameter(float, check=lambda x: 0 < x <= 1, rule="in (0, 1]"),
    "mirostat": Parameter(int, check=lambda x: x in (0, 1, 2), rule="0, 1 or 2"),
    "mirostat_eta": Parameter(float),
    "mirostat_tau": Parameter(float),
    "num_keep": Parameter(int, check=lambda x: -1 <= x <= options.INT32_MAX, rule=f"between -1 and {options.INT32_MAX}"),
    "num_batch": Parameter(int, check=lambda x: 1 <= x <= options.INT32_MAX, rule=f"between 1 and {options.INT32_MAX}"),
    "penalize_newline": Parameter(bool),
    "use_mmap": Parameter(bool),
}
SPEC_PARAMETERS = frozenset(name for name in PARAMETERS if name.startswith("draft_"))   # localspec's own
LIST_PARAMETERS = frozenset(name for name, p in PARAMETERS.items() if p.repeated)


def check_parameter(name: str, raw: Any) -> Any:
    """A parameter value converted to its type; ValueError with what was expected otherwise."""
    key = name.lower()
    if key not in PARAMETERS:
        raise ValueError(f"unknown parameter '{name}' (expected one of: {', '.join(sorted(PARAMETERS))})")
    entry = PARAMETERS[key]
    if isinstance(raw, str):
        try:
            value = _PARSE[entry.kind](raw.strip() if entry.kind is not str else raw)
        except ValueError:
            raise ValueError(f"PARAMETER {key} expects {_EXPECT[entry.kind]}, got '{raw}'") from None
    else:  # already typed (models.toml / stored models)
        if entry.kind is float and isinstance(raw, int) and not isinstance(raw, bool):
            raw = float(raw)
        if type(raw) is not entry.kind:
            raise ValueError(f"PARAMETER {key} expects {_EXPECT[entry.kind]}, got {raw!r}")
        value = raw
    shown = raw.strip() if isinstance(raw, str) else repr(value)
    if entry.option is not None:
        if value not in entry.automatic or isinstance(value, bool):
            value, bad = options.OPTIONS[entry.option].problem(value)
            if bad:
                raise ValueError(f"PARAMETER {key} {bad.rsplit(', got ', 1)[0]}, got {shown}")
    elif entry.kind is float and not math.isfinite(value):
        raise ValueError(f"PARAMETER {key} must be a finite number, got {shown}")
    elif entry.kind is str:
        try:
            options.check_text(f"PARAMETER {key}", value)
        except LocalspecError as exc:
            raise ValueError(str(exc)) from None
    if entry.check is not None and not entry.check(value):
        raise ValueError(f"PARAMETER {key} must be {entry.rule}, got {shown}")
    return value


@dataclass
class Modelfile:
    """A parsed Modelfile. Values are as written; :func:`resolve_path` applies ``base_dir``."""

    from_: str
    draft: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)   # stop -> list[str]
    template: str | None = None
    system: str | None = None
    messages: list[tuple[str, str]] = field(default_factory=list)
    license: list[str] = field(default_factory=list)
    # where it came from, for errors and relative paths
    path: str = "Modelfile"
    base_dir: Path | None = None
    lines: dict[str, int] = field(default_factory=dict, compare=False)   # "FROM", "DRAFT", ... -> line

    def error(self, key: str, message: str) -> LocalspecError:
        """A LocalspecError pointing at the line of instruction ``key`` (e.g. "FROM")."""
        line = self.lines.get(key)
        where = f"{self.path}:{line}" if line else self.path
        return LocalspecError(f"{where}: {message}")

    def resolve_path(self, value: str) -> Path:
        p = Path(value).expanduser()
        if not p.is_absolute() and self.base_dir is not None:
            p = self.base_dir / p
        return p.absolute()

    def speculative(self) -> dict[str, Any]:
        return {k: v for k, v in self.parameters.items() if k in SPEC_PARAMETERS}

    def generation(self) -> dict[str, Any]:
        return {k: v for k, v in self.parameters.items() if k not in SPEC_PARAMETERS}


# --------------------------------------------------------------------------------------------
# parsing


class _Lines:
    def __init__(self, text: str, path: str) -> None:
        self.lines = text.splitlines()
        self.path = path

    def fail(self, lineno: int, message: str) -> LocalspecError:
        return LocalspecError(f"{self.path}:{lineno}: {message}")


def _value(src: _Lines, i: int, rest: str, what: str) -> tuple[str, int]:
    """Parse one value starting at ``rest`` (on line index ``i``): (value, index of its last line)."""
    lineno = i + 1
    if rest.startswith('"""'):
        body = rest[3:]
        end = body.find('"""')
        if end >= 0:
            tail = body[end + 3:]
            if tail.strip():
                raise src.fail(lineno, f"unexpected text after the closing \"\"\" of {what}: '{tail.strip()}'")
            return body[:end], i
        parts = [body]
        j = i + 1
        while j < len(src.lines):
            line = src.lines[j]
            end = line.find('"""')
            if end >= 0:
                tail = line[end + 3:]
                if tail.strip():
                    raise src.fail(j + 1, f"unexpected text after the closing \"\"\" of {what}: '{tail.strip()}'")
                parts.append(line[:end])
                return "\n".join(parts), j
            parts.append(line)
            j += 1
        raise src.fail(lineno, f'{what}: unterminated """ string (expected a closing """)')
    if rest.startswith('"'):
        out: list[str] = []
        k = 1
        while k < len(rest):
            c = rest[k]
            if c == "\\" and k + 1 < len(rest) and rest[k + 1] in '"\\':
                out.append(rest[k + 1])
                k += 2
                continue
            if c == '"':
                tail = rest[k + 1:]
                if tail.strip():
                    raise src.fail(lineno, f"unexpected text after the closing quote of {what}: '{tail.strip()}'")
                return "".join(out), i
            out.append(c)
            k += 1
        raise src.fail(lineno, f'{what}: unterminated " string (expected a closing " on the same line)')
    return rest.rstrip(), i


_EXPECTS = {
    "FROM": "a target .gguf path, a model name or an hf.co/OWNER/REPO/FILE.gguf reference",
    "DRAFT": "a drafter .gguf path, a drafter checkpoint directory or an hf.co/OWNER/REPO reference",
    "PARAMETER": "a parameter name and a value",
    "TEMPLATE": "a chat template",
    "SYSTEM": "a system message",
    "MESSAGE": "a role (system, user or assistant) and a message",
    "LICENSE": "license text",
}


def _parameter_or_message(src: _Lines, i: int, kw: str, rest: str, fields: dict[str, Any],
                          lines: dict[str, int]) -> int:
    """``PARAMETER NAME VALUE`` or ``MESSAGE ROLE TEXT`` on line index ``i`` into ``fields``; the
    index of its last line."""
    lineno = i + 1
    m = re.match(r"(\S+)(?:\s+(.*))?$", rest, re.S)
    assert m is not None
    head, tail = m.group(1), (m.group(2) or "")
    if not tail.strip():
        what = f"PARAMETER {head} needs a value" if kw == "PARAMETER" else f"MESSAGE {head} needs a message"
        raise src.fail(lineno, what)
    value, last = _value(src, i, tail, f"{kw} {head}")
    if kw == "MESSAGE":
        role = head.lower()
        if role not in ROLES:
            raise src.fail(lineno, f"MESSAGE role '{head}' is not one of {', '.join(ROLES)}")
        fields["messages"].append((role, value))
        return last
    name = head.lower()
    try:
        typed = check_parameter(name, value)
    except ValueError as exc:
        raise src.fail(lineno, str(exc)) from None
    if name in LIST_PARAMETERS:
        fields["parameters"].setdefault(name, []).append(typed)
        return last
    key = f"PARAMETER {name}"
    if key in lines:
        raise src.fail(lineno, f"PARAMETER {name} given twice (first on line {lines[key]}); "
                               "only stop may be repeated")
    fields["parameters"][name] = typed
    lines[key] = lineno
    return last


def parse(text: str, path: str | Path = "Modelfile", base_dir: Path | None = None) -> Modelfile:
    """Parse Modelfile text. ``path`` names it in errors; ``base_dir`` anchors relative paths."""
    options.check_text(f"{path}", text)
    src = _Lines(text, str(path))
    fields: dict[str, Any] = {"parameters": {}, "messages": [], "license": []}
    lines: dict[str, int] = {}
    i = 0
    while i < len(src.lines):
        raw = src.lines[i]
        stripped = raw.strip()
        lineno = i + 1
        if not stripped or stripped.startswith("#"):
            i += 1
            continue
        m = re.match(r"(\S+)(?:\s+(.*))?$", raw.lstrip(), re.S)
        assert m is not None
        word, rest = m.group(1), (m.group(2) or "")
        kw = word.upper()
        if kw == "ADAPTER":
            raise src.fail(lineno, "ADAPTER (LoRA adapters) is not supported by localspec")
        if kw not in INSTRUCTIONS:
            raise src.fail(lineno, f"unknown instruction '{word}' (expected one of {', '.join(INSTRUCTIONS)})")
        if not rest.strip():
            raise src.fail(lineno, f"{kw} needs {_EXPECTS[kw]}")

        if kw in ("PARAMETER", "MESSAGE"):
            i = _parameter_or_message(src, i, kw, rest, fields, lines) + 1
            continue

        value, last = _value(src, i, rest, kw)
        if kw == "LICENSE":
            fields["license"].append(value)
        else:
            if kw in lines:
                raise src.fail(lineno, f"{kw} given twice (first on line {lines[kw]})")
            if kw in ("FROM", "DRAFT") and not value.strip():
                raise src.fail(lineno, f"{kw} needs {_EXPECTS[kw]}")
            fields["from_" if kw == "FROM" else kw.lower()] = value
            lines[kw] = lineno
        i = last + 1

    if "FROM" not in lines:
        raise LocalspecError(f"{src.path}: FROM is required (no FROM line found; expected {_EXPECTS['FROM']})")
    return Modelfile(path=str(path), base_dir=base_dir, lines=lines, **fields)


def load(path: str | Path) -> Modelfile:
    """Read and parse a Modelfile from disk; relative paths in it are relative to its directory."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "Modelfile"
    if not p.exists():
        raise LocalspecError(f"{p}: no such file")
    data = read_bytes(p, "the Modelfile", CONFIG_LIMIT)   # its size checked before a byte is read
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise LocalspecError(f"{p}: not a text file (expected UTF-8)") from None
    return parse(text, path=p, base_dir=p.absolute().parent)


# --------------------------------------------------------------------------------------------
# writing


def _quote(value: str, what: str) -> str:
    if "\n" in value or "\r" in value:
        if '"""' in value or value.endswith('"'):
            raise LocalspecError(f'{what}: a multi-line value containing """ (or ending in a quote) '
                                 "cannot be written to a Modelfile")
        return f'"""{value}"""'
    if value == "" or value != value.strip() or value.startswith(('"', "#")):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return value


def _format_param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def dumps(mf: Modelfile, header: str | None = None) -> str:
    """Modelfile text that :func:`parse` reads back to an equal :class:`Modelfile`."""
    out: list[str] = []
    if header:
        out += [f"# {line}" if line else "#" for line in header.splitlines()]
    out.append(f"FROM {_quote(mf.from_, 'FROM')}")
    if mf.draft is not None:
        out.append(f"DRAFT {_quote(mf.draft, 'DRAFT')}")
    for name, value in mf.parameters.items():
        for v in value if isinstance(value, list) else [value]:
            text = _format_param(v)
            out.append(f"PARAMETER {name} {_quote(text, f'PARAMETER {name}') if isinstance(v, str) else text}")
    if mf.template is not None:
        out.append(f"TEMPLATE {_quote_block(mf.template, 'TEMPLATE')}")
    if mf.system is not None:
        out.append(f"SYSTEM {_quote_block(mf.system, 'SYSTEM')}")
    for role, content in mf.messages:
        out.append(f"MESSAGE {role} {_quote_block(content, f'MESSAGE {role}')}")
    for text in mf.license:
        out.append(f"LICENSE {_quote_block(text, 'LICENSE')}")
    return "\n".join(out) + "\n"


def _quote_block(value: str, what: str) -> str:
    """Templates, system prompts and messages: raw when safe, else quoted."""
    return _quote(value, what)
