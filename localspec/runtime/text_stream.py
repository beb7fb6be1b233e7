"""From committed tokens to text events: UTF-8 and stop-string holdback, and when to stop.

The generation loop hands every committed token (accepted drafts, then the target's own choice)
to :class:`TokenOutput`; it alone decides what is emitted and why a generation ends: an
end-of-generation token (not emitted), a stop string (the text before it is emitted, the rest of
the token dropped), or ``max_tokens``.
"""

from __future__ import annotations

import codecs
from typing import Iterator, Sequence

from ..core.events import TokenEvent


class TextStream:
    """Turns token bytes into printable text, holding back partial UTF-8 and possible stop strings."""

    def __init__(self, stop: Sequence[str]) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""
        self.text = ""        # released so far
        self.stopped = False

    def push(self, data: bytes) -> str:
        decoder = self._decoder
        if decoder.buffer:   # a character begun in earlier bytes: the incremental decoder completes it
            self._pending += decoder.decode(data)
        else:                # whole characters (most tokens): as the decoder would, without its layers
            try:
                self._pending += data.decode("utf-8")
            except UnicodeDecodeError:   # a character cut at the token's end, or invalid bytes
                self._pending += decoder.decode(data)
        if self._stop:
            window = self.text[-self._hold:] + self._pending if self._hold else self._pending
            offset = len(window) - len(self._pending)
            hits = [at for at in (window.find(s) for s in self._stop) if at >= 0]
            if hits:
                self.stopped = True
                return self._release(max(0, min(hits) - offset))
            return self._release(max(0, len(self._pending) - self._hold))
        out, self._pending = self._pending, ""   # no stop strings: all of it (_release, one call fewer a token)
        self.text += out
        return out

    def _release(self, n: int) -> str:
        out, self._pending = self._pending[:n], self._pending[n:]
        if self.stopped:
            self._pending = ""
        self.text += out
        return out

    def flush(self) -> str:
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(len(self._pending))


class TokenOutput:
    """The emitted tokens and text of one generation, and its finish reason once one applies
    (``stop``: an end-of-generation token or a stop string; ``length``: ``max_tokens``)."""

    def __init__(self, model, stop: Sequence[str], max_tokens: int) -> None:
        # the model's end-of-generation set and text table, read directly (two calls fewer a token,
        # each ~5-20 µs cold right after a decode)
        self._eog: frozenset[int] = model.eog
        self._pieces: list[bytes] = model.pieces()
        self._stream = TextStream(stop)
        self._max_tokens = max_tokens
        self.tokens: list[int] = []
        self.logprobs: list = []            # per emitted token, when the generation records them
        self.finish: str | None = None

    @property
    def text(self) -> str:
        return self._stream.text

    @property
    def remaining(self) -> int:
        return self._max_tokens - len(self.tokens)

    def emit(self, committed: Sequence[tuple[int, bool]], logprobs: Sequence | None = None) -> list[TokenEvent]:
        """A TokenEvent per ``(token, from_draft)`` until one ends the generation; ``logprobs``:
        one :class:`~localspec.core.events.TokenLogprob` per committed token, or None. A list,
        not a generator: once per cycle, usually one token (a generator's setup and two
        resumptions cost more than the token)."""
        events: list[TokenEvent] = []
        eog, pieces, stream, tokens = self._eog, self._pieces, self._stream, self.tokens
        for i, (tok, from_draft) in enumerate(committed):
            if tok in eog:
                self.finish = "stop"
                break
            tokens.append(tok)
            text = stream.push(pieces[tok])   # a committed token: the target's choice, in the vocabulary
            if logprobs is None:
                events.append(TokenEvent(text, tok, from_draft))
            else:
                self.logprobs.append(logprobs[i])
                events.append(TokenEvent(text, tok, from_draft, (logprobs[i],)))
            if stream.stopped:
                self.finish = "stop"
                break
            if len(tokens) >= self._max_tokens:
                self.finish = "length"
                break
        return events

    def close(self) -> Iterator[TokenEvent]:
        """The text still held back (an incomplete character, a prefix of no stop string)."""
        tail = self._stream.flush()
        if tail:
            yield TokenEvent(tail, -1, False)
