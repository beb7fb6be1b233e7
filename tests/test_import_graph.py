"""The package's import graph has no circles, lazy imports inside functions included
(see tests/import_graph.py)."""

from __future__ import annotations

from import_graph import circles, import_graph


def test_the_graph_is_read():
    graph = import_graph()
    assert "localspec.runtime.engine" in graph
    assert "localspec.core.errors" in graph["localspec.runtime.engine"]


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)
