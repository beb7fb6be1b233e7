"""What to draft each cycle: which source, how deep, or nothing at all.

Each cycle the draft step hands it a list of :class:`Proposal` s (a text source's chain ready to
verify, the generation's model drafter), each with its source's name, its statistics class, its
depth and its price (the source's own ``cost(k)``); it picks one and a depth, or plain decoding.
It knows no source by name: a new source is priced and weighed as the ones it ships with.

``fixed`` always drafts ``draft_max`` tokens from one source (the model drafter when loaded, else
the text proposal; tests and benchmarks). ``auto`` (the default) maximises expected tokens per second:

    rate(source, k) = (1 + E[accepted | k, source]) / (V(k + 1) + drafting(source, k) + overhead)

with ``V`` the cost model's verify seconds by batch size (calibrated, refreshed live), drafting the
source's price of ``k`` (a model drafter's calibrated step times its steps, a block drafter's one
decode; a text source: nothing), and ``E[accepted]`` the sum over positions of the product of live
conditional acceptance rates of the proposal's statistics class (each model source has its own;
lookup: per class of the match, its length or a loop, :func:`lookup_class`, scored on every cycle
whether verified or not, see ``lookup.ShadowScore``).
It compares the best option with a plain step ``1 / (V(1) + overhead)`` and decodes plain when
nothing beats it by a margin. ``draft_max`` caps the drafter and lookup drafts on short matches; a
lookup match of ``LONG_MATCH`` tokens or more (a copy, a loop) may be drafted up to ``lookup_max``
(128) tokens, where one long verify costs far less per token than single steps (SmolLM2 Q4_0 on
2 CPU cores: V(64) ~ 14 V(1)). The drafter's acceptance is only learned by drafting, so while it is
not chosen it is probed now and then, one draft deep (a block drafter: as deep as would pay best),
at intervals that double after each probe that does not pay. While drafting, the drafter stops under ``p_min`` confidence. Where nothing can
draft before a probe is due and no text source has a match, a cycle **rests** (:meth:`DraftPolicy.rest`):
a plain step that builds no proposal and weighs nothing, as spec-off decoding's.
"""

from __future__ import annotations

from dataclasses import dataclass
from ..core import options
from . import registry  # noqa: F401 (the built-in sources and their statistics classes)
from .costmodel import CostModel
# each source's statistics classes and priors are declared with it (re-exported here)
from .lookup import (LONG_MATCH, LOOKUP_BUCKETS, LOOKUP_PRIORS, LOOP_BUCKETS, LOOP_PRIORS,  # noqa: F401
                     _bucket, match_bucket)
from .model_source import TREE, top1_probability  # noqa: F401
from .prediction import PREDICTION_PRIORS, PREDICTION_SURE  # noqa: F401
from .recall import RECALL_PRIOR  # noqa: F401
from .sources import CLASSES, Proposal, model_source, surface_names, wants, wants_text  # noqa: F401 (Proposal re-exported)

POLICIES = options.OPTIONS["policy"].choices   # ("auto", "fixed")
SOURCES = options.OPTIONS["source"].choices    # ("auto", "eagle", "lookup", "mtp"), or a comma list
TREES = options.OPTIONS["tree"].choices        # ("auto", "on", "off")
EAGLE, LOOKUP = "eagle", "lookup"   # the EAGLE drafter's source, n-gram lookup's (TREE: a model drafter's tree)
PREDICTION = "prediction"   # Predicted Outputs (speculation.prediction): planned as a lookup proposal
MAX_DEPTH = options.LOOKUP_MAX     # deepest draft: auto's lookup on a long match (the drafter: DRAFT_MAX)
DENSE_DEPTH = 16       # auto weighs every depth up to this, then those that verify a multiple of
DEPTH_STEP = 8         # DEPTH_STEP rows (CPU kernels' sweet spots: here V(64) < V(48)) and the deepest
DECAY = 0.97           # weight of past observations, per observation of a position
MARGIN = 1.03          # speculation must beat plain decoding by this factor ...
# ... and by this one for short drafts (a drafter's, a lookup of a match under LONG_MATCH): each
# gains little, and on a CPU the cost model misses what a change of batch size costs beyond the
# verify itself (cold caches after a larger batch), so small predicted gains were measured as
# losses (docs/speculation.md, "Policy `auto`")
SHORT_MARGIN = 1.15
PROBE_MAX = 256        # longest interval (cycles) between two drafter probes
CATCH_UP_ROWS = 16     # auto: rows written to the drafter after plain stretches (see DrafterSequence.catch_up)
OPTIMISM = 0.25        # a probe is worth it only if acceptance this much better would pay
PROBE_RECHECK = 8      # ... asked again after this many cycles, doubled while it says no ...
RECHECK_MAX = 64       # ... up to this (a source that turns good is found within RECHECK_MAX cycles)
CARRY = 4.0            # observations per position carried from one generation to the next
TREE_DRAFT_RATIO = 1.5   # auto: trees only where a drafter step of WIDTH branches costs at most this
TREE_VERIFY_RATIO = 1.5  # ... and verifying a full tree at most this, times the chain's cost


