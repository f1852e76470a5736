"""No import cycle inside hpcserve: plan-time, render-time, operation-time and in-job code each
live in modules of their own, so no side needs another's module to be half-imported first.

The source is read with `ast`, never imported: every import counts, also one inside a function
(imported lazily, to dodge a cycle at import time) and one under `if TYPE_CHECKING:` (a cycle
for type checkers and for a reader, whatever Python does at run time).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def modules(root: Path, package: str) -> dict[str, tuple[Path, str]]:
    """Every module of `package` under `root`: dotted name -> (file, the package its relative
    imports start from)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
            out[".".join(parts)] = (path, ".".join(parts))
        else:
            out[".".join(parts)] = (path, ".".join(parts[:-1]))
    return out


def _owner(name: str, mods: dict) -> str | None:
    """The module that defines `name`: itself, else its nearest enclosing module."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, base: str, package: str, mods: dict) -> set[str | None]:
    if isinstance(node, ast.Import):
        return {_owner(a.name, mods) for a in node.names
                if a.name == package or a.name.startswith(package + ".")}
    if not isinstance(node, ast.ImportFrom):
        return set()
    if node.level:
        up = base.split(".")
        up = up[:max(0, len(up) - (node.level - 1))]
        mod = ".".join(up + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod != package and not mod.startswith(package + "."):
        return set()
    # `from pkg import name`: the module pkg.name where there is one, else pkg itself
    return {f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else _owner(mod, mods)
            for a in node.names}


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the modules of `package` it imports anywhere in its file."""
    mods = modules(root, package)
    graph = {}
    for name, (path, base) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        deps: set[str | None] = set()
        for node in ast.walk(tree):
            deps |= _targets(node, base, package, mods)
        graph[name] = {d for d in deps if d is not None and d != name}
    return graph


def _shortest_path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    came: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        cur = todo.popleft()
        for nxt in sorted(graph.get(cur, ())):
            if nxt == goal:
                path = [cur]
                while came[path[-1]] is not None:
                    path.append(came[path[-1]])
                return path[::-1]
            if nxt not in came:
                came[nxt] = cur
                todo.append(nxt)
    return None


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """For every module that can reach itself, the shortest such cycle, as `a -> b -> a`
    (each cycle once, starting at its smallest name)."""
    found = set()
    for m in graph:
        path = _shortest_path(graph, m, m)
        if path:
            i = path.index(min(path))
            ring = path[i:] + path[:i]
            found.add(" -> ".join(ring + ring[:1]))
    return sorted(found)


def test_hpcserve_has_no_import_cycle():
    graph = import_graph(ROOT, "hpcserve")
    assert "hpcserve.author.render" in graph and graph["hpcserve.author.render"], "no modules were read"
    found = cycles(graph)
    assert not found, "import cycles in hpcserve:\n  " + "\n  ".join(found)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return tmp_path


def test_the_detector_sees_lazy_and_type_only_imports(tmp_path):
    root = _tree(tmp_path, {
        "pkg/__init__.py": "VERSION = '1'\n",
        "pkg/a.py": "from . import b\n",
        # a lazy import, relative to the parent package
        "pkg/sub/__init__.py": "",
        "pkg/b.py": "def f():\n    from .sub.c import g\n    return g\n",
        # type-only, absolute, `from pkg import name` where name is a module
        "pkg/sub/c.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                         "    from pkg import a\ndef g(): ...\n"),
        # `from pkg import name` where name is not a module: an edge to pkg itself
        "pkg/d.py": "from pkg import VERSION\nfrom ..outside import x\nimport os\n",
    })
    graph = import_graph(root, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"},
                     "pkg.sub": set(), "pkg.sub.c": {"pkg.a"}, "pkg.d": {"pkg"}}
    assert cycles(graph) == ["pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"]


def test_the_detector_passes_a_tree_without_cycles(tmp_path):
    root = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .b import x\n",
                            "pkg/b.py": "import pkg.c\nx = 1\n", "pkg/c.py": ""})
    graph = import_graph(root, "pkg")
    assert graph["pkg.b"] == {"pkg.c"}
    assert cycles(graph) == []
