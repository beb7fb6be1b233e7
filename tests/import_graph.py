"""The package's import graph, read from the source with :mod:`ast` (nothing is imported), for
the tests that check the layers: imports inside functions count, and so do those under
``if TYPE_CHECKING:`` (an annotation that needs a circle to name its type is a circle too)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = {"localspec": ROOT / "localspec", "localspec.converters": ROOT / "converters",
                "localspec.tui": ROOT / "tui"}


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def imports(name: str, path: Path, known: dict[str, Path] | set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports anywhere in its file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif target in known:
                    found.add(target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, found) for name, path in found.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def reaches(graph: dict[str, set[str]], start: str, goal_prefix: str) -> list[str] | None:
    """A path of imports from ``start`` to a module under ``goal_prefix``, or None."""
    seen, stack = {start}, [[start]]
    while stack:
        path = stack.pop()
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt.startswith(goal_prefix):
                return path + [nxt]
            if nxt not in seen:
                seen.add(nxt)
                stack.append(path + [nxt])
    return None
