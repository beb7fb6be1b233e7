"""The package's import graph (see tests/import_graph.py; lazy imports inside functions count): no
circles, and docs/architecture.md's layer table holds: each package imports only what its row's
``imports`` column names, all of it above the row."""

from __future__ import annotations

from import_graph import circles, import_graph, imports, layer_breaches, layer_table, package_of

TABLE = """
| package | owns | imports |
|---|---|---|
| `localspec/core/` | shared | nothing of localspec |
| `localspec/formats/` | files | core |
| `converters/` (`localspec.converters`) | checkpoints | core, formats |
| `localspec/store/` | models | core, formats, converters |
| `localspec/cli/` | commands | everything above it |
"""


def test_the_graph_is_read():
    graph = import_graph()
    assert "localspec.runtime.engine" in graph
    assert "localspec.core.errors" in graph["localspec.runtime.engine"]


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_layer_table_is_read():
    rows = dict(layer_table())
    assert rows["core"] == set() and rows["llama"] == {"core"}
    assert "speculation" in rows["runtime"] and rows["cli"] is None and rows["localspec"] is None
    assert [name for name, _ in layer_table(TABLE)] == ["core", "formats", "converters", "store", "cli"]
    assert package_of("localspec.converters.layouts.base") == "converters"
    assert package_of("localspec.tui.screens.settings") == "tui" and package_of("localspec.core") == "core"
    assert package_of("localspec") == package_of("localspec.__main__") == "localspec"


def test_a_breach_is_found(tmp_path):
    """An import the column does not name (at module level or inside a function), a package with
    no row, and a column naming a row below its own: each is reported."""
    pkg = tmp_path / "localspec" / "core"
    pkg.mkdir(parents=True)
    (pkg / "paths.py").write_text("def default_target():\n    from ..formats.quantize import requantize\n")
    known = {"localspec.core.paths", "localspec.formats.quantize", "localspec.store.hub",
             "localspec.converters.checkpoint", "localspec.cli.app"}
    graph = {"localspec.core.paths": imports("localspec.core.paths", pkg / "paths.py", known),
             "localspec.converters.checkpoint": {"localspec.store.hub"},
             "localspec.cli.app": {"localspec.store.hub", "localspec.converters.checkpoint"},
             "localspec.server.app": set()}
    table = layer_table(TABLE)
    assert layer_breaches(graph, table) == [
        "localspec.converters.checkpoint imports localspec.store.hub: converters may import core, formats",
        "localspec.core.paths imports localspec.formats.quantize: core may import nothing of localspec",
        "localspec.server.app: its package server has no row in the table",
    ]
    upside_down = table[:1] + [("formats", {"core", "store"})] + table[2:]
    assert layer_breaches({}, upside_down) == ["the table's formats row names store, which is not a row above it"]


def test_the_layer_table_holds():
    found = layer_breaches(import_graph(), layer_table())
    assert not found, "imports the layer table (docs/architecture.md) does not allow:\n" + "\n".join(found)
