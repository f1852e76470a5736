"""Reading an installed engine release's source as text and as `ast`, never importing it: where a
metric is defined, which functions move it, and under which conditions.

A metric is found by its name literal (`name="sglang:..."`, or the first argument) in a call of a
prometheus_client class; the attribute it is assigned to (`self.counter_x = Counter(...)`) is then
followed to every `.inc(` / `.observe(` / `.set(` on it, and to each enclosing function."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MOVERS = {"inc", "observe", "set", "dec"}


@dataclass(frozen=True)
class Site:
    """One place in the release: its file (relative to the package root) and the qualified
    name of the function (Class.method) that holds it."""

    file: str
    func: str
    node: ast.AST

    def __str__(self) -> str:
        return f"{self.file}: {self.func} (line {getattr(self.node, 'lineno', '?')})"


class Release:
    """One installed package (e.g. site-packages/sglang) read as source."""

    def __init__(self, root: Path, version: str):
        self.root, self.version = root, version

    def __repr__(self) -> str:
        return f"{self.root.name} {self.version} at {self.root}"

    def text(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")

    def tree(self, rel: str) -> ast.Module:
        return _parse(str(self.root / rel))

    def files_with(self, needle: str) -> list[str]:
        """The package's .py files whose text holds `needle`, relative to its root."""
        return [rel for rel, text in _texts(str(self.root)) if needle in text]

    # -- functions
    def functions(self, rel: str) -> dict[str, ast.AST]:
        """Qualified name (Class.method, nested functions as outer.inner) -> node, of a file."""
        return _functions(str(self.root / rel))

    def function(self, rel: str, qualname: str) -> ast.AST:
        funcs = self.functions(rel)
        assert qualname in funcs, f"{qualname} is not defined in {rel} of {self}"
        return funcs[qualname]

    def enclosing(self, rel: str, node: ast.AST) -> str:
        """The qualified name of the innermost function of `rel` that holds `node`."""
        best, size = "<module>", None
        for name, f in self.functions(rel).items():
            if f.lineno <= node.lineno <= f.end_lineno:
                span = f.end_lineno - f.lineno
                if size is None or span < size:
                    best, size = name, span
        return best

    # -- metrics
    def metric_definitions(self, name: str) -> list[tuple[Site, str, str]]:
        """(where, prometheus_client class, the attribute it is assigned to) of each definition
        of the metric named `name`."""
        out = []
        for rel in self.files_with(f'"{name}"'):
            for node in ast.walk(self.tree(rel)):
                if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                    continue
                call = node.value
                if _name_arg(call) != name:
                    continue
                target = node.targets[0]
                attr = target.attr if isinstance(target, ast.Attribute) else getattr(
                    target, "id", "?")
                out.append((Site(rel, self.enclosing(rel, node), node), _callee(call), attr))
        return out

    def movers(self, attr: str, only: set[str] = MOVERS) -> list[Site]:
        """Every `<...>.attr[...].<mover>(` call (a mover of `only`), through .labels(...) and
        [engine_idx] subscripts."""
        out = []
        for rel in self.files_with(f".{attr}"):
            tree = self.tree(rel)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in only and _reaches_attr(node.func.value, attr):
                    out.append(Site(rel, self.enclosing(rel, node), node))
        return out

    def calls(self, func_name: str, files: list[str] | None = None) -> list[Site]:
        """Every call of a method or function named `func_name` (in `files`, else in every file
        that names it)."""
        out = []
        for rel in self.files_with(func_name) if files is None else files:
            for node in ast.walk(self.tree(rel)):
                if isinstance(node, ast.Call) and _call_name(node) == func_name:
                    out.append(Site(rel, self.enclosing(rel, node), node))
        return out

    def conditions(self, site: Site) -> list[str]:
        """The source of every `if` test that encloses `site` inside its function (outermost
        first), `not (...)` for an else branch."""
        func = self.function(site.file, site.func) if site.func != "<module>" else \
            self.tree(site.file)
        src = self.text(site.file)
        out: list[str] = []

        def walk(node, path):
            for child in ast.iter_child_nodes(node):
                if child is site.node:
                    out.extend(path)
                    return True
                extra = []
                if isinstance(node, ast.If) and child in node.body:
                    extra = [ast.get_source_segment(src, node.test)]
                elif isinstance(node, ast.If) and child in node.orelse:
                    extra = [f"not ({ast.get_source_segment(src, node.test)})"]
                if walk(child, path + extra):
                    return True
            return False
        walk(func, [])
        return out


