"""A text cut at its special tokens in linear time, as llama.cpp cuts it before tokenizing.

llama.cpp's ``tokenizer_st_partition`` (``src/llama-vocab.cpp``) walks a linked list of fragments
and, for every special token it finds, counts its way from the head of the list to the fragment it
splits (``std::distance``, ``std::next``): a text of n special tokens costs O(n²) (SmolLM2's
vocabulary: 10k specials 1.5 s, 50k 26-29 s, bench/special_tokens.py). :class:`SpecialSplitter`
makes the same cut with the same rules (special tokens longest first, each taking the leftmost
non-overlapping matches in what the earlier ones left; LSTRIP/RSTRIP eat the whitespace beside a
match; control tokens only when special text is parsed) over a Python list, and llama.cpp then
tokenizes each plain piece alone, as it tokenizes each fragment. The cut counts the special
tokens as it goes and stops at a limit: a text with more of them than a context holds is refused
before anything is tokenized. A text with few special tokens (``FEW``) is llama.cpp's own to
tokenize: its walk is short there, and one call costs less than one per piece.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Optional

import llama_cpp

from ..core.errors import LocalspecError

SPACE = frozenset(b" \t\n\v\f\r")   # C's isspace in the "C" locale, which llama.cpp's strip uses
_SPECIAL = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | \
    llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
_CONTROL = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN

Part = tuple   # (start, end, id) of the bytes: a special token's match and id, or a plain piece (id -1)
FEW = 64       # up to this many special tokens, llama.cpp tokenizes the whole text itself: its O(n²) walk stays short


class TooManyTokens(LocalspecError):
    """The text holds at least ``count`` tokens (``special``: special tokens, found before any
    piece was tokenized), the limit the caller gave."""

    def __init__(self, count: int, *, special: bool) -> None:
        super().__init__(f"the text holds at least {count} {'special ' if special else ''}tokens")
        self.count, self.special = count, special


@dataclass(frozen=True)
class Special:
    id: int
    text: bytes
    control: bool      # skipped when special text is not parsed
    lstrip: bool
    rstrip: bool


def _overlaps(a: bytes, b: bytes) -> bool:
    """Whether an occurrence of ``a`` and one of ``b`` can overlap without being the same text."""
    n = min(len(a), len(b))
    return any(a.endswith(b[:k]) or b.endswith(a[:k]) for k in range(1, n))


class SpecialSplitter:
    """The special tokens of one vocabulary, in llama.cpp's order, and the cut of a text at them."""

    def __init__(self, vocab) -> None:
        specials = []
        for tok in range(int(llama_cpp.llama_vocab_n_tokens(vocab))):
            attr = int(llama_cpp.llama_vocab_get_attr(vocab, tok))
            if not attr & _SPECIAL:
                continue
            text = llama_cpp.llama_vocab_get_text(vocab, tok) or b""
            if text:
                specials.append(Special(tok, text, bool(attr & _CONTROL), bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP),
                                        bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP)))
        # llama.cpp sorts by length, longest first (std::sort: the order of equal lengths is its own;
        # texts where that order could matter are left to llama.cpp, see ``ambiguous``)
        self.specials = sorted(specials, key=lambda s: -len(s.text))

    def present(self, data: bytes, parse_special: bool) -> list[Special]:
        """The special tokens whose text occurs in ``data``, in llama.cpp's order."""
        return [s for s in self.specials if (parse_special or not s.control) and s.text in data]

    @staticmethod
    def ambiguous(present: list[Special]) -> bool:
        """Whether two tokens of one length could cut ``data`` differently in either order."""
        by_length: dict[int, list[Special]] = {}
        for s in present:
            by_length.setdefault(len(s.text), []).append(s)
        for group in by_length.values():
            for i, a in enumerate(group):
                for b in group[i + 1:]:
                    if _overlaps(a.text, b.text) or ((a.lstrip or a.rstrip or b.lstrip or b.rstrip)
                                                     and (a.text[:1] in SPACE or a.text[-1:] in SPACE
                                                          or b.text[:1] in SPACE or b.text[-1:] in SPACE)):
                        return True
        return False

    def split(self, data: bytes, present: list[Special], limit: Optional[int] = None) -> list[Part]:
        """``data`` cut at ``present`` (from :meth:`present`): (start, end, id) parts in order, id
        -1 for a plain piece; TooManyTokens once ``limit`` special tokens are found."""
        parts: list[Part] = [(0, len(data), -1)] if data else []
        count = 0
        for s in present:
            out: list[Part] = []
            for part in parts:
                if part[2] >= 0:
                    out.append(part)
                    continue
                pos, end, _ = part
                while True:
                    match = data.find(s.text, pos, end)
                    if match < 0:
                        break
                    left = match
                    if s.lstrip:
                        while left > pos and data[left - 1] in SPACE:
                            left -= 1
                    if left > pos:
                        out.append((pos, left, -1))
                    out.append((match, match + len(s.text), s.id))
                    count += 1
                    if limit is not None and count >= limit:
                        raise TooManyTokens(count, special=True)
                    pos = match + len(s.text)
                    if s.rstrip:
                        while pos < end and data[pos] in SPACE:
                            pos += 1
                if pos < end:
                    out.append((pos, end, -1))
            parts = out
        return parts


