"""Draft sources behind one interface: what a source proposes, what it is told, how it is weighed.

A source proposes draft tokens for the next positions of one generation. Two kinds:

- **text sources** (:class:`TextSource`: n-gram lookup, Predicted Outputs, recall, or any new one)
  propose a chain from text they know, for free. Each cycle :meth:`TextSource.find` says how
  long a stretch of the committed text its proposal rests on (``match``) and the statistics
  class it files the proposal under; the longest match of all the sources asked is proposed
  (:meth:`TextSource.propose`), the earlier source winning a tie, and the policy weighs it
  against the model drafter and a plain step with that class's live acceptance. A ``fallback``
  source is asked only while the best proposal so far is not a copy (``Found.copy``: a lookup
  match of ``LONG_N`` tokens, the user's prediction): recall, only where the text itself holds
  no copy.
- **model drafters** (:class:`ModelSource`: the EAGLE drafter, the target's MTP heads, Gemma 4's
  assistant, the block drafters) draft a chain, a tree or a block, priced by their own
  :meth:`DraftSource.cost` (the calibrated drafter curve). Each has its own name and statistics
  class on every surface: no source is filed under another's.

Each source declares its name (the word on every surface: ``--source``, the stats, ``/metrics``),
the ``--source`` word that turns it on (``switch``), its statistics classes with their priors
(:class:`StatClass`, named ``(source, bucket)``; :data:`CLASSES` gives each an index the policy's
acceptance table keeps), and what a draft of ``k`` tokens costs (:meth:`DraftSource.cost`).
:mod:`.registry` registers the built-in ones in order; adding a source is one module and its
line there.

The types every driver shares live here too: :class:`Draft` (what a cycle sends to
verification), :class:`DraftChain` (a model chain not yet driven, its :class:`CatchUp` first) and :func:`run_chain`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Generator, Sequence

from ..core import options

if TYPE_CHECKING:   # pragma: no cover
    from .tree import DraftTree

AUTO = "auto"


# -- what a cycle drafts ---------------------------------------------------------------------------
@dataclass
class Draft:
    """What one cycle sends to verification."""

    tokens: list[int] = field(default_factory=list)   # a chain (a text source's or a model's); empty for a tree
    source: str | None = None        # the source's surface name (lookup, prediction, eagle...), TREE; None: plain
    tree: "DraftTree | None" = None
    steps: int = 0                   # drafter decodes, catch-up rows included (tree levels are not)
    seconds: float = 0.0             # drafter time inside llama.cpp
    # per position, how sure the source is: a model drafter's softmax top-1 probabilities (where it
    # computed them: auto with p_min > 0), a text source's 1.0 per token; empty: not computed
    confidence: list[float] = field(default_factory=list)
    # a greedy model chain planned, not drafted: ``tokens`` are placeholders until the step's run
    # phase drafts them, right before the target's decode (:meth:`PlannedChain.run`)
    planned: "PlannedChain | None" = None


@dataclass(slots=True)
class PlannedChain:
    """A greedy model chain whose drafter decodes run in the step's run phase (``Batch.decode``,
    just before the target decode that verifies it), not while the step is planned: the host
    work between the drafter's last decode and the target's is then a few lines, where a return
    through the plan's frames cost ~120 µs a cycle, every frame cold after the drafter's decodes
    (docs/speculation.md, sixth round). ``sequence``: its drafter sequence; ``args``: the C
    call it planned (``DrafterSequence.plan_greedy``)."""

    sequence: object
    args: tuple

    def run(self, draft: Draft, then: tuple | None = None) -> tuple[list[int], tuple | None]:
        """Draft the chain: ``draft``'s tokens (placeholders, the list itself) and seconds filled
        in. ``then``: the target decode that verifies it, run in the same C call
        (``hostloop.catch_up_chain``'s). (Its tokens, (the decode's code, its seconds) or None.)"""
        drafts, seconds, decoded = self.sequence.run_planned(self.args, then)
        draft.tokens[:] = drafts
        draft.seconds = seconds
        draft.planned = None
        return drafts, decoded


# A model chain under way: it yields each drafter step it needs, (token, fed-back state,
# position, last), is sent back (logits, state), and returns its Draft (see DraftStep.draft's
# ``batched``); ``last``: the chain drafts no further step after this one, so the state sent back
# is None (never computed: see ModelDrafter.step). Its first yield may be a CatchUp instead.
Chain = Generator[tuple, tuple, Draft]


@dataclass(slots=True)   # made every model-drafted cycle: not frozen (a frozen __init__ is 3x)
class CatchUp:
    """A chain's first step where its drafter sequence has committed rows to write first: its
    catch-up of at most ``rows`` rows (None: all), sent back (logits, state) as a step is; a
    driver runs several slots' together (``ModelDrafter.catch_ups``)."""

    rows: int | None


