"""Token choice from target logits, and the speculative acceptance rule that keeps it lossless.

Filters follow llama.cpp's default order (penalties, top-k, top-p, min-p, then temperature). Drafts are
proposed deterministically (the drafter's top token), so the rejection rule is: accept draft ``x``
with probability ``p(x)``; on rejection sample from ``p`` with ``x`` removed and renormalised. The
emitted token then has exactly the distribution ``p``:
``P(y) = p(x)[y = x] + (1 - p(x)) p(y)[y != x] / (1 - p(x)) = p(y)``.

Repetition penalties (:mod:`localspec.runtime.penalties`) make ``p`` depend on the context: the sampler
holds the committed context, and each call names the tokens ``after`` it that the judged position
would follow (earlier drafts of the same cycle), so every position gets plain decoding's ``p``.

A grammar (:class:`localspec.llama.grammar.Grammar`) is part of ``p`` the same way: every position
is judged with the grammar state after the committed tokens and its own ``after`` (a copy advanced
along them; the committed state advances only in :meth:`Sampler.commit`). Greedy: the constrained
argmax (the plain argmax when the grammar allows it, else the argmax of the masked row). Sampling:
the forbidden tokens' logits are ``-inf`` before the filters, as in llama.cpp's sampler chain, and
the rejection rule works on that masked distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, Sequence

import numpy as np

from ..core import options
from ..core.errors import GrammarError
from .penalties import PenaltyWindow

GREEDY_CANDIDATES = 64   # greedy under a grammar: top logits checked before masking the whole row


_D = options.default   # defaults: localspec.core.options, declared once with each range


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = _D("temperature")
    top_k: int = _D("top_k")
    top_p: float = _D("top_p")
    min_p: float = _D("min_p")
    seed: int | None = _D("seed")
    # llama.cpp/Ollama: positive logits divided, negative multiplied (1.0: off)
    repeat_penalty: float = _D("repeat_penalty")
    # the window of recent tokens the penalties count (0: off, -1: the whole context)
    repeat_last_n: int = _D("repeat_last_n")
    # OpenAI's, as llama.cpp applies them: logit -= presence * [count > 0] + frequency * count
    presence_penalty: float = _D("presence_penalty")
    frequency_penalty: float = _D("frequency_penalty")

    def __post_init__(self) -> None:
        # ranges, types and finiteness: localspec.core.options (one table for every entry point)
        for name in ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                     "presence_penalty", "frequency_penalty"):
            object.__setattr__(self, name, options.check(name, getattr(self, name)))
        object.__setattr__(self, "seed", options.check_seed(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """Whether any repetition penalty changes logits (llama.cpp's test, too)."""
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)


def distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The target's sampling distribution as (token ids, probabilities), most probable first."""
    n = logits.shape[0]
    k = params.top_k if 0 < params.top_k < n else n
    if k < n:
        ids = np.argpartition(logits, n - k)[n - k:]
    else:
        ids = np.arange(n)
    vals = logits[ids].astype(np.float64)
    order = np.argsort(-vals, kind="stable")
    ids, vals = ids[order], vals[order]
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        ids, vals, probs = ids[:keep], vals[:keep], probs[:keep]
    if params.min_p > 0.0:
        keep = int(np.count_nonzero(probs >= params.min_p * probs[0]))
        ids, vals = ids[:keep], vals[:keep]
    scaled = (vals - vals[0]) / params.temperature
    probs = np.exp(scaled)
    probs /= probs.sum()
    return ids, probs


