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


# -- the layer table (docs/architecture.md) ------------------------------------------------------
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROOT_PACKAGE = "localspec"          # the table's row for localspec/__init__.py and __main__.py
EVERYTHING_ABOVE = "everything above it"
NOTHING = "nothing of localspec"


def layer_table(text: str | None = None) -> list[tuple[str, set[str] | None]]:
    """The rows of docs/architecture.md's package table in order: (package, the packages its
    ``imports`` column names; None for "everything above it"). A package is named by its folder:
    ``localspec/core/`` -> ``core``, ``converters/`` -> ``converters``, ``localspec`` -> itself."""
    text = ARCHITECTURE.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.replace(" ", "") == "|package|owns|imports|")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        first = cells[0].split("`")[1]
        name = first.strip("/").removeprefix("localspec/") if first != ROOT_PACKAGE else ROOT_PACKAGE
        column = cells[-1]
        if column == EVERYTHING_ABOVE:
            allowed = None
        elif column == NOTHING:
            allowed = set()
        else:
            allowed = {w.strip() for w in column.split(",")}
        rows.append((name, allowed))
    return rows


def package_of(module: str) -> str:
    """The table's package of a module: ``localspec.runtime.engine`` -> ``runtime``,
    ``localspec.converters.layouts.base`` -> ``converters``, ``localspec`` and
    ``localspec.__main__`` -> ``localspec``."""
    parts = module.split(".")
    if len(parts) < 2:
        return ROOT_PACKAGE
    if parts[1] in ("converters", "tui") or (ROOT / "localspec" / parts[1]).is_dir():
        return parts[1]
    return ROOT_PACKAGE


def layer_breaches(graph: dict[str, set[str]], table: list[tuple[str, set[str] | None]]) -> list[str]:
    """Every import of ``graph`` (module -> modules) that the table's ``imports`` column does not
    allow; every column naming a package that is not a row above its own; every package without a row."""
    out, allowed, above = [], {}, []
    for name, names in table:
        if names is not None:
            out += [f"the table's {name} row names {n}, which is not a row above it" for n in sorted(names - set(above))]
        allowed[name] = set(above) if names is None else names
        above.append(name)
    for module, deps in sorted(graph.items()):
        mine = package_of(module)
        if mine not in allowed:
            out.append(f"{module}: its package {mine} has no row in the table")
            continue
        for dep in sorted(deps):
            theirs = package_of(dep)
            if theirs != mine and theirs not in allowed[mine]:
                out.append(f"{module} imports {dep}: {mine} may import "
                           f"{', '.join(sorted(allowed[mine])) or 'nothing of localspec'}")
    return out