@dataclass
class DraftChain:
    """A model drafter's chain for its driver: at most ``k`` tokens; ``steps``: the chain itself."""

    k: int
    steps: Chain
    drafter: object     # the drafter sequence whose ``step`` runs each step alone (a DrafterSequence)
    # a greedy chain's (each step the argmax of the last, no test, no grammar): its Draft from all its
    # tokens, so that a driver may run the steps after its first draft itself (ModelDrafter.greedy_rounds)
    finish: Callable[[list[int]], Draft] | None = None
    pos: int = -1       # the position of the token its first draft follows


def run_chain(chain: DraftChain) -> Draft:
    """Drive a chain alone: each drafter step one decode of one row."""
    gen, step = chain.steps, chain.drafter.step
    try:
        first = next(gen)
        if type(first) is CatchUp:
            first = gen.send(chain.drafter.catch_up(first.rows))
        tok, state, pos, last = first
        while True:
            tok, state, pos, last = gen.send(step(tok, state, pos, last))
    except StopIteration as stop:
        return stop.value


@dataclass
class Proposal:
    """One candidate of a cycle: a source's draft, not yet made (a model drafter's) or ready (a
    text source's), for the policy to weigh (``DraftPolicy.choose``). ``source``: the name its
    draft carries (the policy's choice); ``cls``: the statistics class (:data:`.sources.CLASSES` index) whose acceptance weighs it; ``depth``: the
    most tokens it holds (a text proposal's length; a model drafter's, as deep as the room);
    ``price``: seconds to draft ``k`` tokens, the source's own ``cost(k)`` (None: free, a text
    source); ``backlog``: rows a model drafter writes before it drafts (each priced as a step)."""

    source: str
    cls: int
    depth: int
    price: Callable[[int], float] | None = None
    backlog: int = 0

    @property
    def model(self) -> bool:
        return self.price is not None



# -- statistics classes ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StatClass:
    """One statistics class: the live acceptance of the proposals a source files under it.
    ``prior``: (first draft, later drafts) acceptance before any outcome; ``deep``: auto may
    draft it up to ``lookup_max`` (a copy, a loop), else up to ``draft_max``; ``depth``: the
    positions it keeps."""

    source: str
    bucket: str
    index: int
    prior: tuple[float, float]
    deep: bool = False
    depth: int = options.LOOKUP_MAX


class Classes:
    """Every registered statistics class, by index and by (source, bucket); a source's classes
    are contiguous, in the order it declares them."""

    def __init__(self) -> None:
        self._list: list[StatClass] = []
        self._by_key: dict[tuple[str, str], StatClass] = {}
        self._first: dict[str, int] = {}

    def declare(self, source: str, bucket: str, prior: tuple[float, float], *, deep: bool = False,
                depth: int = options.LOOKUP_MAX) -> StatClass:
        key = (source, bucket)
        if key in self._by_key:
            return self._by_key[key]
        cls = StatClass(source, bucket, len(self._list), tuple(prior), deep, depth)
        self._list.append(cls)
        self._by_key[key] = cls
        self._first.setdefault(source, cls.index)
        return cls

    def __getitem__(self, index: int) -> StatClass:
        return self._list[index]

    def __len__(self) -> int:
        return len(self._list)

    def __iter__(self):
        return iter(self._list)

    def index(self, source: str, bucket: str) -> int:
        return self._by_key[(source, bucket)].index

    def first(self, source: str) -> int:
        """The index of ``source``'s first class (its classes follow it)."""
        return self._first[source]

    def has(self, source: str) -> bool:
        """Whether ``source`` declared a class."""
        return source in self._first


CLASSES = Classes()


# -- the interface ---------------------------------------------------------------------------------
class DraftSource:
    """A draft source. Subclasses set ``name`` (the word on every surface), ``switch`` (the
    ``--source`` word that turns it on; default its name) and ``classes`` (bucket, prior, deep),
    and implement :meth:`create` and what their kind asks for."""

    name: str = ""
    label: str | None = None         # the name its drafts carry on the surfaces, if not its own
    switch: str | None = None
    classes: tuple = ()             # ((bucket, (first, later), deep), ...): declared at registration
    model = False                    # a model drafter (ModelSource) rather than a text source

    @classmethod
    def word(cls) -> str:
        return cls.switch or cls.name

    @classmethod
    def surface(cls) -> str:
        return cls.label or cls.name

    @classmethod
    def create(cls, ctx: "SourceContext") -> "DraftSource | None":
        """This source for one generation (None: it has nothing to draft from here)."""
        raise NotImplementedError

    def cost(self, k: int, cost_model=None) -> float:
        """Seconds a draft of ``k`` tokens costs to produce (text sources: nothing)."""
        return 0.0

    def commit(self, tokens: Sequence[int]) -> None:
        """Tokens the target committed (the output goes on)."""

    def accepted(self, draft: Draft, verified) -> None:
        """The outcome of this source's draft (``verified``: the verifier's record)."""