def string_constants(tree: ast.AST) -> list[str]:
    """Every str constant of a tree, the literal parts of f-strings included."""
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def env_default(release: Release, rel: str, var: str) -> ast.Call:
    """The EnvBool(...)/EnvInt(...) call that declares `var` in the release's environ module."""
    for node in ast.walk(release.tree(rel)):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == var
                                                for t in node.targets):
            assert isinstance(node.value, ast.Call), ast.dump(node)
            return node.value
    raise AssertionError(f"{var} is not declared in {rel} of {release}")


def installed(site_packages: Path, package: str) -> Release:
    """The installed package and its version (from its dist-info), or a failure that says
    which setup script makes it."""
    root = site_packages / package
    assert root.is_dir(), f"{package} is not installed under {site_packages}"
    infos = sorted(site_packages.glob(f"{package}-*.dist-info"))
    assert infos, f"no {package}-*.dist-info under {site_packages}"
    version = re.search(r"^Version: (\S+)$", (infos[-1] / "METADATA").read_text(), re.M)
    return Release(root, version.group(1))


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    assert found, f"no site-packages under {venv}"
    return found[-1]


# ---------------------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _texts(root: str) -> tuple[tuple[str, str], ...]:
    """(relative path, text) of every .py file of the package, read once."""
    out = []
    for p in sorted(Path(root).rglob("*.py")):
        try:
            out.append((str(p.relative_to(root)), p.read_text(encoding="utf-8",
                                                              errors="replace")))
        except OSError:
            continue
    return tuple(out)


def logged(constant: str) -> str:
    """A logging format string as a line shows it: each %-placeholder filled with 1.5."""
    return re.sub(r"%[-#0-9.]*[sdfrg]", "1.5", constant)


def printed_by(release: "Release", pattern: str) -> list[str]:
    """Each top-level alternative of `pattern` that no string of the release (as logged)
    matches: [] when every one is printed somewhere."""
    missing = []
    for alt in pattern.split("|"):
        # only the files that hold the alternative's longest literal run are parsed
        runs = re.findall(r"[A-Za-z][A-Za-z ]{3,}[A-Za-z]", alt)
        files = release.files_with(max(runs, key=len)) if runs else []
        consts = [logged(c) for rel in files for c in string_constants(release.tree(rel))]
        if not any(re.search(alt, c) for c in consts):
            missing.append(alt)
    return missing


@lru_cache(maxsize=None)
def _parse(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


@lru_cache(maxsize=None)
def _functions(path: str) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out[q] = child
                visit(child, q + ".")
            else:
                visit(child, prefix)
    visit(_parse(path), "")
    return out


def _name_arg(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "name" and isinstance(kw.value, ast.Constant):
            return kw.value.value
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value,
                                                                            str):
        return call.args[0].value
    return None


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "?")


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)


def _reaches_attr(node: ast.AST, attr: str) -> bool:
    """Whether `node` is `<x>.attr`, optionally followed by .labels(...) calls and
    subscripts."""
    while True:
        if isinstance(node, ast.Attribute) and node.attr == attr:
            return True
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "labels":
            node = node.func.value
        else:
            return False


def version_tuple(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


assert sys.version_info >= (3, 8)  # ast.get_source_segment, end_lineno
