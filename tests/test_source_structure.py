"""The shape of the draft sources (issue 41), checked so that it cannot come back unnoticed:

- no source is renamed on its way: the engine, the generation and the draft step never rewrite a
  source's word or name into another's (read from their syntax), and an MTP generation files its
  cycles, its policy choices and its learned acceptance under ``mtp``, not ``eagle``;
- a model source is one class and its registry line: registered from this test, it gets its own
  statistics class, and the policy weighs its proposal at its own ``cost(k)`` with no other module
  touched;
- the model drafters are composed, not inherited: every drafter is a ``ModelDrafter``, each kind's
  part extends only the ``DrafterKind`` interface, and no drafter is a sequence of itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import localspec
from localspec import Engine
from localspec.core.events import DoneEvent
from localspec.runtime.config import GenerationConfig
from localspec.speculation import assistant, dflash, drafter, eagle, mtp, registry
from localspec.speculation.costmodel import CostModel
from localspec.speculation.model_source import EagleSource
from localspec.speculation.policy import DraftPolicy, Learned, PolicyConfig
from localspec.speculation.sources import CLASSES, Proposal, register, registered, unregister
from mtp_models import build_mtp_target
from tiny_models import build_drafter, build_target

ROOT = Path(localspec.__file__).parent
# the modules a draft passes through between its source and the stats
CORE = ("runtime/engine.py", "runtime/generation.py", "runtime/drafting.py")
SOURCE_CONSTANTS = {"EAGLE", "LOOKUP", "MTP", "ASSISTANT", "DFLASH", "DSPARK", "PREDICTION"}
FLAT = {b: 0.010 + 0.00001 * b for b in range(1, 130)}   # a GPU's verify curve: rows nearly free


def _tree(rel: str) -> ast.AST:
    return ast.parse((ROOT / rel).read_text())


def _source_names() -> set[str]:
    return {s.name for s in registered()} | {s.word() for s in registered()}


@pytest.mark.parametrize("rel", CORE)
def test_no_module_of_the_core_rewrites_a_source_into_another(rel):
    """No ``replace(config, source=...)`` (the engine once turned ``mtp`` into ``eagle`` there), and
    the generation and the draft step name no source at all (they once turned ``eagle`` back into
    the drafter's name for the stats): a draft's ``source`` is what its source called it."""
    tree = _tree(rel)
    rewrites = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
                and any(kw.arg == "source" for kw in node.keywords)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "replace"]
    assert not rewrites, f"{rel}: a policy's source words rewritten at lines {rewrites}"
    if rel == "runtime/engine.py":
        return   # the engine names mtp, assistant, dflash, dspark in its refusals, never eagle
    names = _source_names()
    literals = [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names]
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
                if a.name in SOURCE_CONSTANTS]
    assert not literals and not imported, f"{rel} names sources: {literals} {imported}"


def test_the_engine_knows_no_eagle():
    tree = _tree("runtime/engine.py")
    assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value == "eagle"]
    assert not [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names if a.name == "EAGLE"]


def test_an_mtp_generation_files_everything_under_mtp(tmp_path):
    """Fixed MTP chains: the stats' sources, the policy's choices and the engine's learned
    acceptance are ``mtp``'s; EAGLE's class is untouched (it kept its prior)."""
    target = build_mtp_target(tmp_path / "mtp.gguf", heads=1)
    with Engine(target, n_ctx=512) as engine:
        prompt = "The quick brown fox jumps over the lazy dog. The quick brown"
        cfg = GenerationConfig(max_tokens=32, policy=PolicyConfig("fixed", 3, tree="off", source="mtp"))
        done = [e for e in engine.generate(prompt, cfg) if isinstance(e, DoneEvent)][0]
        learned = engine.learned
    stats = done.stats
    assert set(stats.sources) == {"mtp"} and stats.sources["mtp"][1] > 0, stats.sources
    assert stats.policy_choices.get("mtp", 0) > 0 and "eagle" not in stats.policy_choices, stats.policy_choices
    fresh = Learned()
    mtp_cls, eagle_cls = CLASSES.index("mtp", "drafter"), CLASSES.index("eagle", "drafter")
    assert learned.lookup[mtp_cls].seen != fresh.lookup[mtp_cls].seen   # it learned from its drafts
    assert learned.lookup[eagle_cls].seen == fresh.lookup[eagle_cls].seen   # EAGLE's is not its


class _Priced(EagleSource):
    """A model source declared here, outside the package: EAGLE's cycle, its own class, its own
    price per step."""

    name = "test-priced"
    classes = (("drafter", (0.95, 0.95)),)
    step = 1e-5

    def cost(self, k: int, cost_model=None) -> float:
        return k * self.step


class _Dear(_Priced):
    name = "test-dear"
    classes = (("drafter", (0.95, 0.95)),)
    step = 1.0


@pytest.fixture
def new_sources():
    for source in (_Priced, _Dear):
        register(source)
    yield
    for source in (_Priced, _Dear):
        unregister(source)


def test_a_new_model_source_is_one_class_and_its_registry_line(tmp_path, new_sources):
    """Registered here, the sources get classes of their own with their priors; the policy, made
    for one of them by name, weighs the proposal the source makes itself (its depth, its backlog,
    its ``cost(k)``): a cheap one drafts deep, a dear one is not worth a draft; and what it
    learns after a cycle goes to that source's class alone."""
    assert CLASSES.has("test-priced") and CLASSES[CLASSES.first("test-priced")].prior == (0.95, 0.95)
    assert "test-priced" not in {s.name for s in registry.BUILTIN}
    target = build_target(tmp_path / "t.gguf", "repeat")
    with Engine(target, build_drafter(tmp_path / "d.gguf", target, "repeat"), n_ctx=256) as engine:
        sequence = engine.drafters[0]
        tokens = engine.model.tokenize("a b c d e f")
        engine.ctx.seq_rm(0)
        engine.ctx.decode(tokens, 0, all_logits=True)
        sequence.begin(tokens, 0)
        sequence.observe(tokens[1:] + [tokens[-1]], len(tokens), 0)   # one backlog to catch up
        chosen = {}
        for cls in (_Priced, _Dear):
            policy = DraftPolicy(PolicyConfig("auto", 8), CostModel(FLAT, 0.0005), model=cls.name)
            source = cls(sequence, policy, engine.tree_calibration)
            proposal = source.proposal()
            assert isinstance(proposal, Proposal) and proposal.source == cls.name and proposal.backlog == len(tokens)
            assert proposal.cls == CLASSES.first(cls.name) and proposal.price(4) == cls.step * 4
            chosen[cls.name] = policy.choose(64, [proposal])
            if cls is _Priced:
                before = list(policy.lookup_acc[proposal.cls].seen)
                policy.observe(cls.name, 8, 3, verify_seconds=0.01, drafter_seconds=0.0001, cycle_seconds=0.011)
                assert policy.lookup_acc[proposal.cls].seen != before
                assert policy.lookup_acc[CLASSES.first("eagle")].seen == Learned().eagle.seen
        sequence.reset(0)
    source, k = chosen["test-priced"]
    assert source is not None and source.source == "test-priced" and k == 8, chosen
    assert chosen["test-dear"] == (None, 0), chosen


def test_the_policy_ranks_a_text_proposal_against_a_model_one():
    """Both weighed by their own class's acceptance and price: the model's sure, free drafts win
    over a short lookup match; a long copy (a deep class) wins over a model that is never right."""
    cheap = Proposal(EagleSource.name, CLASSES.first("eagle"), 16, lambda k: 1e-6 * k, 1)
    copy = Proposal("lookup", CLASSES.index("lookup", "match 64+"), 64)
    short = Proposal("lookup", CLASSES.index("lookup", "match 1"), 2)
    policy = DraftPolicy(PolicyConfig("auto", 8), CostModel(FLAT, 1e-6), eagle=True, lookup=True)
    for _ in range(30):
        policy.eagle_acc.observe(8, 8)
    assert policy.choose(100, [short, cheap])[0] is cheap
    policy = DraftPolicy(PolicyConfig("auto", 8), CostModel(FLAT, 1e-6), eagle=True, lookup=True)
    for _ in range(30):
        policy.eagle_acc.observe(8, 0)
        policy.observe_lookup(copy.cls, 64, 64)
    assert policy.choose(100, [copy, cheap])[0] is copy


def test_the_model_drafters_are_composed_not_inherited():
    """One backend for every model drafter; each kind's part extends only the interface; the
    opening functions return the backend, not a subclass of a sequence."""
    kinds = (eagle.EagleKind, mtp.MtpKind, assistant.AssistantKind, dflash.BlockKind)
    for kind in kinds:
        assert kind.__bases__ == (drafter.DrafterKind,), kind
    assert drafter.ModelDrafter.__bases__ == (object,) and drafter.DrafterSequence.__bases__ == (object,)
    assert assistant.AssistantSequence.__bases__ == (object,)
    assert dflash.BlockSequence.__bases__ == (drafter.DrafterSequence,)
    assert not issubclass(drafter.ModelDrafter, drafter.DrafterSequence)
    # no class in speculation/ extends a model drafter kind, the backend or a kind's sequence
    closed = {"ModelDrafter", "EagleKind", "MtpKind", "AssistantKind", "BlockKind", "AssistantSequence", "BlockSequence"}
    for path in (ROOT / "speculation").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                assert not bases & closed, f"{path.name}: {node.name} extends {bases & closed}"
    for opener in (eagle.EagleDrafter, mtp.MtpDrafter, assistant.AssistantDrafter, dflash.BlockDrafter):
        assert opener.__annotations__["return"] in ("ModelDrafter", drafter.ModelDrafter), opener


def test_an_engine_s_drafter_is_the_backend_and_its_slots_are_sequences(tmp_path):
    target = build_target(tmp_path / "t.gguf", "repeat")
    with Engine(target, build_drafter(tmp_path / "d.gguf", target, "repeat"), n_ctx=256, parallel=2) as engine:
        assert type(engine.drafter) is drafter.ModelDrafter and isinstance(engine.drafter.kind, eagle.EagleKind)
        assert [type(s) for s in engine.drafters] == [drafter.DrafterSequence] * 2
        assert [s.seq for s in engine.drafters] == [0, 1] and engine.drafters[0] is engine.drafter.for_sequence(0)
