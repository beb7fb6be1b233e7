"""The core's shape (issue 41): no module calls back into the module that created it.

The engine makes the scheduler and hands it a :class:`~localspec.runtime.scheduler.SlotHost`
(open a generation, claim the engine, tick the threads, record a batch, the drafter's steps), never
itself: the scheduler's module neither imports the engine nor names it, and reads of its host only
the fields ``SlotHost`` declares. More generally, no module of ``runtime/`` hands its own ``self``
to what it imports (the callee would hold its maker and call back into it). Checked on the source
(AST), then on a real engine.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import localspec
from localspec.runtime.engine import Engine
from localspec.runtime.scheduler import Scheduler, SlotHost

RUNTIME = Path(localspec.__file__).parent / "runtime"
ENGINE_NAMES = {"engine", "Engine"}


def engine_references(tree: ast.AST) -> list[str]:
    """Every import of the engine's module, and every name, attribute or parameter spelled
    ``engine``/``Engine`` in the code (docstrings and comments aside), as ``line: what``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = ("." * node.level) + (node.module or "")
            names = {a.name for a in node.names}
            if module.endswith("engine") or names & ENGINE_NAMES:
                found.append(f"{node.lineno}: from {module} import {', '.join(sorted(names))}")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.endswith(".engine")]
        elif isinstance(node, ast.Name) and node.id in ENGINE_NAMES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in ENGINE_NAMES:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.arg) and node.arg in ENGINE_NAMES:
            found.append(f"{node.lineno}: parameter {node.arg}")
    return found


def host_reads(tree: ast.AST) -> set[str]:
    """The attributes the code reads of its host (``self.host.X`` or ``host.X``)."""
    reads = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            inner = node.value
            if (isinstance(inner, ast.Attribute) and inner.attr == "host" and isinstance(inner.value, ast.Name)
                    and inner.value.id == "self") or (isinstance(inner, ast.Name) and inner.id == "host"):
                reads.add(node.attr)
    return reads


def self_handed(tree: ast.AST) -> list[str]:
    """Calls that hand the caller's own ``self`` to something the module imported from localspec
    (a class it makes, a function it asks), as ``line: call``."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").startswith("localspec")):
            imported |= {a.asname or a.name for a in node.names}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        root = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        arguments = list(node.args) + [k.value for k in node.keywords]
        if isinstance(root, ast.Name) and root.id in imported and any(
                isinstance(a, ast.Name) and a.id == "self" for a in arguments):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def _parse(name: str) -> ast.AST:
    return ast.parse((RUNTIME / name).read_text(), filename=name)


# -- the checks find what they look for ---------------------------------------------------------
TWO_WAY = '''
from .engine import Engine
from .scheduler import Scheduler
from . import threads


class Driver:
    def __init__(self, engine: "Engine") -> None:
        self.engine = engine

    def admit(self):
        return self.engine.open_slot()


class Maker:
    def make(self):
        self.threads = threads.adaptive(self, 2)
        return Scheduler(self, slots=1), Scheduler(host=self)
'''


def test_a_reference_to_the_engine_is_found():
    assert engine_references(ast.parse(TWO_WAY)) == [
        "2: from .engine import Engine", "8: parameter engine", "9: .engine", "9: engine", "12: .engine"]


def test_a_module_handing_itself_on_is_found():
    assert self_handed(ast.parse(TWO_WAY)) == [
        "17: threads.adaptive(self, 2)", "18: Scheduler(self, slots=1)", "18: Scheduler(host=self)"]


def test_host_reads_are_found():
    source = "class S:\n    def f(self, host):\n        return self.host.ctx, host.claim(), self.other.x\n"
    assert host_reads(ast.parse(source)) == {"ctx", "claim"}


# -- the package holds them ---------------------------------------------------------------------------
def test_the_scheduler_knows_no_engine():
    found = engine_references(_parse("scheduler.py"))
    assert not found, "runtime/scheduler.py reaches the engine that makes it:\n" + "\n".join(found)


def test_the_scheduler_uses_only_its_host():
    """What the scheduler reads of its host is what SlotHost declares, and its constructor takes one."""
    tree = _parse("scheduler.py")
    fields = {f.name for f in dataclasses.fields(SlotHost)}
    reads = host_reads(tree)
    assert reads and reads <= fields, f"read of the host but not a SlotHost field: {sorted(reads - fields)}"
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__"
                and any(isinstance(c, ast.ClassDef) and c.name == "Scheduler" and n in c.body for c in ast.walk(tree)))
    first = init.args.args[1]
    assert first.arg == "host" and ast.unparse(first.annotation) == "SlotHost"


def test_no_runtime_module_hands_itself_to_what_it_makes():
    found = [f"runtime/{path.name}:{hit}" for path in sorted(RUNTIME.glob("*.py"))
             for hit in self_handed(ast.parse(path.read_text()))]
    assert not found, "a module hands its own self on (the callee would call back into it):\n" + "\n".join(found)


def test_an_engine_hands_its_scheduler_a_slot_host(smollm2):
    """On a real engine: the scheduler holds a SlotHost, whose data are the context, verifiers and
    drafter sequences (no engine among them, nor among the scheduler's own attributes)."""
    with Engine(smollm2, n_ctx=256, n_threads=1) as engine:
        scheduler = engine.scheduler()
        assert isinstance(scheduler, Scheduler) and type(scheduler.host) is SlotHost
        data = [getattr(scheduler.host, f) for f in ("ctx", "verifiers", "drafters")]
        assert data[0] is engine.ctx and list(data[1]) == engine.verifiers
        values = list(vars(scheduler).values()) + data + [x for seq in data[1:] for x in seq]
        assert not any(isinstance(v, Engine) for v in values)
        assert scheduler.host.draft_steps is None   # SmolLM2 alone: no model drafter
