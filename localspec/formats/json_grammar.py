"""GBNF grammars for JSON output, built with what llama-cpp-python ships (``llama_cpp.llama_grammar``:
llama.cpp's JSON grammar and its JSON-schema converter); localspec compiles no schema itself.

:func:`any_json_grammar` is OpenAI's ``json_object`` (any JSON object); :func:`schema_grammar` is
``json_schema``; :func:`wrapped_grammar` puts literal text around one or more schema-shaped values
(a tool call's ``<tool_call>`` ... ``</tool_call>``). A schema the converter refuses is a
:class:`LocalspecError` (one line).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from llama_cpp.llama_grammar import JSON_GBNF, SchemaConverter

from ..core.errors import LocalspecError


def any_json_grammar() -> str:
    """Any JSON object (llama.cpp's ``json.gbnf``: its root is an object)."""
    return JSON_GBNF


def _converter(schema: Any) -> SchemaConverter:
    if not isinstance(schema, dict):
        raise LocalspecError(f"a JSON schema is an object, got {type(schema).__name__}")
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise LocalspecError(f"the JSON schema is not JSON: {exc}") from None
    return converter


def _visit(converter: SchemaConverter, schema: dict, name: str) -> str:
    try:
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "input")
        return converter.visit(resolved, name)
    except LocalspecError:
        raise
    except Exception as exc:   # the converter's own refusals: unsupported keywords, bad $ref...
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise LocalspecError(f"the JSON schema cannot be turned into a grammar: {text}") from None


def schema_grammar(schema: dict) -> str:
    """A grammar whose root is a JSON value that validates against ``schema``."""
    converter = _converter(schema)
    _visit(converter, schema, "")
    return converter.format_grammar()


def literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    return json.dumps(text)   # GBNF literals use JSON's escapes for quotes, backslashes and control characters


def wrapped_grammar(schema: dict, *, prefix: str, suffix: str, separator: str | None) -> str:
    """``prefix value suffix``, repeated with ``separator`` between when not None (parallel calls)."""
    converter = _converter(schema)
    value = _visit(converter, schema, "value")
    one = f"{literal(prefix)} {value} {literal(suffix)}" if prefix or suffix else value
    grammar = converter.format_grammar()
    if separator is None:
        return grammar + f"\nroot ::= {one}"
    return grammar + f"\none ::= {one}\nroot ::= one ({literal(separator)} one)*"


def any_of(schemas: Sequence[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": list(schemas)}