_D = options.default   # defaults: localspec.core.options, declared once with each range


@dataclass
class PolicyConfig:
    name: str = _D("policy")
    draft_max: int = options.AUTO_DRAFT_MAX  # most tokens drafted per cycle (auto chooses up to this), but see lookup_max
    p_min: float = _D("p_min")              # drafter: stop drafting below this confidence
    probe_every: int = _D("probe_every")    # auto: first interval (cycles) between drafter probes
    source: str = _D("source")              # auto (every source), a word or a comma list (eagle, mtp, lookup...)
    tree: str = _D("tree")                  # drafter trees: auto (where batching is cheap), on (always), off (chains)
    tree_width: int = _D("tree_width")      # branches expanded per depth, children offered by each
    tree_nodes: int = _D("tree_nodes")      # most draft nodes in a tree
    lookup_max: int = _D("lookup_max")      # auto: most tokens of a lookup draft on a LONG_MATCH (a copy, a loop)
    recall: bool = _D("recall")             # draft from earlier generations' text (speculation.recall), keep this one's

    def __post_init__(self) -> None:
        # ranges and choices: localspec.core.options
        self.name = options.check("policy", self.name)
        for name in ("draft_max", "lookup_max", "p_min", "probe_every", "source", "tree", "tree_width",
                     "tree_nodes", "recall"):
            setattr(self, name, options.check(name, getattr(self, name)))


# the least a draft row adds to a shared batch, relative to a slot's share of it (a flat or noisy
# curve never makes rows free; see DraftPolicy._verify)
MARGINAL_FLOOR = 0.01
# a batch of several slots drafts only where V(8) <= this x V(1) (see DraftPolicy._rows_nearly_free)
SHARED_ROWS_FREE = 2.2


class Acceptance:
    """Decayed per-position counts: the conditional probability that draft ``i`` is accepted
    given drafts ``1..i-1`` were."""

    __slots__ = ("hit", "seen", "prior", "weight")

    def __init__(self, prior: list[float], weight: float = 2.0) -> None:
        self.prior, self.weight = prior, weight
        self.hit = [p * weight for p in prior]
        self.seen = [weight] * len(prior)

    def carry(self, evidence: float | None = None) -> None:
        """A new generation: keep what was learned as ``evidence`` observations per position at
        most, on top of the prior, so the new text's own outcomes take over within a few cycles."""
        w = self.weight
        evidence = CARRY if evidence is None else evidence
        for i, seen in enumerate(self.seen):
            learned = seen - w
            if learned > evidence:
                rate = (self.hit[i] - self.prior[i] * w) / learned if learned > 0 else self.prior[i]
                rate = min(max(rate, 0.0), 1.0)
                self.seen[i] = w + evidence
                self.hit[i] = self.prior[i] * w + rate * evidence

    def observe_hits(self, lo: int, hi: int) -> None:
        """Drafts lo..hi-1 accepted (the earlier ones were: see ShadowScore's ``hits``)."""
        hit, seen = self.hit, self.seen
        for i in range(lo, min(hi, len(seen))):
            seen[i] = seen[i] * DECAY + 1.0
            hit[i] = hit[i] * DECAY + 1.0

    def observe_miss(self, i: int) -> None:
        """Draft ``i`` rejected after drafts 0..i-1 were accepted."""
        if i < len(self.seen):
            self.seen[i] = self.seen[i] * DECAY + 1.0
            self.hit[i] *= DECAY

    def observe(self, drafted: int, accepted: int) -> None:
        hit, seen = self.hit, self.seen
        for i in range(min(drafted, accepted + 1, len(seen))):
            seen[i] = seen[i] * DECAY + 1.0
            hit[i] = hit[i] * DECAY + (1.0 if i < accepted else 0.0)

    def expected(self, k_max: int) -> list[float]:
        """``out[k]`` = expected accepted drafts with depth ``k`` (out[0] = 0)."""
        out = [0.0]
        run = 1.0
        hit, seen = self.hit, self.seen
        for i in range(min(k_max, len(seen))):
            run *= hit[i] / seen[i]
            out.append(out[-1] + run)
        return out

    def rates(self) -> list[float]:
        return [h / s for h, s in zip(self.hit, self.seen)]


