"""The memory package's layering: the planner is pure (no llama.cpp, no printing), the engine and
the memory package do not import each other, one size formatter reads back with parse_size, and a
context the memory plan had to shrink reaches the chat as data, never as stderr output."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.core.errors import LocalspecError
from localspec.core.units import GiB, KiB, MiB, TiB, format_size, parse_size
from localspec.llama import contexts
from import_graph import import_graph, imports, modules, reaches

PACKAGE = Path(__file__).resolve().parent.parent / "localspec"
MEMORY = PACKAGE / "memory"


# -- imports ---------------------------------------------------------------------------------------
def _imports(path: Path) -> set[str]:
    """The localspec modules ``path`` imports, at module level or inside functions."""
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    return imports(name, path, modules())


def test_the_runtime_never_imports_the_memory_package():
    graph = import_graph()
    for low in ("localspec.runtime.engine", "localspec.llama.contexts", "localspec.llama.llama_model",
                "localspec.speculation.eagle", "localspec.core.units"):
        assert reaches(graph, low, "localspec.memory") is None, reaches(graph, low, "localspec.memory")


def test_no_import_circle_through_the_memory_package():
    graph = import_graph()
    for name in graph:
        if name.startswith("localspec.memory") or name == "localspec.llama.contexts":
            for dep in graph[name]:
                back = reaches(graph, dep, name)
                assert back is None or back[-1] != name, f"{name} -> {' -> '.join(back)}"


def test_one_way_from_a_model_to_an_engine():
    """The CLI, the chat and the server open their engines through runtime/loading.load_engine: no
    other shipped module builds an Engine or a memory plan for one itself."""
    from import_graph import modules as all_modules

    builders = []
    for name, path in all_modules().items():
        if name in ("localspec.runtime.loading", "localspec.memory.pair", "localspec.memory"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                if called in ("Engine", "plan_engine"):
                    builders.append(f"{name}:{node.lineno}: {called}(...)")
    assert builders == []
    graph = import_graph()
    for user in ("localspec.cli.common", "localspec.cli.chat", "localspec.server.models_manager"):
        assert "localspec.runtime.loading" in graph[user], user


def test_the_shared_context_shapes_are_what_the_runtime_uses():
    from localspec.speculation import tree

    assert contexts.target_context(True)["n_seq_max"] == 1 + tree.MAX_NODES
    assert contexts.target_context(False) == {}
    assert contexts.DRAFTER_TREE_SEQS == tree.MAX_WIDTH   # the drafter context's sequences: a tree's branches
    # auto's deepest lookup draft 128 + 1 (issue 17; was 33: draft-max 32 + 1, a 32-node tree + its root)
    assert contexts.VERIFY_OUTPUTS_MAX == 129
    assert _imports(PACKAGE / "llama" / "contexts.py") <= {"localspec.core", "localspec.core.options"}


def test_the_planner_loads_no_llama_cpp():
    code = ("import sys; import localspec.memory.planner as p; import localspec.memory; "
            "assert p.plan_memory and 'llama_cpp' not in sys.modules, sorted(m for m in sys.modules if 'llama' in m)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_the_memory_package_never_prints():
    """Library code returns notes; only the CLI prints them (no print, no sys.stderr/stdout)."""
    for path in MEMORY.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "print", f"{path.name}:{node.lineno} prints"
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys":
                assert node.attr not in ("stderr", "stdout"), f"{path.name}:{node.lineno} writes to sys.{node.attr}"


# -- sizes ---------------------------------------------------------------------------------------
def test_format_size():
    assert format_size(0) == "0 B" and format_size(512) == "512 B" and format_size(1023) == "1023 B"
    assert format_size(2048) == "2.0 KiB" and format_size(3 * GiB) == "3.0 GiB"
    assert format_size(1536 * MiB) == "1.5 GiB" and format_size(5 * TiB) == "5.0 TiB"
    assert format_size(2048 * TiB) == "2048.0 TiB"
    assert format_size(-1.5 * MiB) == "-1.5 MiB"        # `localspec fit`: free after, over budget
    assert format_size(None) == "—"


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=1 << 52))
def test_parse_size_reads_format_size_back(n):
    text = format_size(n)
    unit = {"B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB}[text.split()[1]]
    assert abs(parse_size(text) - n) <= 0.05 * unit + 1


def test_parse_size_rejects_what_it_cannot_read():
    for bad in ("", "G", "-1G", "1.5.2M", "12XB", "9" * 30 + "T"):
        with pytest.raises(LocalspecError):
            parse_size(bad)


# -- a shrunk context is data ----------------------------------------------------------------------
def _shrinking_budget(target: Path) -> int:
    """A RAM budget in which the target fits at a small context but not at 4096, whatever the KV type."""
    from localspec.memory.pair import plan_files

    at_4096 = min(plan_files(target, None, n_ctx=4096, kv_type=kv, ram=1 << 40).total_bytes
                  for kv in ("f16", "q8_0", "q4_0"))
    at_512 = plan_files(target, None, n_ctx=512, ram=1 << 40).total_bytes
    assert at_512 < at_4096
    return int((at_512 + at_4096) / 2 / 0.95)


def test_plan_engine_returns_the_context_note_and_prints_nothing(smollm2, capfd):
    from localspec.memory.pair import plan_engine
    from localspec.store.models import ModelSpec

    budget = _shrinking_budget(smollm2)
    capfd.readouterr()
    options = plan_engine(ModelSpec("t", smollm2), n_ctx=4096, n_threads=1, ram=budget)
    out, err = capfd.readouterr()
    plan = options["memory_plan"]
    assert plan.fits and plan.n_ctx < 4096 and options["n_ctx"] == plan.n_ctx and plan.requested_n_ctx == 4096
    assert plan.context_note == (f"context 4096 does not fit the memory budget; using {plan.n_ctx} "
                                 f"({plan.kv_type} KV)")
    assert out == "" and "memory budget" not in err
    kept = plan_engine(ModelSpec("t", smollm2), n_ctx=512, n_threads=1, ram=budget)["memory_plan"]
    assert kept.n_ctx == 512 and kept.context_note is None


def test_the_chat_shows_the_context_note_and_nothing_reaches_stderr(smollm2, capfd):
    """The chat plans its engine in a worker thread: the note is shown in the chat, not printed."""
    from localspec.cli.chat import engine_factory
    from localspec.store.conversations import ConversationStore
    from localspec.store.models import ModelSpec
    from localspec.tui.app import ChatApp, ChatSettings

    budget = _shrinking_budget(smollm2)
    factory = engine_factory(ModelSpec("smollm2", smollm2), ctx=4096, threads=1, ram=budget)
    store = ConversationStore()
    capfd.readouterr()
    notes: list[str] = []

    async def go():
        app = ChatApp(factory, model_name="smollm2", store=store, settings=ChatSettings(max_tokens=4))
        async with app.run_test(size=(100, 30)) as pilot:
            deadline = time.monotonic() + 60
            while app.engine is None and app.load_error is None:
                assert time.monotonic() < deadline, "the engine did not load"
                await pilot.pause(0.05)
            await pilot.pause()
            assert app.engine is not None, app.load_error
            assert app.engine.n_ctx < 4096
            notes.extend(str(w.render()) for w in app.query(".note"))

    try:
        asyncio.run(go())
    finally:
        store.close()
    out, err = capfd.readouterr()
    assert any("context 4096 does not fit the memory budget" in n for n in notes), notes
    assert "memory budget" not in err and "note:" not in err
