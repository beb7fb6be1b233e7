"""What a generation yields, token by token: the one stream that CLI, bench and TUI consume.

A generation is a sequence of :class:`TokenEvent` (text as it becomes printable, whether the token
came from an accepted draft) interleaved with :class:`CycleEvent` (one per target verification
step, with running statistics) and closed by one :class:`DoneEvent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    """Running statistics of one generation; ``snapshot()`` copies it for an event."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    prompt_cached: int = 0    # prompt tokens whose KV rows were reused (not decoded again)
    generated_tokens: int = 0
    generation_seconds: float = 0.0
    cycles: int = 0           # target verification steps (plain decoding: one per token)
    drafted: int = 0          # draft tokens sent to verification
    accepted: int = 0         # draft tokens the target accepted
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    spec: bool = False
    # time split of the generation phase (seconds)
    target_seconds: float = 0.0
    drafter_seconds: float = 0.0
    # per draft source ("eagle", "lookup"): (cycles, drafted, accepted). This dict and the two
    # per-position lists are replaced, never changed in place, when a cycle drafts: a snapshot (once
    # a cycle, most of them plain) shares them rather than copies them
    sources: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # target decodes by batch size: {batch: (count, seconds)} (the run's own V(k))
    verify_by_batch: dict[int, tuple[int, float]] = field(default_factory=dict)
    policy_choices: dict[str, int] = field(default_factory=dict)  # cycles per choice (at the end)
    # Predicted Outputs (with GenerationConfig.prediction, at the end), as OpenAI defines them: the
    # prediction's tokens that appear in the completion, and those that do not
    accepted_prediction_tokens: int | None = None
    rejected_prediction_tokens: int | None = None

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_cycle(self) -> float:
        """Tokens chosen per target verification step: 1 + accepted drafts per cycle (exactly 1.0
        for plain decoding; a stop inside a cycle does not lower it)."""
        return (self.cycles + self.accepted) / self.cycles if self.cycles else 0.0

    @property
    def overhead_seconds(self) -> float:
        """Generation time spent outside llama.cpp calls (Python, sampling, bookkeeping)."""
        return max(0.0, self.generation_seconds - self.target_seconds - self.drafter_seconds)

    @property
    def position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def record_verify(self, batch: int, seconds: float) -> None:
        self.target_seconds += seconds
        entry = self.verify_by_batch.get(batch)
        self.verify_by_batch[batch] = (1, seconds) if entry is None else (entry[0] + 1, entry[1] + seconds)

    def record_plain(self, seconds: float) -> None:
        """A plain step: ``record_verify(1, seconds)`` and ``record_cycle(0, 0)`` in one call."""
        self.cycles += 1
        self.target_seconds += seconds
        entry = self.verify_by_batch.get(1)
        self.verify_by_batch[1] = (1, seconds) if entry is None else (entry[0] + 1, entry[1] + seconds)

    def record_cycle(self, drafted: int, accepted: int, source: str | None = None, *, depth: int | None = None) -> None:
        """``depth``: a draft tree's depth (``drafted`` counts its nodes; per-position figures
        count positions down to ``depth``)."""
        self.cycles += 1
        if not drafted:
            return
        if source is not None:
            c, d, a = self.sources.get(source, (0, 0, 0))
            self.sources = {**self.sources, source: (c + 1, d + drafted, a + accepted)}
        self.drafted += drafted
        self.accepted += accepted
        positions = drafted if depth is None else depth
        drafted_at, accepted_at = self.drafted_per_position[:], self.accepted_per_position[:]
        while len(drafted_at) < positions:
            drafted_at.append(0)
            accepted_at.append(0)
        for i in range(positions):
            drafted_at[i] += 1
            if i < accepted:
                accepted_at[i] += 1
        self.drafted_per_position, self.accepted_per_position = drafted_at, accepted_at

    def snapshot(self) -> "GenerationStats":
        """A copy for an event (once per cycle): the fields, sharing the containers that are
        replaced rather than changed (see ``sources``); ``verify_by_batch`` changes every cycle."""
        copy = object.__new__(GenerationStats)
        fields = copy.__dict__
        fields.update(self.__dict__)
        fields["verify_by_batch"] = self.verify_by_batch.copy()
        return copy

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_per_second": round(self.prompt_tokens_per_second, 2),
            "n_tokens": self.generated_tokens,
            "tokens_per_second": round(self.tokens_per_second, 2),
            "generation_seconds": round(self.generation_seconds, 4),
            "spec": self.spec,
            "cycles": self.cycles,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_cycle": round(self.tokens_per_cycle, 4),
            "position_acceptance": [round(x, 4) for x in self.position_acceptance],
            "time_split": {
                "target_seconds": round(self.target_seconds, 4),
                "drafter_seconds": round(self.drafter_seconds, 4),
                "python_seconds": round(self.overhead_seconds, 4),
            },
            "sources": {name: {"cycles": c, "drafted": d, "accepted": a,
                               "acceptance_rate": round(a / d, 4) if d else 0.0}
                        for name, (c, d, a) in sorted(self.sources.items())},
            "verify_ms_by_batch": {str(b): round(s / n * 1e3, 3)
                                   for b, (n, s) in sorted(self.verify_by_batch.items())},
            **({"accepted_prediction_tokens": self.accepted_prediction_tokens,
                "rejected_prediction_tokens": self.rejected_prediction_tokens}
               if self.accepted_prediction_tokens is not None else {}),
        }


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability under the target: the log-softmax of the target's raw logits at
    its position (before penalties, grammar, temperature and filters; llama-server's default
    ``post_sampling_probs=false``, and OpenAI's), with the ``top`` most probable tokens there
    (most probable first; their own ``top`` is empty)."""

    token: int
    text: str                 # the token's bytes as UTF-8 (an incomplete character: U+FFFD)
    bytes: bytes
    logprob: float
    top: tuple["TokenLogprob", ...] = ()


# TokenEvent and CycleEvent: made every cycle, so plain slotted dataclasses (a frozen one's __init__
# sets each field through object.__setattr__: 3x the time); treat them as read-only all the same
@dataclass(slots=True)
class TokenEvent:
    """Text of one emitted token (may be empty while a multi-byte character or stop string is pending)."""

    text: str
    token: int
    from_draft: bool
    # with GenerationConfig.logprobs: the token's log-probability (one entry; none for the held-back
    # text released at the end, token -1)
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(slots=True)
class CycleEvent:
    """One target verification step: how many tokens were drafted, accepted and emitted
    (emitted can fall short of accepted + 1 at a stop); ``stats`` includes this cycle."""

    drafted: int
    accepted: int
    emitted: int
    stats: GenerationStats
    source: str | None = None  # the draft source of this cycle ("eagle", "lookup"; None: plain)


@dataclass(frozen=True)
class DoneEvent:
    """The end of a generation. ``finish_reason``: stop, length, context or cancelled."""

    text: str
    tokens: list[int]
    finish_reason: str
    stats: GenerationStats
    margins: list[float] | None = None  # per token, when GenerationConfig.record_margins
    logprobs: list[TokenLogprob] | None = None  # per token of ``tokens``, with GenerationConfig.logprobs


Event = TokenEvent | CycleEvent | DoneEvent