def lookup_class(match: int, period: int = 0) -> int:
    """The statistics class (index) of a lookup proposal whose suffix match is ``match`` tokens
    long and continues an occurrence ``period`` tokens back (see :func:`.lookup.match_bucket`)."""
    return CLASSES.first(LOOKUP) + match_bucket(match, period)


def prediction_class(run: int) -> int:
    """The statistics class of a Predicted Outputs proposal whose alignment has held ``run`` tokens."""
    return CLASSES.index(PREDICTION, "followed" if run >= PREDICTION_SURE else "realigned")


def recall_class() -> int:
    """The statistics class of a proposal from an earlier generation's text (speculation.recall)."""
    return CLASSES.index("recall", "recall")


def _long_class(cls: int) -> bool:
    """Whether a class may draft up to ``lookup_max``, as its source declares it: a match of
    ``LONG_MATCH`` tokens or more (a copy or a loop, not a few repeated words), a prediction the
    output follows, or a recall."""
    return CLASSES[cls].deep


def _prior(first: float, rest: float, depth: int = MAX_DEPTH) -> list[float]:
    return [first] + [rest] * (depth - 1)


def _depths(k_max: int) -> list[int]:
    """The depths auto weighs: every one up to DENSE_DEPTH, then those whose verify batch (depth
    + 1) is a multiple of DEPTH_STEP, and k_max; keeps a 128-deep plan cheap in Python."""
    if k_max <= DENSE_DEPTH:
        return list(range(1, k_max + 1))
    out = list(range(1, DENSE_DEPTH + 1)) + list(range(DENSE_DEPTH + DEPTH_STEP - 1, k_max, DEPTH_STEP))
    return out + [k_max]


def _first_class(source: str) -> int:
    """The first statistics class of ``source`` (EAGLE's for a source that declared none)."""
    return CLASSES.first(source if CLASSES.has(source) else EAGLE)


class Learned:
    """Live acceptance statistics, kept by the engine from one generation to the next (a drafter's
    quality, and how often this model copies its context, change slowly): one
    :class:`Acceptance` per statistics class (:data:`.sources.CLASSES`, by index, each from the
    prior its source declares). ``lookup``: the table every class indexes (text and model
    sources alike; the name is kept for callers); ``eagle``: the EAGLE drafter's class."""

    def __init__(self) -> None:
        self.lookup: list[Acceptance] = []
        self.grow()
        self.eagle = self.lookup[CLASSES.first(EAGLE)]

    def grow(self) -> None:
        """Acceptances for classes registered since (a source registered after the engine opened)."""
        for cls in list(CLASSES)[len(self.lookup):]:
            self.lookup.append(Acceptance(_prior(*cls.prior, cls.depth)))

    def new_generation(self) -> None:
        self.grow()
        for acc in self.lookup:
            acc.carry()


class _Probe:
    """A model source's probing clock: cycles since it drafted, the interval before the next
    probe (doubled after each that did not pay), the cached could-pay answer and the cycles it
    is kept (doubled while it stays no, see :meth:`DraftPolicy._probe_pays`)."""

    __slots__ = ("since", "interval", "could", "recheck")

    def __init__(self, interval: int) -> None:
        self.since, self.interval = 0, interval
        self.could: tuple[int, int] | None = None   # (since when asked, _probe_could_pay's depth)
        self.recheck = PROBE_RECHECK


