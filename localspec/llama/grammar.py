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
replays the trigger into it, as llama-server's tool calls do). While it waits, llama.cpp's
``apply`` allows every token, and a token that completes a trigger followed by text the grammar
refuses would make its ``accept`` throw (an abort here): :class:`_Trigger` mirrors the trigger
search in Python and checks such a token's text against the same grammar, not lazy, first.
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

from ..core.errors import GrammarError, LocalspecError
from .process import capture_log

ROOT = b"root"

# What llama.cpp's grammar code takes without crashing or stalling (bench/grammar_limits.py on the
# pinned llama.cpp; the figures: docs/server.md, "Limits"): its parser recurses once per nested
# group (too deep: a segfault), its rule checks take time quadratic in a chain of rules, and every
# choice open at a position multiplies the cost of each token's mask. Checked on the text before
# llama.cpp sees it (check_grammar_shape), for the CLI's --grammar and --json-schema and the
# server's response_format and tools alike.
GRAMMAR_MAX_BYTES = 1 << 20           # 1 MiB of GBNF
GRAMMAR_MAX_DEPTH = 1000              # groups nested in groups
GRAMMAR_MAX_RULES = 1000              # rules (a chain of rules is as deep as their count)
GRAMMAR_MAX_CHOICES = 1000            # alternatives ('|') and optional or repeated items ('?', '*', '+')
#                                       side by side in one rule or group
GRAMMAR_MAX_REPEATS = 10000           # the counts of bounded repetitions ({m,n}: the larger), summed
# the tokens of GBNF text that count: a string, a character class, a comment (skipped whole, so what
# is inside them does not count), a group's parentheses, a choice, a repetition, a rule's '::='
_SHAPE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*|[()|?*+]|\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}|::=',
                    re.S)
# the candidate array llama.cpp reads: llama_token_data {int32 id; float logit; float p}
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
# llama.cpp escapes these in trigger words (llama_sampler_init_grammar_lazy); std::regex (ECMAScript)
_SPECIAL = re.compile(r"[.^$|()*+?\[\]{}\\]")


def check_grammar_shape(text: str) -> None:
    """Refuse GBNF text beyond what llama.cpp's grammar code takes (see GRAMMAR_MAX_*): one
    :class:`GrammarError` saying which bound, before llama.cpp parses a byte of it."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > GRAMMAR_MAX_BYTES:
        raise GrammarError(f"the grammar is {size} bytes long; at most {GRAMMAR_MAX_BYTES} are taken")
    depth = deepest = rules = widest = repeats = 0
    siblings = [0]   # choices side by side in each open group (nested ones cost little: one stack each)
    for m in _SHAPE.finditer(text):
        token = m.group()
        if token == "(":
            depth += 1
            deepest = max(deepest, depth)
            siblings.append(0)
        elif token == ")":
            depth = max(0, depth - 1)
            if len(siblings) > 1:
                siblings.pop()
        elif token in "|?*+":
            siblings[-1] += 1
            widest = max(widest, siblings[-1])
        elif token == "::=":
            rules += 1
            siblings = [0]
        elif token[0] == "{":
            repeats += max(int(m.group(1)), int(m.group(2) or 0))
    for count, limit, what in ((deepest, GRAMMAR_MAX_DEPTH, "nests groups {} deep"),
                               (rules, GRAMMAR_MAX_RULES, "has {} rules"),
                               (widest, GRAMMAR_MAX_CHOICES, "offers {} alternatives or optional items side by side"),
                               (repeats, GRAMMAR_MAX_REPEATS, "repeats items {} times in all ({{m,n}})")):
        if count > limit:
            raise GrammarError(f"the grammar {what.format(count)}; at most {limit} are taken "
                               "(llama.cpp's grammar code crashes or stalls on more)")


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


def _grammar_pieces(model) -> list[bytes]:
    """Every token's text with special tokens spelled out (llama_vocab::token_to_piece, which the
    grammar's trigger buffer is made of)."""
    return model.pieces(special=True)


def _tokenize_bytes(model, data: bytes) -> list[int]:
    capacity = len(data) + 8
    out = (llama_cpp.llama_token * capacity)()
    n = llama_cpp.llama_tokenize(model.vocab, data, len(data), out, capacity, False, False)
    return list(out[:max(n, 0)])