class SplitTokenizer:
    """llama.cpp's tokenization of a text, cut at its special tokens here (linear) and each plain
    piece tokenized by llama.cpp; ``tokenize(data, add_special, parse_special)`` is llama.cpp's own."""

    def __init__(self, vocab, tokenize: Callable[[bytes, bool, bool], list[int]]) -> None:
        self._vocab = vocab
        self._tokenize = tokenize
        self._splitter: Optional[SpecialSplitter] = None
        self._ends: Optional[tuple] = None   # (before, after), () when unknown
        self._lock = threading.Lock()

    def splitter(self) -> SpecialSplitter:
        with self._lock:   # built once, on first use (a walk over the vocabulary)
            if self._splitter is None:
                self._splitter = SpecialSplitter(self._vocab)
            return self._splitter

    def _added(self) -> Optional[tuple[list[int], list[int]]]:
        """The tokens ``add_special`` puts before and after a text (BOS, EOS, SEP), as llama.cpp
        adds them; None when a probe does not show them (the text is then llama.cpp's own)."""
        if self._ends is None:
            probe = b"a"
            bare, full = self._tokenize(probe, False, False), self._tokenize(probe, True, False)
            found = [i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare]
            self._ends = (full[:found[0]], full[found[0] + len(bare):]) if bare and found else ()
        return self._ends or None

    def tokens(self, data: bytes, *, add_special: bool, parse_special: bool, limit: Optional[int] = None) -> list[int]:
        """The tokens llama.cpp would give ``data``; TooManyTokens once ``limit`` special tokens
        are found (before any piece is tokenized), or more than ``limit`` tokens are made from its pieces."""
        splitter = self.splitter()
        present = splitter.present(data, parse_special)
        parts = splitter.split(data, present, limit) if present else []
        if sum(1 for p in parts if p[2] >= 0) <= FEW or splitter.ambiguous(present) or \
                (add_special and self._added() is None):
            return self._tokenize(data, add_special, parse_special)   # few specials: llama.cpp's walk is short
        return self._pieces(data, parts, add_special, limit)

    def _pieces(self, data: bytes, parts: list[Part], add_special: bool, limit: Optional[int]) -> list[int]:
        """llama.cpp's tokens of ``data`` cut into ``parts``: each plain piece tokenized by
        llama.cpp alone, as it tokenizes each fragment (a piece seen before is not tokenized again:
        llama.cpp's tokenizer costs ~0.1 ms a call here, a chat's pieces repeat); stopped once more
        than ``limit`` tokens are made."""
        before, after = self._added() if add_special else ([], [])   # (known: see tokens)
        out = list(before)
        seen: dict[bytes, list[int]] = {}
        for start, end, token in parts:
            if token >= 0:
                out.append(token)
                continue
            piece = data[start:end]
            tokens = seen.get(piece)
            if tokens is None:
                tokens = seen[piece] = self._tokenize(piece, False, False)
            out.extend(tokens)
            if limit is not None and len(out) > limit:   # (>: the caller may still drop a doubled BOS)
                raise TooManyTokens(len(out), special=False)
        out.extend(after)
        return out