class DraftPolicy:
    """One generation's decisions. ``plan`` (or :meth:`choose`) before each cycle, ``observe``
    after it. ``model``: the name of the generation's model source (eagle, mtp, assistant,
    dflash, dspark, any registered one; ``eagle=True`` is ``model="eagle"``), if ``source`` lets it draft."""

    def __init__(self, config: PolicyConfig, cost: CostModel | None = None, *, model: str | None = None,
                 eagle: bool = False, lookup: bool = False, learned: Learned | None = None) -> None:
        self.config = config
        self.cost = cost
        name = model or (EAGLE if eagle else None)
        kind = model_source(name) if name else None
        self.model = name if name and wants(config.source, kind.word() if kind else name) else None
        self.lookup = lookup and wants_text(config.source)   # any text source (lookup, prediction, ...)
        learned = learned or Learned()
        learned.grow()
        self.lookup_acc = learned.lookup   # every class's acceptance, by index
        self.model_cls = _first_class(self.model) if self.model else None
        self.overhead = 0.0          # seconds per cycle outside llama.cpp (EMA)
        self._probes: dict[str, _Probe] = {}
        self.wants_features = True   # the engine records target features for the drafter
        self.block = False           # kept for callers: a block drafter's price is its source's cost(k)
        # rows other slots decode in the same batch (localspec.runtime.scheduler): a draft's rows are
        # then priced at their marginal cost on the batch (see _verify)
        self.batch_rows = 0
        # cycles by source name: plain, the model source, its trees, then each text source's
        self.choices = dict.fromkeys(("plain", *((self.model,) if self.model else ()), TREE, *surface_names()), 0)
        # the model source's probe clock value (``_Probe.since``) before which it cannot draft: set
        # by a weighing that left it off, 0 when the next cycle must weigh it (see :meth:`rest`)
        self._wake = 0
        self.rested = 0              # cycles that rested (no proposal built, nothing weighed)

    @property
    def eagle(self) -> bool:
        """Whether a model source may draft (the name kept for callers)."""
        return self.model is not None

    @property
    def eagle_acc(self) -> "Acceptance":
        """The model source's acceptance (its own statistics class); EAGLE's when there is none."""
        return self.lookup_acc[self.model_cls if self.model_cls is not None else CLASSES.first(EAGLE)]

    @eagle_acc.setter
    def eagle_acc(self, acc: "Acceptance") -> None:
        self.lookup_acc = list(self.lookup_acc)
        self.lookup_acc[self.model_cls if self.model_cls is not None else CLASSES.first(EAGLE)] = acc

    @property
    def fixed(self) -> bool:
        return self.config.name == "fixed"

    @property
    def active(self) -> bool:
        return self.model is not None or self.lookup

    # -- choosing ---------------------------------------------------------------------------------
    def plan(self, room: int, lookup_len: int = 0, lookup_cls: int = 0, backlog: int = 1) -> tuple[str | None, int]:
        """(source, depth) for this cycle from a text proposal of ``lookup_len`` tokens of class
        ``lookup_cls`` and the model source (``backlog`` rows to write first, priced at the cost
        model's drafter step each); (None, 0) is a plain step. See :meth:`choose`."""
        proposals = []
        if lookup_len:
            proposals.append(Proposal(LOOKUP, lookup_cls, lookup_len))
        if self.model is not None:
            proposals.append(Proposal(self.model, self.model_cls, options.DRAFT_MAX, self.step_price, backlog))
        chosen, k = self.choose(room, proposals)
        return (chosen.source if chosen is not None else None), k

    def rest(self, room: int | None = None) -> bool:
        """Whether this cycle is a plain step that weighs nothing, asked instead of :meth:`choose`
        where no text proposal is on offer (at most once a cycle; ``room`` as choose's, None: not
        known yet, taken as some): ``auto`` rests while its model source cannot draft before a
        probe is due (its rows are not recorded, so it has no backlog, and :meth:`_plan_model`
        would only advance its probe clock, which a rested cycle does), where a shared batch's
        rows are dear, and with no model source. The decisions are choose's, to the cycle (but for
        a cycle with no room, whose clock choose does not advance); with a garbage drafter every
        cycle but the probe clock's rechecks rests. :meth:`observe` hears it as any plain step (the
        cost model's live figures learn from them) (docs/speculation.md, "Resting")."""
        if self.fixed:
            return False
        if self.model is not None and (room is None or self.depth_limit(room) > 0):
            if not (self.cost is not None and self._batch_too_dear()):
                probe = self._probes.get(self.model)
                if probe is None or probe.since + 1 >= self._wake:
                    return False
                probe.since += 1
        self.rested += 1
        return True

    def rest_shared(self) -> bool:
        """Whether ``auto`` rests whatever the text sources hold: this slot shares a batch too dear
        for any draft (:meth:`_batch_too_dear`; :meth:`choose` then drafts nothing, a text match
        included), so no source is asked and no proposal scored. At 4 served slots on a CPU that is
        every step, and asking cost ~70 µs a slot (docs/speculation.md, "Resting")."""
        if self.fixed or self.cost is None or not self._batch_too_dear():
            return False
        self.rested += 1
        return True

    def step_price(self, k: int) -> float:
        """``k`` drafter steps at the cost model's drafter step, one for a block drafter (the
        price :meth:`plan` gives its model source; :meth:`choose` takes the source's own)."""
        step = getattr(self.cost, "drafter_step", None) or 0.0
        return step if self.block else k * step

    def choose(self, room: int, proposals: list[Proposal]) -> tuple[Proposal | None, int]:
        """The proposal to draft this cycle and its depth, or (None, 0): a plain step. Each is
        weighed by its class's live acceptance against its price and the verify it needs; the
        best beats plain decoding by a margin or nothing drafts. A model source not chosen is
        probed now and then (its acceptance is learned only by drafting)."""
        k_max = self.depth_limit(room)
        if k_max <= 0 or not self.active:
            return None, 0
        texts = [p for p in proposals if not p.model and p.depth] if self.lookup else []
        models = [p for p in proposals if p.model and p.source == self.model]
        if self.fixed:
            if models:
                return models[0], k_max
            return (texts[0], min(k_max, texts[0].depth)) if texts else (None, 0)
        if self.cost is None:
            return None, 0
        if self._batch_too_dear():
            return None, 0
        plain = 1.0 / (self._verify(1) + self.overhead)
        best_rate, short_bar = MARGIN * plain, SHORT_MARGIN * plain
        best: tuple[Proposal | None, int] = (None, 0)
        for text in texts:
            best_rate, best = self._plan_lookup(room, text, best_rate, short_bar, best)
        for model in models:
            best_rate, best = self._plan_model(model, k_max, best_rate, short_bar, best)
        return best

    def depth_limit(self, room: int) -> int:
        """The deepest draft this cycle may verify: the configured depth, the room left, the cap
        (what ``fixed`` drafts with its model source alone)."""
        return min(self.config.draft_max, room, options.DRAFT_MAX)

    def _batch_too_dear(self) -> bool:
        """Whether this slot shares a batch whose rows are not nearly free (:meth:`_rows_nearly_free`):
        nothing drafts then, so the drafter's rows are not worth copying either (:meth:`choose`
        and :meth:`rest` decide it alike)."""
        if self.batch_rows and not self._rows_nearly_free():
            self.wants_features = False
            return True
        return False

    def _plan_model(self, p: Proposal, k_max: int, best_rate: float, short_bar: float,
                    best: tuple) -> tuple[float, tuple]:
        """:meth:`choose`'s weighing of a model source: its best depth if it beats ``best_rate``
        and ``short_bar``; else its probe clock runs, and a due probe drafts one deep. Whether
        the target's features are worth recording is decided here too."""
        o, probe = self.overhead, self._probes.get(p.source)
        if probe is None:
            probe = self._probes[p.source] = _Probe(self.config.probe_every)
        k_max = min(k_max, p.depth)
        mine = None
        if p.backlog > 0:   # 0: no rows recorded (features were not wanted): it cannot draft this cycle
            rows = min(p.backlog, CATCH_UP_ROWS) - 1  # catch-up beyond the first step
            acc = self.lookup_acc[p.cls].expected(k_max)
            bound = (1.0 + acc[-1]) / (self._cheapest() + p.price(1 + rows) + o)   # every depth's upper bound
            for k in range(1, len(acc) if bound > max(best_rate, short_bar) else 1):
                rate = (1.0 + acc[k]) / (self._verify(self.verify_rows(k + 1)) + p.price(k + rows) + o)
                if rate > best_rate and rate > short_bar:
                    best_rate, best, mine = rate, (p, k), k
        self._wake = 0
        if mine is not None:
            probe.since, probe.interval = 0, self.config.probe_every
            self.wants_features = True
            return best_rate, best
        probe.since += 1
        near = probe.since >= probe.interval - CATCH_UP_ROWS
        could = self._probe_pays(p, probe, k_max, o) if near else 0   # the depth to probe (0: none)
        if could and p.backlog > 0 and probe.since >= probe.interval:
            probe.since, probe.interval = 0, min(2 * probe.interval, PROBE_MAX)
            best = (p, min(could, k_max))   # (could was cached at an earlier cycle's room)
        # features are only worth copying when the drafter may draft within CATCH_UP_ROWS
        # cycles (rows older than that are not written anyway); copying them every other
        # cycle, as an empty backlog once asked for, cost plain-looking text 1-2%
        self.wants_features = could > 0 or best[0] is p
        if not self.wants_features:   # no rows recorded: nothing changes before near, or could's recheck
            self._wake = probe.could[0] + probe.recheck if near else probe.interval - CATCH_UP_ROWS
        return best_rate, best

    def _plan_lookup(self, room: int, p: Proposal, best_rate: float, short_bar: float,
                     best: tuple) -> tuple[float, tuple]:
        """:meth:`choose`'s weighing of a text proposal: its best depth, if one beats
        ``best_rate`` (and ``short_bar`` unless its class may draft deep): (its rate, (p, depth)),
        else (best_rate, best) unchanged."""
        o = self.overhead
        long_match = _long_class(p.cls)
        cap = self.config.lookup_max if long_match else self.config.draft_max
        acc = self.lookup_acc[p.cls].expected(min(cap, room, MAX_DEPTH, p.depth))
        bar = best_rate if long_match else max(best_rate, short_bar)
        # every cycle on most text (short matches that never pay): first an upper bound of
        # every depth's rate (acc grows with depth, every batch costs at least the cheapest)
        if (1.0 + acc[-1]) / (self._cheapest() + o) > bar:
            for k in _depths(len(acc) - 1):
                rate = (1.0 + acc[k]) / (self._verify(self.verify_rows(k + 1)) + o)
                if rate > best_rate and (long_match or rate > short_bar):
                    best_rate, best = rate, (p, k)
        return best_rate, best

    def _verify(self, b: int) -> float:
        """What a cycle of ``b`` rows of this slot costs: V(b) alone. On a batch of R other rows,
        the slot's share of the batch without drafts, V(R + 1) / (R + 1), plus the marginal cost
        of its ``b - 1`` draft rows, V(R + b) - V(R + 1). A draft then pays when its expected
        tokens per marginal second beat what the batch already makes per second: on a GPU, where
        rows are nearly free up to dozens, drafts still pay at 4 or 8 slots; on a compute-bound
        CPU, where each row costs about what it costs alone, depths fall to zero as the batch
        grows (vLLM's disable-by-batch-size, from the measured curve)."""
        cost, r = self.cost, self.batch_rows
        if not r:
            return cost.verify(b)
        share = cost.verify(r + 1) / (r + 1)
        return share + max(cost.verify(r + b) - cost.verify(r + 1), MARGINAL_FLOOR * share * (b - 1))

    def _rows_nearly_free(self) -> bool:
        """Whether a batch of several slots may carry drafts at all: only where the one-sequence
        curve says extra rows are nearly free (V(8) <= SHARED_ROWS_FREE x V(1), a GPU's curve). On
        a compute-bound CPU the rows of several sequences cost more than that curve says (each row's
        attention spans every slot's cells), so drafts there lost to plain decoding (docs/speculation.md,
        "Where rows are not nearly free")."""
        cost = self.cost
        return cost.verify(8) <= SHARED_ROWS_FREE * cost.verify(1)

    def _cheapest(self) -> float:
        """A lower bound of :meth:`_verify` for 2 rows or more (plan's quick test)."""
        if not self.batch_rows:
            return self.cost.cheapest_batch()
        return self.cost.verify(self.batch_rows + 1) / (self.batch_rows + 1)

    def verify_rows(self, rows: int) -> int:
        """Rows to decode to verify a chain of ``rows`` (its drafts and the last token): auto pads
        up to a size the cost model finds clearly cheaper (a CPU's flash attention at 64 rows), no
        more than its deepest draft verifies (``lookup_max=62`` keeps every batch under 64 rows,
        where llama.cpp's CPU logits equal one-token decoding's bit for bit; see docs)."""
        if self.fixed or self.cost is None or self.batch_rows:   # filler rows in a shared batch: never
            return rows
        padded = self.cost.rows_for(rows)
        return padded if padded <= 1 + max(self.config.draft_max, self.config.lookup_max) else rows

    def lookup_depth(self, room: int, cls: int) -> int:
        """Most tokens a lookup proposal of class ``cls`` (:func:`lookup_class`) may hold this
        cycle: ``draft_max``; for auto ``lookup_max`` where the class is a match of ``LONG_MATCH``
        tokens or more (copying a passage, text that repeats itself), which may be drafted that
        far ahead (:meth:`plan` cuts the rest)."""
        cfg = self.config
        long = not self.fixed and _long_class(cls)
        cap = max(cfg.draft_max, cfg.lookup_max) if long else cfg.draft_max
        return max(0, min(cap, room, MAX_DEPTH))

    def _probe_pays(self, p: Proposal, probe: _Probe, k_max: int, o: float) -> int:
        """:meth:`_probe_could_pay`, asked again only every ``probe.recheck`` cycles (its inputs move
        slowly; a drafter that never pays was asked every cycle: about a tenth of auto's Python time
        per cycle, under cProfile). While the answer stays no, the wait doubles up to
        ``RECHECK_MAX`` (a garbage block drafter on the tiny fixtures: each answer is a weighing,
        70 µs against a 1 ms step, every 8 cycles); a yes, or a clock reset by a draft, starts it
        again at ``PROBE_RECHECK``."""
        could = probe.could
        if could is None or not 0 <= probe.since - could[0] < probe.recheck:
            pays = self._probe_could_pay(p, k_max, o)
            again = could is not None and not could[1] and not pays and probe.since > could[0]
            probe.recheck = min(2 * probe.recheck, RECHECK_MAX) if again else PROBE_RECHECK
            could = probe.could = (probe.since, pays)
        return could[1]

    def _probe_could_pay(self, p: Proposal, k_max: int, o: float) -> int:
        """Would the model source pay with clearly better acceptance than measured? If not even
        that (a slow drafter, a costly verify), probing it only costs time: 0. Else the depth to
        probe: 1 for a chain (each draft is a drafter step), and for a block drafter the depth
        that pays best at that acceptance (a block costs one decode at any depth, and a one-deep
        probe can neither show a block paying nor teach the positions after the first)."""
        cost = self.cost
        best_rate = SHORT_MARGIN / (cost.verify(1) + o)
        run, total, depth = 1.0, 0.0, 0
        for i, r in enumerate(self.lookup_acc[p.cls].rates()[:k_max]):
            run *= min(1.0, r + OPTIMISM)
            total += run
            rate = (1.0 + total) / (cost.verify(i + 2) + p.price(i + 1) + o)
            if rate > best_rate:
                if not self.block:
                    return 1
                depth, best_rate = i + 1, rate
        return depth

    def worthwhile_prefix(self, confidence: list[float]) -> int:
        """How many of a block's drafts to verify, from per-draft acceptance estimates (DSpark's
        confidence head): the prefix of the best expected tokens per second of verifying, the
        block itself already paid for (at least one draft, which the policy chose to draft)."""
        if self.cost is None or len(confidence) <= 1:
            return len(confidence)
        o = self.overhead
        best, best_rate, run, total = 1, 0.0, 1.0, 0.0
        for i, p in enumerate(confidence):
            run *= min(max(p, 0.0), 1.0)
            total += run
            rate = (1.0 + total) / (self._verify(self.verify_rows(i + 2)) + o)
            if rate > best_rate:
                best, best_rate = i + 1, rate
        return best

    @property
    def catch_up_rows(self) -> int | None:
        """Most rows the drafter writes before drafting (None: all, as ``fixed`` does)."""
        return None if self.fixed else CATCH_UP_ROWS

    def tree_plan(self, depth: int, cells: int) -> tuple[int, int] | None:
        """(width, most nodes) of a draft tree for a drafter cycle of ``depth``, or None for a
        chain. ``auto`` grows trees only where the cost model says width is nearly free (a GPU:
        a drafter step of ``width`` branches and a verify of the whole tree cost little more than
        a chain's); :func:`speculation.tree.prune` then cuts each tree to its best expected rate.
        ``cells``: free KV cells for the drafted rows."""
        cfg = self.config
        width, nodes = cfg.tree_width, min(cfg.tree_nodes, cells)
        if cfg.tree == "off" or depth < 1 or nodes <= depth or width * depth > cells:
            return None
        if cfg.tree == "on":
            return width, nodes
        cost = self.cost
        if cost is None or not cost.drafter_width:
            return None
        cheap_draft = cost.drafter_width <= TREE_DRAFT_RATIO
        cheap_verify = cost.verify(nodes + 1) <= TREE_VERIFY_RATIO * cost.verify(depth + 1)
        return (width, nodes) if cheap_draft and cheap_verify else None

    def keep_drafting(self, probability: float) -> bool:
        return self.fixed or probability >= self.config.p_min

    # -- learning ---------------------------------------------------------------------------------
    def declined(self, draft) -> None:
        """After a cycle: a model source asked to draft but not confident enough for even one
        draft counts, for the policy, as a first draft that would not have been accepted (it cost
        a catch-up)."""
        if not draft.tokens and draft.tree is None and draft.source is not None and draft.source == self.model:
            self.eagle_acc.observe(1, 0)

    def eagle_declined(self) -> None:
        """The model source declined to draft (see :meth:`declined`)."""
        self.eagle_acc.observe(1, 0)

    def lookup_hits(self, cls: int, lo: int, hi: int) -> None:
        """Positions lo..hi-1 of a lookup proposal of class ``cls`` (:func:`lookup_class`) matched
        the committed tokens (ShadowScore's ``hits``; :meth:`lookup_settled` then records only the miss)."""
        self.lookup_acc[cls].observe_hits(lo, hi)

    def lookup_settled(self, cls: int, proposed: int, accepted: int) -> None:
        if accepted < proposed:
            self.lookup_acc[cls].observe_miss(accepted)

    def observe_lookup(self, cls: int, proposed: int, accepted: int) -> None:
        """A lookup proposal of class ``cls`` scored against the committed tokens (see ShadowScore)."""
        self.lookup_acc[cls].observe(proposed, accepted)

    def observe(self, source: str | None, drafted: int, accepted: int, *, verify_seconds: float,
                drafter_seconds: float, cycle_seconds: float, drafter_steps: int = 0,
                depth: int | None = None, batch: int | None = None, cost_observed: bool = False) -> None:
        """After a cycle; ``depth``: a draft tree's depth (``drafted`` counts its nodes); ``batch``:
        the rows decoded (default: drafted + 1; more when padded or after a tree's uncached rows);
        ``cost_observed``: the decode carried other slots' rows too, and the scheduler told the
        cost model about the whole batch."""
        key = source or "plain"
        self.choices[key] = self.choices.get(key, 0) + 1
        cost = self.cost
        model = source is not None and (source == self.model or source == TREE)
        if cost is not None and not cost_observed:
            cost.observe_verify(batch or drafted + 1, verify_seconds)
            if model and source != TREE and drafted:
                cost.observe_drafter(drafter_steps or drafted, drafter_seconds)
        if model and drafted:  # a tree counts as a chain of its depth
            self.eagle_acc.observe(depth or drafted, accepted)
        self._observe_overhead(cycle_seconds - verify_seconds - drafter_seconds)

    def observe_plain(self, verify_seconds: float, cycle_seconds: float, cost_observed: bool = False) -> None:
        """After a plain step (one row, nothing drafted): what :meth:`observe` does with it, in
        the fewest steps (most cycles of most text; every rested one)."""
        choices = self.choices
        choices["plain"] += 1
        cost = self.cost
        if cost is not None and not cost_observed:
            cost.observe_step(verify_seconds)   # learned before the cost model is next read
        extra = cycle_seconds - verify_seconds   # _observe_overhead, inline (a call less each cycle)
        if extra > 0:
            self.overhead = extra if self.overhead == 0 else 0.9 * self.overhead + 0.1 * extra

    def _observe_overhead(self, extra: float) -> None:
        """A cycle's seconds outside the target and the drafter, into the running overhead."""
        if extra > 0:
            self.overhead = extra if self.overhead == 0 else 0.9 * self.overhead + 0.1 * extra
