"""The model store's layers, checked from the source (AST, imports inside functions included):
storage (registry), resolution (models), downloads (hub), installation (install) import each other
in one direction only, and every file or directory is written through core/atomic.py."""

from __future__ import annotations

import ast
from pathlib import Path

from import_graph import circles, import_graph, imports, modules

ROOT = Path(__file__).resolve().parents[1]
STORE = "localspec.store"


def test_the_checker_sees_a_circle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "localspec" / "store"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    known = {"localspec.store.a", "localspec.store.b"}
    graph = {m: imports(m, pkg / f"{m.rsplit('.', 1)[1]}.py", known) for m in known}
    assert circles(graph) == [sorted(known)]


def test_no_import_circle_through_the_store_or_the_converters():
    graph = import_graph()
    assert {"localspec.store.registry", "localspec.store.hub", "localspec.converters.checkpoint"} <= set(graph)
    bad = [c for c in circles(graph)
           if any(m.startswith((STORE + ".", "localspec.converters")) for m in c)]
    assert bad == []


def test_store_layers_import_downwards_only():
    graph = import_graph()
    below = {   # what each layer must not import (directly or inside a function)
        "registry": {"models", "hub", "install", "repo_files"},   # storage: records and the catalog
        "models": {"hub", "install"},                              # resolution: a name -> files
        "hub": {"registry", "models", "install"},                  # downloads: never writes the registry
        "repo_files": {"registry", "models", "hub", "install"},    # pure rules over a listing
        "checkpoint_repair": {"registry", "models", "hub", "install"},
    }
    for layer, forbidden in below.items():
        imported = {m.rsplit(".", 1)[1] for m in graph[f"{STORE}.{layer}"] if m.startswith(STORE + ".")}
        assert not imported & forbidden, (layer, imported & forbidden)
    # the converters sit below the store: a repo id is fetched by the download their caller passes
    assert not any(m.startswith(STORE) for name, deps in graph.items() if name.startswith("localspec.converters")
                   for m in deps)


# calls that move a file into place: only core/atomic.py makes them
RENAMES = {("os", "replace"), ("os", "rename"), ("os", "renames"), ("shutil", "move"),
           ("tempfile", "mkstemp"), ("tempfile", "NamedTemporaryFile")}


def test_only_core_atomic_renames_files_into_place():
    offenders = []
    for name, path in modules().items():
        if name == "localspec.core.atomic":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and (node.value.id, node.attr) in RENAMES:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module in ("os", "shutil", "tempfile"):
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {a.name}"
                              for a in node.names if (node.module, a.name) in RENAMES]
    assert offenders == []


def test_only_the_hub_module_downloads():
    """One download path: huggingface_hub's download functions are named only in store/hub.py."""
    downloads = {"hf_hub_download", "snapshot_download", "hf_hub_url"}
    offenders = []
    for name, path in modules().items():
        if name == f"{STORE}.hub":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            used = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                    else None)
            if isinstance(node, ast.ImportFrom):
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: import {a.name}"
                              for a in node.names if a.name in downloads]
            elif used in downloads:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {used}")
    assert offenders == []