@dataclass
class Found:
    """A text source's match this cycle: ``match`` tokens of the committed text back the
    proposal, filed under statistics class ``cls``; ``at``: the source's own place to propose from."""

    source: "TextSource"
    match: int
    cls: int
    at: int = 0
    copy: bool = False   # the proposal continues a copy (a fallback source is not asked after it)


class TextSource(DraftSource):
    """A source that proposes a chain from text it knows, for free."""

    order = 100            # asked in this order (the earlier wins a tie of matches)
    fallback = False       # asked only while the best proposal so far is not a copy

    def find(self) -> Found | None:
        raise NotImplementedError

    def propose(self, found: Found, k: int) -> list[int]:
        """Up to ``k`` tokens from where :meth:`find` matched."""
        raise NotImplementedError


class ModelSource(DraftSource):
    """A model drafter: drafts a chain, a tree or a block (see :mod:`.model_source`). Its
    ``drafter`` (the generation's drafter sequence), ``policy`` and ``classes`` are its own."""

    model = True
    drafter: object = None
    policy: object = None

    @property
    def pending(self) -> int:
        """Rows the drafter writes before its next draft."""
        return self.drafter.pending

    def proposal(self) -> Proposal:
        """This cycle's candidate for the policy: as deep as the drafter drafts, priced by
        :meth:`cost` at the policy's cost model."""
        policy = self.policy
        cost_model = policy.cost
        return Proposal(self.name, CLASSES.first(self.name), getattr(self.drafter, "max_depth", None) or options.DRAFT_MAX,
                        lambda k: self.cost(k, cost_model), self.pending)


@dataclass
class SourceContext:
    """What a generation offers its sources: ``history``, the prompt and the output so far (an
    :class:`~.lookup.NgramLookup` the driver extends); the user's prediction, the engine's recall
    store and model drafter where there are; the policy, the grammar state and the tree calibration."""

    policy: object
    history: object = None
    prediction: object = None
    recall: object = None
    drafter: object = None
    grammar: object = None
    calibration: object = None


# -- the registry ------------------------------------------------------------------------------------
_SOURCES: list[type[DraftSource]] = []


def register(source: type[DraftSource]) -> type[DraftSource]:
    """Add a source (its statistics classes get their indices, its ``--source`` word becomes a
    choice); registering it again changes nothing. Returns it (usable as a decorator)."""
    if source in _SOURCES:
        return source
    if any(s.name == source.name for s in _SOURCES):
        raise ValueError(f"a draft source named {source.name!r} is already registered")
    for bucket, prior, *deep in source.classes:
        CLASSES.declare(source.name, bucket, prior, deep=bool(deep and deep[0]),
                        depth=options.DRAFT_MAX if source.model else options.LOOKUP_MAX)
    options.add_choice("source", source.word())
    _SOURCES.append(source)
    return source


def unregister(source: type[DraftSource]) -> None:
    """Take a registered source out (a plugin, a test's own source); its statistics classes keep
    their indices (an engine's learned table may hold them), unused."""
    if source in _SOURCES:
        _SOURCES.remove(source)
        if not any(s.word() == source.word() for s in _SOURCES):
            options.remove_choice("source", source.word())


def registered() -> list[type[DraftSource]]:
    return list(_SOURCES)


def text_sources() -> list[type[TextSource]]:
    return sorted((s for s in _SOURCES if not s.model), key=lambda s: s.order)


def model_source(name: str) -> type[ModelSource] | None:
    """The registered model source named ``name`` (a drafter's ``name``: eagle, mtp, assistant...)."""
    return next((s for s in _SOURCES if s.model and s.name == name), None)


def surface_names() -> list[str]:
    """Every text source's surface name, in registration order (the policy's choice counts)."""
    out: list[str] = []
    for s in _SOURCES:
        if not s.model and s.surface() not in out:
            out.append(s.surface())
    return out


# -- --source values ---------------------------------------------------------------------------------
def words(value: str) -> tuple[str, ...]:
    """The source words of a ``--source`` value: ``auto`` or a comma list (``mtp,lookup``)."""
    return options.listed_words(value)


def wants(value: str, word: str) -> bool:
    """Whether ``--source value`` lets the source switched on by ``word`` draft (auto: every one)."""
    names = words(value)
    return names == (AUTO,) or word in names


def wants_text(value: str) -> bool:
    """Whether any text source may draft under ``value``."""
    return any(wants(value, s.word()) for s in text_sources())