class _Trigger:
    """A lazy grammar's trigger words, searched as llama.cpp searches its trigger buffer (the
    leftmost occurrence of any word, in bytes), and the same grammar, not lazy, that the text from
    the trigger on must match."""

    def __init__(self, model, text: str, words) -> None:
        self.model = model
        encoded = [w.encode("utf-8") for w in words]
        self.regex = re.compile(b"|".join(re.escape(w) for w in encoded))
        self.keep = max(len(w) for w in encoded) - 1    # buffer bytes a new occurrence may start in
        self.pieces = _grammar_pieces(model)
        lasts = {w[-1:] for w in encoded}                # a token completing a word holds its last byte
        self.maybe = np.flatnonzero([any(b in p for b in lasts) for p in self.pieces])
        self._may = set(self.maybe.tolist())
        self.strict = Grammar(model, text)

    def start(self, buffer: bytes, token: int) -> tuple[bytes, int | None]:
        """(buffer and the token's text, where a trigger starts in it, if one does)."""
        data = buffer + self.pieces[token]
        found = self.regex.search(data)
        return data, (found.start() if found else None)

    def allows(self, buffer: bytes, token: int) -> bool:
        """Whether accepting ``token`` while waiting is safe: no trigger, or text the grammar may start with."""
        if token not in self._may:
            return True
        data, at = self.start(buffer, token)
        if at is None:
            return True
        state = self.strict.clone()
        try:
            for tok in _tokenize_bytes(self.model, data[at:]):
                if not state.allowed(tok):
                    return False
                state.accept(tok)
            return True
        finally:
            state.close()


class Grammar:
    """One state of a GBNF grammar over a model's vocabulary."""

    def __init__(self, model, text: str, triggers=(), *, _handle=None, _trigger=None,
                 _waiting: bytes | None = None) -> None:
        self.model = model
        self.text = text
        self.triggers = tuple(triggers)
        self._one = _Candidates(1)
        self._all: _Candidates | None = None
        self._handle = _handle if _handle is not None else self._init()
        if _handle is None and self.triggers:
            _trigger, _waiting = _Trigger(model, text, self.triggers), b""
        self._trigger = _trigger
        self._waiting = _waiting    # while a lazy grammar waits for its trigger: the output's last bytes

    def _init(self):
        data = self.text.encode("utf-8")
        if not data.strip():   # llama.cpp takes an empty grammar as none at all
            raise GrammarError("the grammar is empty")
        if b"\0" in data:
            raise GrammarError("the grammar contains a NUL character")
        check_grammar_shape(self.text)
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
            raise GrammarError(f"the grammar is not valid GBNF (root rule 'root'): {detail}")
        return handle

    def clone(self) -> "Grammar":
        handle = llama_cpp.llama_sampler_clone(self._handle)
        if not handle:
            raise LocalspecError("llama.cpp could not copy the grammar state")
        return Grammar(self.model, self.text, self.triggers, _handle=handle, _trigger=self._trigger,
                       _waiting=self._waiting)

    def allowed(self, token: int) -> bool:
        """Whether ``token`` may come next (an end-of-generation token: where the grammar may end)."""
        one = self._one
        one.buf[0] = (token, 0.0, 0.0)
        one.array.size = 1
        llama_cpp.llama_sampler_apply(self._handle, one.ref)
        ok = bool(np.isfinite(one.buf["logit"][0]))
        return ok and (self._waiting is None or self._trigger.allows(self._waiting, token))

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
        out = cand.buf["logit"].copy()
        if self._waiting is not None:
            for tok in self._trigger.maybe:
                if not self._trigger.allows(self._waiting, int(tok)):
                    out[tok] = -np.inf
        return out

    def allowed_among(self, ids: np.ndarray) -> np.ndarray:
        """The tokens of ``ids`` the grammar allows next (a partial candidate array: cheaper than
        :meth:`mask` over the whole vocabulary)."""
        cand = _Candidates(len(ids))
        cand.buf["id"] = ids
        llama_cpp.llama_sampler_apply(self._handle, cand.ref)
        ids = ids[np.isfinite(cand.buf["logit"])]
        if self._waiting is not None and len(ids):
            ids = ids[[self._trigger.allows(self._waiting, int(t)) for t in ids]]
        return ids

    def accept(self, token: int) -> None:
        """Advance by one token; a token the grammar forbids is an error (llama.cpp would abort)."""
        if not self.allowed(token):
            raise GrammarError(f"token {token} is not allowed by the grammar here")
        llama_cpp.llama_sampler_accept(self._handle, token)
        if self._waiting is not None:
            data, at = self._trigger.start(self._waiting, token)
            keep = self._trigger.keep
            self._waiting = None if at is not None else (data[len(data) - keep:] if keep else b"")

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle:
            llama_cpp.llama_sampler_free(handle)

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass
