"""GBNF grammars for JSON output, built with what llama-cpp-python ships (``llama_cpp.llama_grammar``:
llama.cpp's JSON grammar and its JSON-schema converter); localspec compiles no schema itself.

:func:`any_json_grammar` is OpenAI's ``json_object`` (any JSON object); :func:`schema_grammar` is
``json_schema``; :func:`wrapped_grammar` puts literal text around one or more schema-shaped values
(a tool call's ``<tool_call>`` ... ``</tool_call>``). A schema the converter refuses, or one
beyond the grammar limits (:mod:`localspec.llama.grammar`), is a :class:`GrammarError` (one line).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from llama_cpp.llama_grammar import JSON_GBNF, SchemaConverter

from ..core.errors import GrammarError, LocalspecError
from ..llama.grammar import GRAMMAR_MAX_DEPTH, check_grammar_shape

# A schema is walked before it is converted: nested deeper than this (JSON levels), or counting
# past what a grammar can count (the converter writes maxLength n as n nested optional groups, an
# enum of n values as n alternatives), it is refused in one line naming the keyword, instead of a
# RecursionError in the converter or a grammar llama.cpp crashes or stalls on.
SCHEMA_MAX_DEPTH = 64
SCHEMA_MAX_VALUES = 1000      # of an enum, anyOf or oneOf (each one alternative)
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def check_schema_bounds(schema: Any) -> None:
    """One :class:`GrammarError` for a schema too deep, or with a count beyond the grammar limits."""
    todo = [(schema, 1)]
    while todo:
        node, depth = todo.pop()
        if depth > SCHEMA_MAX_DEPTH:
            raise GrammarError(f"the JSON schema nests more than {SCHEMA_MAX_DEPTH} levels deep")
        if isinstance(node, list):
            todo.extend((item, depth + 1) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        for key in _COUNTS:
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > GRAMMAR_MAX_DEPTH:
                raise GrammarError(f"{key} {value} is more than the {GRAMMAR_MAX_DEPTH} a grammar can count to")
        for key in ("enum", "anyOf", "oneOf"):
            value = node.get(key)
            if isinstance(value, list) and len(value) > SCHEMA_MAX_VALUES:
                raise GrammarError(f"{key} lists {len(value)} values; at most {SCHEMA_MAX_VALUES} are taken")
        todo.extend((value, depth + 1) for value in node.values())


def any_json_grammar() -> str:
    """Any JSON object (llama.cpp's ``json.gbnf``: its root is an object)."""
    return JSON_GBNF


def _converter(schema: Any) -> SchemaConverter:
    if not isinstance(schema, dict):
        raise GrammarError(f"a JSON schema is an object, got {type(schema).__name__}")
    check_schema_bounds(schema)
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as exc:
        raise GrammarError(f"the JSON schema is not JSON: {exc}") from None
    return converter


def _visit(converter: SchemaConverter, schema: dict, name: str) -> str:
    try:
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "input")
        return converter.visit(resolved, name)
    except LocalspecError:
        raise
    except RecursionError:   # $ref cycles the converter follows
        raise GrammarError("the JSON schema cannot be turned into a grammar: it refers to itself too deeply") from None
    except Exception as exc:   # the converter's own refusals: unsupported keywords, bad $ref...
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise GrammarError(f"the JSON schema cannot be turned into a grammar: {text}") from None


def schema_grammar(schema: dict) -> str:
    """A grammar whose root is a JSON value that validates against ``schema``."""
    converter = _converter(schema)
    _visit(converter, schema, "")
    grammar = converter.format_grammar()
    check_grammar_shape(grammar)
    return grammar


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
        grammar += f"\nroot ::= {one}"
    else:
        grammar += f"\none ::= {one}\nroot ::= one ({literal(separator)} one)*"
    check_grammar_shape(grammar)
    return grammar


def any_of(schemas: Sequence[dict]) -> dict:
    return schemas[0] if len(schemas) == 1 else {"anyOf": list(schemas)}
