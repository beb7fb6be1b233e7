"""llama.cpp's GBNF grammar sampler through llama-cpp-python's ctypes layer: one grammar state.

A :class:`Grammar` wraps one ``llama_sampler`` of llama.cpp's grammar (``llama-grammar.cpp``):
:meth:`~Grammar.allowed` asks whether a token may come next (the sampler's ``apply`` on a
one-entry candidate array), :meth:`~Grammar.mask` sets every forbidden token's logit of a row to
``-inf`` (``apply`` on the whole vocabulary), :meth:`~Grammar.accept` advances the state by one
token, :meth:`~Grammar.clone` copies the state (drafts and verify rows are judged on copies, the
committed state advances only along accepted tokens).

llama.cpp aborts the process when a token the grammar forbids is accepted (an end-of-generation
token where the grammar may not end: ``GGML_ABORT``; any other: a C++ exception through the C
API), so :meth:`~Grammar.accept` checks :meth:`~Grammar.allowed` first and raises instead. A
grammar that does not parse makes llama.cpp return NULL and log why: one :class:`LocalspecError`.

A lazy grammar (``triggers``) constrains nothing until one of the trigger words appears in the
output; from there on the text from the trigger word itself must match the grammar (llama.cpp
replays the trigger into it, as llama-server's tool calls do).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import sys
import tempfile

import llama_cpp
import numpy as np

from ..core.errors import LocalspecError
from .process import capture_log

ROOT = b"root"
# the candidate array llama.cpp reads: llama_token_data {int32 id; float logit; float p}
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# llama.cpp escapes these in trigger words (llama_sampler_init_grammar_lazy); std::regex (ECMAScript)
_SPECIAL = re.compile(r"[.^$|()*+?\[\]{}\\]")


def trigger_pattern(words) -> bytes:
    """The one regular expression llama.cpp builds from trigger words: any text, then one of the
    words (the group the grammar starts from), then anything."""
    return ("[\\s\\S]*?(" + "|".join(_SPECIAL.sub(lambda m: "\\" + m.group(0), w) for w in words)
            + ")[\\s\\S]*").encode("utf-8")


@contextlib.contextmanager
def _native_stderr(lines: list[str]):
    """Collect what native code writes to file descriptor 2 while the block runs (llama.cpp's
    grammar parser prints its errors there with fprintf, not through its log)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", "replace").splitlines())


def _pass_on(lines: list[str]) -> None:
    """Write text caught by :func:`_native_stderr` to the real stderr (it was not the parser's error:
    another thread's, or llama.cpp's own notes)."""
    if lines:
        sys.stderr.write("\n".join(lines) + "\n")


class _Candidates:
    """A reusable llama_token_data_array over a numpy buffer of ``n`` entries."""

    def __init__(self, n: int) -> None:
        self.buf = np.zeros(n, dtype=_TOKEN_DATA)
        self.array = llama_cpp.llama_token_data_array(
            data=self.buf.ctypes.data_as(llama_cpp.llama_token_data_p), size=n, selected=-1, sorted=False)
        self.ref = ctypes.byref(self.array)


class Grammar:
    """One state of a GBNF grammar over a model's vocabulary."""

    def __init__(self, model, text: str, triggers=(), *, _handle=None) -> None:
        self.model = model
        self.text = text
        self.triggers = tuple(triggers)
        self._one = _Candidates(1)
        self._all: _Candidates | None = None
        self._handle = _handle if _handle is not None else self._init()

    def _init(self):
        data = self.text.encode("utf-8")
        if not data.strip():   # llama.cpp takes an empty grammar as none at all
            raise LocalspecError("the grammar is empty")
        if b"\0" in data:
            raise LocalspecError("the grammar contains a NUL character")
        printed: list[str] = []
        with capture_log() as log, _native_stderr(printed):
            if self.triggers:
                pattern = ctypes.c_char_p(trigger_pattern(self.triggers))
                handle = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                    self.model.vocab, data, ROOT, ctypes.pointer(pattern), 1, None, 0)
            else:
                handle = llama_cpp.llama_sampler_init_grammar(self.model.vocab, data, ROOT)
        if handle:
            _pass_on(printed)
        else:
            said = [line.strip() for line in printed if "error" in line]
            said += [line.strip() for line in "".join(log).splitlines() if line.strip()]
            detail = said[0].removeprefix("parse: ") if said else "llama.cpp could not parse it"
            raise LocalspecError(f"the grammar is not valid GBNF (root rule 'root'): {detail}")
        return handle

    def clone(self) -> "Grammar":
        handle = llama_cpp.llama_sampler_clone(self._handle)
        if not handle:
            raise LocalspecError("llama.cpp could not copy the grammar state")
        return Grammar(self.model, self.text, self.triggers, _handle=handle)

    def allowed(self, token: int) -> bool:
        """Whether ``token`` may come next (an end-of-generation token: where the grammar may end)."""
        one = self._one
        one.buf[0] = (token, 0.0, 0.0)
        one.array.size = 1
        llama_cpp.llama_sampler_apply(self._handle, one.ref)
        return bool(np.isfinite(one.buf["logit"][0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of one row of logits with every token the grammar forbids at ``-inf``."""
        n = logits.shape[0]
        cand = self._all
        if cand is None or cand.buf.shape[0] != n:
            cand = self._all = _Candidates(n)
            cand.buf["id"] = np.arange(n, dtype=np.int32)
        cand.buf["logit"] = logits
        cand.array.size = n
        cand.array.selected = -1
        cand.array.sorted = False
        llama_cpp.llama_sampler_apply(self._handle, cand.ref)
        return cand.buf["logit"].copy()

    def allowed_among(self, ids: np.ndarray) -> np.ndarray:
        """The tokens of ``ids`` the grammar allows next (a partial candidate array: cheaper than
        :meth:`mask` over the whole vocabulary)."""
        cand = _Candidates(len(ids))
        cand.buf["id"] = ids
        llama_cpp.llama_sampler_apply(self._handle, cand.ref)
        return ids[np.isfinite(cand.buf["logit"])]

    def accept(self, token: int) -> None:
        """Advance by one token; a token the grammar forbids is an error (llama.cpp would abort)."""
        if not self.allowed(token):
            raise LocalspecError(f"token {token} is not allowed by the grammar here")
        llama_cpp.llama_sampler_accept(self._handle, token)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle:
            llama_cpp.llama_sampler_free(handle)

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass


def json_schema_grammar(schema) -> str:
    """A GBNF grammar for a JSON schema (text or a parsed object) through llama-cpp-python's own
    converter (``llama_cpp.llama_grammar.json_schema_to_gbnf``); a schema it refuses is one error."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise LocalspecError(f"the JSON schema is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise LocalspecError(f"a JSON schema must be an object, got {type(schema).__name__}")
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except (AssertionError, KeyError, ValueError, TypeError, AttributeError, IndexError, RecursionError) as exc:
        raise LocalspecError(f"the JSON schema cannot be turned into a grammar: {exc}") from None