class Sampler:
    """Chooses tokens from logits: argmax when greedy, else from :func:`distribution`.

    ``context`` is the sequence so far (the prompt); :meth:`commit` appends what is emitted. With
    penalties or a grammar on, ``after`` names the tokens between the committed context and the
    judged position; with neither, logits are used as they are and ``after`` is ignored.
    ``grammar``: the grammar state after the committed context (the sampler owns it: :meth:`close`)."""

    def __init__(self, params: SamplingParams, context: Iterable[int] = (), grammar=None) -> None:
        self.params = params
        self.grammar = grammar
        self._cursor = None           # (after, the grammar state after it): the last one judged
        self.rng = np.random.default_rng(params.seed)
        self.penalties = (PenaltyWindow(last_n=params.repeat_last_n, repeat=params.repeat_penalty,
                                        frequency=params.frequency_penalty, presence=params.presence_penalty,
                                        context=context)
                          if params.penalized else None)
        # greedy on the raw row: a choice is its argmax, which the context reads in one call
        self.plain_greedy = params.greedy and self.penalties is None and grammar is None
        # whether a judged position's ``after`` changes its distribution; also whether commit() has
        # anything to do (a plain step skips the call where not)
        self.needs_context = self.penalties is not None or grammar is not None

    def commit(self, tokens: Iterable[int]) -> None:
        """Tokens that joined the context (emitted, accepted drafts and corrections alike)."""
        if self.penalties is not None:
            self.penalties.push(tokens)
        grammar = self.grammar
        if grammar is not None:
            self._drop_cursor()
            for tok in tokens:
                if grammar.model.is_eog(tok):
                    break           # the generation ends there: nothing after it is emitted
                grammar.accept(tok)

    def grammar_at(self, after: Sequence[int] = ()):
        """The grammar state after the committed context and ``after`` (judged rows follow each
        other along a chain or a tree path: the last state is advanced rather than copied anew)."""
        if not after:
            return self.grammar
        key = tuple(int(t) for t in after)
        cursor = self._cursor
        if cursor is None or key[:len(cursor[0])] != cursor[0]:
            self._drop_cursor()
            cursor = ((), self.grammar.clone())
        state = cursor[1]
        for tok in key[len(cursor[0]):]:
            state.accept(tok)
        self._cursor = (key, state)
        return state

    def _drop_cursor(self) -> None:
        if self._cursor is not None:
            self._cursor[1].close()
            self._cursor = None

    def close(self) -> None:
        """Free the grammar states."""
        self._drop_cursor()
        if self.grammar is not None:
            self.grammar.close()

    def _greedy(self, logits: np.ndarray, after: Sequence[int]) -> int:
        best = int(logits.argmax())
        if self.grammar is None:
            return best
        state = self.grammar_at(after)
        if state.allowed(best):   # the cheap path: the plain argmax is allowed
            return best
        # next: the most probable allowed token among the top candidates, if any is allowed there
        # (no allowed token outside them has a higher logit); else the whole row masked
        n = logits.shape[0]
        if n > GREEDY_CANDIDATES:
            ids = np.argpartition(-logits, GREEDY_CANDIDATES - 1)[:GREEDY_CANDIDATES].astype(np.int32)
            allowed = state.allowed_among(ids)
            if len(allowed):
                return int(allowed[np.lexsort((allowed, -logits[allowed]))[0]])
        return int(_allowed_only(state, logits).argmax())

    def penalised(self, logits: np.ndarray, after: Sequence[int] = ()) -> np.ndarray:
        """The logits the choice is made from (penalised, the grammar's forbidden tokens at -inf):
        ``logits`` itself when neither is on."""
        if self.penalties is not None:
            logits = self.penalties.apply(logits, after)
        if self.grammar is not None:
            logits = _allowed_only(self.grammar_at(after), logits)
        return logits

    def choose(self, logits: np.ndarray, after: Sequence[int] = ()) -> int:
        if self.penalties is not None:
            logits = self.penalties.apply(logits, after)
        if self.params.greedy:
            return self._greedy(logits, after)
        if self.grammar is not None:
            logits = _allowed_top(self.grammar_at(after), logits, self.params.top_k)
        ids, probs = distribution(logits, self.params)
        return int(ids[self.rng.choice(len(ids), p=probs)])

    def choose_at(self, ctx, row: int, after: Sequence[int] = ()) -> int:
        """:meth:`choose` from output row ``row`` of ``ctx``'s last decode (a plain greedy choice:
        ``ctx.argmax``, no logits view)."""
        if self.plain_greedy:
            return ctx.argmax(row)
        return self.choose(ctx.logits(row), after)

    def verify_at(self, ctx, row: int, draft: int, after: Sequence[int] = ()) -> tuple[bool, int]:
        """:meth:`verify` against output row ``row`` of ``ctx``'s last decode."""
        if self.plain_greedy:
            best = ctx.argmax(row)
            return best == draft, best
        return self.verify(ctx.logits(row), draft, after)

    def verify(self, logits: np.ndarray, draft: int, after: Sequence[int] = ()) -> tuple[bool, int]:
        """Judge one drafted token against the target's logits at its position (its context: the
        committed tokens, then ``after``).

        Returns (accepted, token): the draft itself if accepted, else the target's replacement.
        """
        if self.penalties is not None:
            logits = self.penalties.apply(logits, after)
        if self.params.greedy:
            best = self._greedy(logits, after)
            return best == draft, best
        if self.grammar is not None:
            logits = _allowed_top(self.grammar_at(after), logits, self.params.top_k)
        ids, probs = distribution(logits, self.params)
        hit = np.flatnonzero(ids == draft)
        p_draft = float(probs[hit[0]]) if hit.size else 0.0
        if p_draft > 0.0 and self.rng.random() < p_draft:
            return True, draft
        if hit.size:
            probs = probs.copy()
            probs[hit[0]] = 0.0
            total = probs.sum()
            if total <= 0.0:  # p(draft) was 1 up to rounding
                return True, draft
            probs /= total
        return False, int(ids[self.rng.choice(len(ids), p=probs)])


def _allowed_only(grammar, logits: np.ndarray) -> np.ndarray:
    """The row with the tokens ``grammar`` forbids at -inf; an error when it forbids them all."""
    masked = grammar.mask(logits)
    if not np.isfinite(masked.max()):
        raise GrammarError("the grammar allows no token here (not even the end of the text)")
    return masked


def _allowed_top(grammar, logits: np.ndarray, top_k: int) -> np.ndarray:
    """For sampling with ``top_k``: a row whose finite entries include the ``top_k`` most probable
    tokens the grammar allows (all other entries -inf), so :func:`distribution` gives exactly
    what it gives on the fully masked row, at the cost of applying the grammar to a few hundred
    candidates: among the ``m`` highest logits, if at least ``top_k`` are allowed, no allowed token
    outside them can be among the top ``top_k``. Otherwise (or top-k off) the whole row is masked."""
    n = logits.shape[0]
    m = min(n, 4 * top_k + 64)
    if 0 < top_k < n and m < n:
        ids = np.argpartition(-logits, m - 1)[:m].astype(np.int32)
        allowed = grammar.allowed_among(ids)
        if len(allowed) >= top_k:
            out = np.full(n, -np.inf, dtype=np.float32)
            out[allowed] = logits[allowed]
            return out
    return _allowed_only(grammar, logits)


# The chat's defaults (``localspec chat``; the server's too): llama.cpp's sampler defaults plus
# Ollama's repeat penalty, declared (and explained) in localspec.core.options.
CHAT_SAMPLING = SamplingParams(**{f.name: options.chat_default(f.name) for f in fields(SamplingParams)})
