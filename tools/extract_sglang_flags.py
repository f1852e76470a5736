#!/usr/bin/env python3
"""Extract SGLang's launch_server flag matrix from released wheels, statically.

For every version in ``VERSIONS`` this downloads the wheel (``pip download --no-deps``; cached),
reads ``sglang/srt/server_args.py`` and the modules it draws on straight out of the zip, and
rebuilds -- with ``ast`` only, never importing SGLang -- what ``ServerArgs.add_cli_args(parser)``
registers:

* every literal ``parser.add_argument("--x", "--alias", ...)`` call in ``ServerArgs.add_cli_args``
  (the only place any examined version calls ``add_argument`` for the server parser);
* from 0.5.16 on, the flags ``add_cli_args_from_dataclass(parser, ServerArgs)`` derives from the
  annotated fields ``name: A[T, "help"]`` / ``name: A[T, Arg(...)]`` of ``ServerArgs`` (0.5.16) or
  of the namespace classes fed to ``collect_input_fields`` (``arg_groups/fields/*.py``, 0.5.20+),
  following ``arg_utils`` exactly: flag ``--field-name`` (or ``Arg.cli_name``) plus
  ``Arg.aliases``; ``Arg(no_cli=True)`` and fields without a help string/``Arg`` are skipped;
  ``choices`` from ``Arg.choices`` or a ``Literal[...]`` type;
* ``action=argparse.BooleanOptionalAction`` adds the ``--no-<flag>`` spelling of every flag.

``choices`` are resolved by a small static evaluator (literals, module constants across imports,
class attributes, dict keys, enum members, list comprehensions, simple helper functions).
Options whose choices cannot be resolved statically are listed under ``choices_unresolved``.
A flag is "deprecated" when its action is one of SGLang's ``Deprecated*Action`` classes or its
help text announces it ("Deprecated. ...", "(Deprecated: ...", "[Deprecated] ...", "This flag is
deprecated ...").

argparse's own ``-h/--help`` is not listed. The result for 0.5.23 is checked against the real
parser by ``tests/engine_parsers/test_parsers_selfcheck.py``, for 0.5.20-0.5.22 against theirs by
``tests/engine_parsers/test_sglang_releases.py`` (the older releases are not: hpcserve refuses
them, see hpcserve/engines/sglang.py CHECKED); ``--check-real PYTHON`` does the same
comparison here for the newest version, using that interpreter (the engines venv).

Usage::

    python3 tools/extract_sglang_flags.py                  # writes hpcserve/engines/data/sglang_flags.json
    python3 tools/extract_sglang_flags.py --check-real .venv-engines/bin/python
    python3 tools/extract_sglang_flags.py --versions 0.5.23 --stdout
"""

from __future__ import annotations

import argparse
import ast
import builtins
import hashlib
import json
import os
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

VERSIONS = [
    "0.4.6.post5",
    "0.4.9.post6",
    "0.4.10.post2",
    "0.5.2",
    "0.5.4.post3",
    "0.5.6.post2",
    "0.5.9",
    "0.5.12.post1",
    "0.5.16",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "hpcserve" / "engines" / "data" / "sglang_flags.json"
DEFAULT_CACHE = Path(
    os.environ.get("HPCSERVE_SGLANG_WHEEL_CACHE", Path.home() / ".cache" / "hpcserve" / "sglang-wheels")
)
SERVER_ARGS = "sglang.srt.server_args"

_DEPRECATED_LEAD = re.compile(r"^\W*(?:note:\s*)?deprecated\b|\(deprecated\b", re.I)


def announces_deprecated(help_text: str, names) -> bool:
    """Whether a help text announces ITS flag as deprecated.

    Yes: "Deprecated. Use ...", "(Deprecated: use ...)", "[Deprecated] ...", "Deprecated alias for
    ...", "--x is deprecated ...", "Note: --x is deprecated now", "This flag is deprecated".
    No: "Replaces the deprecated --grpc-mode", "The fallback to that flag ... is deprecated".
    Same rule as tests/engine_parsers/sglang_check.py.
    """
    if _DEPRECATED_LEAD.search(help_text):
        return True
    low = help_text.lower()
    if re.search(r"\bthis (?:flag|option|argument) is deprecated", low):
        return True
    return any(f"{n.lower()} is deprecated" in low for n in names)


def version_key(v: str):
    return tuple(int(x) if x.isdigit() else x for x in re.split(r"[.]|post", v) if x != "")


# ---------------------------------------------------------------------------------------------
# Static evaluation
# ---------------------------------------------------------------------------------------------


class Unresolved(Exception):
    """A value the static evaluator cannot compute."""


@dataclass(frozen=True)
class External:
    """Something from outside the wheel (argparse, typing, enum, ...)."""

    name: str


@dataclass(frozen=True)
class ModRef:
    module: "Module"


@dataclass(frozen=True)
class ClassRef:
    module: "Module"
    node: ast.ClassDef

    def bases(self):
        out = []
        for b in self.node.bases:
            try:
                out.append(self.module.ev(b))
            except Unresolved:
                out.append(External(ast.unparse(b)))
        return out

    def is_enum(self) -> bool:
        for b in self.bases():
            if isinstance(b, External) and b.name.split(".")[-1] in (
                "Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"):
                return True
            if isinstance(b, ClassRef) and b.is_enum():
                return True
        return False

    def body_assigns(self):
        for st in self.node.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                yield st.targets[0].id, st.value
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                yield st.target.id, st.value

    def attr(self, name):
        env: dict = {}  # class-body names visible to later class-body expressions
        for n, v in self.body_assigns():
            if n == name:
                if self.is_enum():
                    return EnumMember(self, n)
                return self.module.ev(v, env)
            try:
                env[n] = self.module.ev(v, env)
            except Unresolved as exc:
                env[n] = exc
        for b in self.bases():
            if isinstance(b, ClassRef):
                try:
                    return b.attr(name)
                except Unresolved:
                    pass
        raise Unresolved(f"{self.node.name}.{name}")

    def members(self):
        if not self.is_enum():
            raise Unresolved(f"iterate class {self.node.name}")
        return [EnumMember(self, n) for n, _ in self.body_assigns() if not n.startswith("_")]


@dataclass(frozen=True)
class EnumMember:
    cls: ClassRef
    name: str

    @property
    def value(self):
        for n, v in self.cls.body_assigns():
            if n == self.name:
                return self.cls.module.ev(v)
        raise Unresolved(self.name)


@dataclass(frozen=True)
class FuncRef:
    module: "Module"
    node: ast.FunctionDef


class _Return(Exception):
    def __init__(self, value):
        self.value = value


class Source:
    """The ``sglang`` package inside one wheel, read straight from the zip -- or, for a directory
    (e.g. an installed ``site-packages``), from the files under it."""

    def __init__(self, wheel: Path):
        self.wheel = Path(wheel)
        if self.wheel.is_dir():
            root = self.wheel
            self.names = {p.relative_to(root).as_posix() for p in (root / "sglang").rglob("*.py")}
            self._read = lambda name: (root / name).read_bytes()
        else:
            zf = zipfile.ZipFile(self.wheel)
            self.names = set(zf.namelist())
            self._read = zf.read
        self._mods: dict[str, Module | None] = {}

    def module(self, dotted: str) -> "Module | None":
        if dotted in self._mods:
            return self._mods[dotted]
        mod = None
        base = dotted.replace(".", "/")
        for path, is_pkg in ((base + ".py", False), (base + "/__init__.py", True)):
            if path in self.names:
                tree = ast.parse(self._read(path).decode("utf-8"), filename=path)
                mod = Module(self, dotted, path, tree, is_pkg)
                break
        self._mods[dotted] = mod
        return mod


class Module:
    def __init__(self, src: Source, name: str, path: str, tree: ast.Module, is_pkg: bool):
        self.src, self.name, self.path, self.tree, self.is_pkg = src, name, path, tree, is_pkg
        self.scope: dict[str, tuple] = {}
        self.mutations: dict[str, list[ast.Call | ast.AugAssign]] = {}
        self._cache: dict[str, object] = {}
        self._busy: set[str] = set()
        self._collect(tree.body)

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        return isinstance(other, Module) and other.name == self.name

    def abs_module(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.name.split(".")
        if not self.is_pkg:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))

    def _bind(self, name, entry, first_wins=False):
        if first_wins and name in self.scope:
            return
        self.scope[name] = entry

    def _collect(self, body, first_wins=False):
        # first_wins doubles as "inside a module-level if": such mutations of a constant
        # (e.g. `if envs.X.get(): CHOICES.add("token_oracle")`) depend on the environment and
        # are left out, as argparse sees them on a default setup.
        for st in body:
            if isinstance(st, ast.Assign):
                for t in st.targets:
                    if isinstance(t, ast.Name):
                        self._bind(t.id, ("expr", st.value), first_wins)
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                self._bind(st.target.id, ("expr", st.value), first_wins)
            elif isinstance(st, ast.AugAssign) and isinstance(st.target, ast.Name):
                if not first_wins:
                    self.mutations.setdefault(st.target.id, []).append(st)
            elif isinstance(st, ast.Import):
                for a in st.names:
                    if a.asname:
                        self._bind(a.asname, ("module", a.name), first_wins)
                    else:
                        top = a.name.split(".")[0]
                        self._bind(top, ("module", top), first_wins)
            elif isinstance(st, ast.ImportFrom):
                mod = self.abs_module(st)
                for a in st.names:
                    if a.name != "*":
                        self._bind(a.asname or a.name, ("from", mod, a.name), first_wins)
            elif isinstance(st, ast.ClassDef):
                self._bind(st.name, ("class", st), first_wins)
            elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._bind(st.name, ("func", st), first_wins)
            elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
                f = st.value.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr in (
                    "append", "extend", "add", "update") and not first_wins:
                    self.mutations.setdefault(f.value.id, []).append(st.value)
            elif isinstance(st, ast.Try):
                self._collect(st.body, first_wins)
            elif isinstance(st, ast.If):
                # Module-level platform branches: the first definition wins.
                self._collect(st.body, True)
                self._collect(st.orelse, True)

    # -- names ---------------------------------------------------------------------------------
    def lookup(self, name: str):
        if name in self._cache:
            return self._cache[name]
        if name in self._busy:
            raise Unresolved(f"cycle at {self.name}.{name}")
        entry = self.scope.get(name)
        if entry is None:
            if hasattr(builtins, name):
                return External(name)
            raise Unresolved(f"{self.name}.{name}")
        self._busy.add(name)
        try:
            kind = entry[0]
            if kind == "expr":
                val = self.ev(entry[1])
                for mut in self.mutations.get(name, []):
                    val = self._apply_mutation(val, mut)
            elif kind == "module":
                val = self.src_module(entry[1])
            elif kind == "from":
                val = self.import_from(entry[1], entry[2])
            elif kind == "class":
                val = ClassRef(self, entry[1])
            else:
                val = FuncRef(self, entry[1])
        finally:
            self._busy.discard(name)
        self._cache[name] = val
        return val

    def _apply_mutation(self, val, mut):
        if isinstance(mut, ast.AugAssign):
            if isinstance(mut.op, ast.Add):
                return val + self.ev(mut.value)
            raise Unresolved(ast.unparse(mut))
        meth = mut.func.attr
        args = [self.ev(a) for a in mut.args]
        val = type(val)(val)
        if meth == "append":
            val.append(args[0])
        elif meth == "extend":
            val.extend(args[0])
        elif meth == "add":
            val.add(args[0])
        elif meth == "update":
            val.update(args[0])
        return val

    def src_module(self, dotted: str):
        m = self.src.module(dotted)
        return ModRef(m) if m is not None else External(dotted)

    def import_from(self, mod: str, name: str):
        m = self.src.module(mod)
        if m is None:
            return External(f"{mod}.{name}")
        if name in m.scope:
            return m.lookup(name)
        sub = self.src.module(f"{mod}.{name}")
        if sub is not None:
            return ModRef(sub)
        raise Unresolved(f"{mod}.{name}")

    # -- expressions ---------------------------------------------------------------------------
    def ev(self, node, env: dict | None = None):
        env = env or {}
        ev = lambda n: self.ev(n, env)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            out = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    out.extend(_iterate(ev(e.value)))
                else:
                    out.append(ev(e))
            return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](out)
        if isinstance(node, ast.Dict):
            out = {}
            for k, v in zip(node.keys, node.values):
                if k is None:
                    out.update(ev(v))
                else:
                    out[ev(k)] = _Lazy(self, v, env)
            return out
        if isinstance(node, ast.Name):
            if node.id in env:
                v = env[node.id]
                if isinstance(v, Unresolved):
                    raise v
                return v
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            base = ev(node.value)
            return _getattr(base, node.attr)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            try:
                if isinstance(node.op, ast.Add):
                    return left + right
                if isinstance(node.op, ast.BitOr) and isinstance(left, (set, dict)):
                    return left | right
                if isinstance(node.op, ast.Sub) and isinstance(left, set):
                    return left - set(right)
                if isinstance(node.op, ast.Mod) and isinstance(left, str):
                    return left % right
            except TypeError as exc:
                raise Unresolved(str(exc))
            raise Unresolved(ast.unparse(node))
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                else:
                    try:
                        parts.append(str(_plain(ev(v.value))))
                    except Unresolved:
                        parts.append("{...}")
            return "".join(parts)
        if isinstance(node, (ast.ListComp, ast.SetComp)) and len(node.generators) == 1:
            gen = node.generators[0]
            out = []
            for item in _iterate(ev(gen.iter)):
                local = dict(env)
                _bind_target(gen.target, item, local)
                if all(self.ev(c, local) for c in gen.ifs):
                    out.append(self.ev(node.elt, local))
            return out if isinstance(node, ast.ListComp) else set(out)
        if isinstance(node, ast.Call):
            return self._call(node, env)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            a, b = ev(node.left), ev(node.comparators[0])
            op = node.ops[0]
            if isinstance(op, ast.Eq):
                return a == b
            if isinstance(op, ast.NotEq):
                return a != b
            if isinstance(op, ast.In):
                return a in b
            if isinstance(op, ast.NotIn):
                return a not in b
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise Unresolved(ast.unparse(node))

    def _call(self, node: ast.Call, env):
        f = node.func
        args = [self.ev(a, env) for a in node.args if not isinstance(a, ast.Starred)]
        if any(isinstance(a, ast.Starred) for a in node.args) or node.keywords and not (
            isinstance(f, ast.Name) and f.id == "sorted"):
            if not (isinstance(f, ast.Name) and f.id in ("sorted", "dict")):
                raise Unresolved(ast.unparse(node))
        if isinstance(f, ast.Attribute):
            base = self.ev(f.value, env)
            base = _plain(base) if not isinstance(base, (dict, ClassRef, ModRef)) else base
            if isinstance(base, dict):
                if f.attr == "keys" and not args:
                    return list(base.keys())
                if f.attr == "values" and not args:
                    return [_plain(v) for v in base.values()]
                if f.attr == "items" and not args:
                    return [(k, _plain(v)) for k, v in base.items()]
                if f.attr == "get":
                    return _plain(base.get(args[0], args[1] if len(args) > 1 else None))
            if isinstance(base, str) and f.attr in ("lower", "upper", "strip", "replace", "join", "format", "split"):
                return getattr(base, f.attr)(*args)
            if isinstance(base, (ClassRef, ModRef)):
                target = _getattr(base, f.attr)
                if isinstance(target, FuncRef):
                    return _run_function(target, args)
            raise Unresolved(ast.unparse(node))
        if isinstance(f, ast.Name):
            fn = env.get(f.id) if f.id in env else None
            if fn is None:
                try:
                    fn = self.lookup(f.id)
                except Unresolved:
                    fn = External(f.id)
            if isinstance(fn, FuncRef):
                return _run_function(fn, args)
            name = fn.name if isinstance(fn, External) else None
            if name in ("list", "tuple", "set", "sorted", "frozenset") and len(args) == 1:
                items = _iterate(args[0])
                if name == "sorted":
                    kw = {k.arg: k.value for k in node.keywords}
                    if set(kw) - {"reverse"}:
                        raise Unresolved(ast.unparse(node))
                    return sorted(items, reverse=bool(kw and self.ev(kw["reverse"], env)))
                return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[name](items)
            if name == "dict" and not args:
                return {k.arg: _Lazy(self, k.value, env) for k in node.keywords}
            if name in ("str", "len", "int") and len(args) == 1:
                return {"str": str, "len": len, "int": int}[name](_plain(args[0]))
        raise Unresolved(ast.unparse(node))


@dataclass
class _Lazy:
    """A dict value evaluated only when read (dict values are often classes or callables)."""

    module: Module
    node: ast.AST
    env: dict = field(default_factory=dict)

    def get(self):
        return self.module.ev(self.node, self.env)


def _plain(v):
    return v.get() if isinstance(v, _Lazy) else v


def _getattr(base, attr):
    base = _plain(base)
    if isinstance(base, ModRef):
        if attr in base.module.scope:
            return base.module.lookup(attr)
        sub = base.module.src.module(f"{base.module.name}.{attr}")
        if sub is not None:
            return ModRef(sub)
        raise Unresolved(f"{base.module.name}.{attr}")
    if isinstance(base, ClassRef):
        return base.attr(attr)
    if isinstance(base, EnumMember):
        if attr == "name":
            return base.name
        if attr == "value":
            return base.value
    if isinstance(base, External):
        return External(f"{base.name}.{attr}")
    raise Unresolved(f"attribute {attr} of {type(base).__name__}")


def _iterate(v):
    v = _plain(v)
    if isinstance(v, dict):
        return list(v.keys())
    if isinstance(v, ClassRef):
        return v.members()
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x) for x in v]
    raise Unresolved(f"iterate {type(v).__name__}")


def _bind_target(target, value, env):
    if isinstance(target, ast.Name):
        env[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)):
        for t, v in zip(target.elts, value):
            _bind_target(t, v, env)
    else:
        raise Unresolved(ast.unparse(target))


def _run_function(fn: FuncRef, args):
    """Interpret a small helper (e.g. ``_reasoning_parser_choices()``): straight-line code only.

    ``if`` blocks are skipped (they guard plugin/runtime special cases such as "already imported"),
    ``try`` bodies run, local imports bind, the first reachable ``return`` gives the value.
    """
    node = fn.node
    params = [a.arg for a in node.args.args]
    if len(args) > len(params):
        raise Unresolved(f"call {node.name}")
    env = dict(zip(params, args))
    try:
        _exec_block(fn.module, node.body, env)
    except _Return as r:
        return r.value
    raise Unresolved(f"{node.name} returns nothing")


def _exec_block(mod: Module, body, env):
    for st in body:
        if isinstance(st, ast.Return):
            raise _Return(mod.ev(st.value, env) if st.value is not None else None)
        if isinstance(st, ast.Assign) and len(st.targets) == 1:
            try:
                _bind_target(st.targets[0], mod.ev(st.value, env), env)
            except Unresolved as exc:
                if isinstance(st.targets[0], ast.Name):
                    env[st.targets[0].id] = exc
        elif isinstance(st, ast.ImportFrom):
            m = mod.abs_module(st)
            for a in st.names:
                try:
                    env[a.asname or a.name] = mod.import_from(m, a.name)
                except Unresolved as exc:
                    env[a.asname or a.name] = exc
        elif isinstance(st, ast.Import):
            for a in st.names:
                env[a.asname or a.name.split(".")[0]] = mod.src_module(a.name if a.asname else a.name.split(".")[0])
        elif isinstance(st, ast.Try):
            _exec_block(mod, st.body, env)
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            f = st.value.func
            if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in env
                    and f.attr in ("append", "extend", "add", "update")
                    and not isinstance(env[f.value.id], Unresolved)):
                try:
                    arg = mod.ev(st.value.args[0], env)
                    getattr(env[f.value.id], f.attr)(arg)
                except (Unresolved, AttributeError, IndexError):
                    pass


# ---------------------------------------------------------------------------------------------
# Flag extraction
# ---------------------------------------------------------------------------------------------


@dataclass
class Option:
    names: list[str]
    help: str = ""
    choices: list | None = None
    choices_unresolved: str | None = None
    deprecated: bool = False
    origin: str = ""


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _is_boolean_optional(node) -> bool:
    return node is not None and ast.unparse(node).split(".")[-1] == "BooleanOptionalAction"


def _is_deprecated_action(node) -> bool:
    return node is not None and ast.unparse(node).split(".")[-1].startswith("Deprecated")


def _help_text(mod: Module, node, env) -> str:
    if node is None:
        return ""
    try:
        v = mod.ev(node, env)
        return v if isinstance(v, str) else ""
    except Unresolved:
        # Best effort: the literal pieces of a partially dynamic help string.
        return " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def _choices(mod: Module, node, env, opt: Option):
    if node is None:
        return
    try:
        opt.choices = _iterate(mod.ev(node, env))
    except Unresolved as exc:
        opt.choices_unresolved = f"{ast.unparse(node)} ({exc})"


def _with_negatives(names, action_node):
    if _is_boolean_optional(action_node):
        return names + ["--no-" + n[2:] for n in names if n.startswith("--")]
    return names


def _add_argument_options(mod: Module, func: ast.FunctionDef) -> tuple[list[Option], list[ast.Call]]:
    """Literal add_argument calls in ``func`` (in order), with locals tracked for choices."""
    options: list[Option] = []
    dataclass_calls: list[ast.Call] = []
    env: dict = {p.arg: Unresolved(p.arg) for p in func.args.args}

    def visit(body, top):
        for st in body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                if top:
                    try:
                        env[st.targets[0].id] = mod.ev(st.value, env)
                    except Unresolved as exc:
                        env[st.targets[0].id] = exc
            if isinstance(st, (ast.ImportFrom, ast.Import)) and top:
                _exec_block(mod, [st], env)
            for node in ast.walk(st) if not isinstance(st, (ast.If, ast.For, ast.While, ast.With, ast.Try)) else []:
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                    if not top:
                        # No examined version registers a flag conditionally; a new one that does
                        # needs a look (the static set would then include every branch).
                        print(f"warning: {mod.path}:{node.lineno}: add_argument under control flow",
                              file=sys.stderr)
                    options.append(_option_from_call(mod, node, env))
                elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_cli_args_from_dataclass"):
                    dataclass_calls.append(node)
            if isinstance(st, (ast.If, ast.For, ast.While, ast.With)):
                visit(st.body, False)
                visit(getattr(st, "orelse", []), False)
            elif isinstance(st, ast.Try):
                visit(st.body, top)
                for h in st.handlers:
                    visit(h.body, False)

    visit(func.body, True)
    return options, dataclass_calls


def _option_from_call(mod: Module, call: ast.Call, env) -> Option:
    names = []
    for a in call.args:
        if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
            raise SystemExit(f"{mod.path}:{call.lineno}: non-literal option string {ast.unparse(a)}")
        names.append(a.value)
    action = _kw(call, "action")
    opt = Option(names=_with_negatives(names, action), origin=f"{mod.path}:{call.lineno}")
    opt.help = _help_text(mod, _kw(call, "help"), env)
    opt.deprecated = _is_deprecated_action(action) or announces_deprecated(opt.help, opt.names)
    _choices(mod, _kw(call, "choices"), env, opt)
    return opt


def _annotation_parts(node):
    """``A[T, meta, ...]`` / ``Annotated[T, ...]`` -> (T, [meta...]) or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        node = ast.parse(node.value, mode="eval").body
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] in ("A", "Annotated"):
        sl = node.slice
        elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
        return elts[0], list(elts[1:])
    return None


def _type_choices(mod: Module, tnode, depth=0):
    """Literal values of ``T`` after unwrapping Optional[...] / ``X | None`` / type aliases."""
    if depth > 5 or tnode is None:
        return None
    if isinstance(tnode, ast.Subscript):
        head = ast.unparse(tnode.value).split(".")[-1]
        elts = tnode.slice.elts if isinstance(tnode.slice, ast.Tuple) else [tnode.slice]
        if head == "Literal":
            return [mod.ev(e) for e in elts]
        if head == "Optional":
            return _type_choices(mod, elts[0], depth + 1)
        if head == "Union":
            non_none = [e for e in elts if ast.unparse(e) != "None"]
            if len(non_none) == 1:
                return _type_choices(mod, non_none[0], depth + 1)
        return None
    if isinstance(tnode, ast.BinOp) and isinstance(tnode.op, ast.BitOr):
        sides = [s for s in (tnode.left, tnode.right) if ast.unparse(s) != "None"]
        if len(sides) == 1:
            return _type_choices(mod, sides[0], depth + 1)
        return None
    if isinstance(tnode, ast.Name) and tnode.id in mod.scope and mod.scope[tnode.id][0] == "expr":
        return _type_choices(mod, mod.scope[tnode.id][1], depth + 1)
    if isinstance(tnode, ast.Name) and tnode.id in mod.scope and mod.scope[tnode.id][0] == "from":
        m = mod.src.module(mod.scope[tnode.id][1])
        name = mod.scope[tnode.id][2]
        if m is not None and name in m.scope and m.scope[name][0] == "expr":
            return _type_choices(m, m.scope[name][1], depth + 1)
    return None


def _class_fields(cls: ClassRef, seen=None):
    """Annotated fields of ``cls`` and its in-wheel bases (base fields first), as (module, name, ann)."""
    seen = seen if seen is not None else set()
    out = []
    for b in cls.bases():
        if isinstance(b, ClassRef) and b.node.name not in seen:
            seen.add(b.node.name)
            out.extend(_class_fields(b, seen))
    for st in cls.node.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
            if "ClassVar" in ast.unparse(st.annotation).split("[")[0]:
                continue
            out.append((cls.module, st.target.id, st.annotation))
    return out


def _dataclass_options(mod: Module, classes: list[ClassRef]) -> list[Option]:
    options = []
    seen = set()
    for cls in classes:
        for fmod, fname, ann in _class_fields(cls):
            if fname in seen:
                continue
            seen.add(fname)
            parts = _annotation_parts(ann)
            if parts is None:
                continue
            tnode, metas = parts
            arg = None
            for m in metas:  # arg_utils._unwrap_annotated: the first Arg(...) or bare string wins
                if isinstance(m, ast.Call) and ast.unparse(m.func).split(".")[-1] == "Arg":
                    arg = m
                    break
                if isinstance(m, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                    try:
                        val = fmod.ev(m)
                    except Unresolved:
                        val = None
                    if isinstance(val, str):
                        arg = ast.Call(func=ast.Name("Arg"), args=[], keywords=[ast.keyword("help", m)])
                        break
            if arg is None:
                continue

            def kwv(name, default=None):
                node = _kw(arg, name)
                return default if node is None else fmod.ev(node)

            if kwv("no_cli", False):
                continue
            cli_name = kwv("cli_name") or "--" + fname.replace("_", "-")
            names = [cli_name] + list(kwv("aliases") or [])
            action = _kw(arg, "action")
            opt = Option(names=_with_negatives(names, action), origin=f"{fmod.path}:{ann.lineno}")
            opt.help = _help_text(fmod, _kw(arg, "help"), {})
            opt.deprecated = _is_deprecated_action(action) or announces_deprecated(opt.help, opt.names)
            if action is None:
                if _kw(arg, "choices") is not None:
                    _choices(fmod, _kw(arg, "choices"), {}, opt)
                    if opt.choices is not None and not opt.choices and _type_choices(fmod, tnode) is None:
                        opt.choices = None  # `if arg_meta.choices:` -- an empty list adds none
                else:
                    try:
                        opt.choices = _type_choices(fmod, tnode)
                    except Unresolved as exc:
                        opt.choices_unresolved = f"{ast.unparse(tnode)} ({exc})"
            elif _kw(arg, "action_kwargs") is not None:
                try:
                    ak = fmod.ev(_kw(arg, "action_kwargs"))
                    if "choices" in ak:
                        opt.choices = _iterate(_plain(ak["choices"]))
                except Unresolved as exc:
                    opt.choices_unresolved = f"action_kwargs ({exc})"
            options.append(opt)
    return options


def _input_namespace_classes(mod: Module) -> list[ClassRef]:
    """Classes passed to ``collect_input_fields(...)`` at module level (0.5.20+)."""
    out = []
    for st in mod.tree.body:
        for node in ast.walk(st):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "collect_input_fields":
                for c in _iterate(mod.ev(node.args[0])):
                    if isinstance(c, ClassRef):
                        out.append(c)
    return out


def extract(src: Source) -> dict:
    mod = src.module(SERVER_ARGS)
    if mod is None:
        raise SystemExit(f"{src.wheel}: no {SERVER_ARGS}")
    # The class statement, not the module-level rebinding (0.5.20+: ServerArgs = msgspec.defstruct(...)).
    server_args = ClassRef(mod, next(
        st for st in mod.tree.body if isinstance(st, ast.ClassDef) and st.name == "ServerArgs"))
    add_cli = next(
        st for st in server_args.node.body if isinstance(st, ast.FunctionDef) and st.name == "add_cli_args"
    )
    options, dc_calls = _add_argument_options(mod, add_cli)
    dc_options = []
    for call in dc_calls:
        if ast.unparse(call.args[1]) not in ("ServerArgs", "cls"):
            raise SystemExit(f"add_cli_args_from_dataclass on {ast.unparse(call.args[1])}: not handled")
        if any(k.arg == "fields" for k in call.keywords):
            raise SystemExit("add_cli_args_from_dataclass(fields=...): not handled")
        # ServerArgs' own annotations are merged after the namespaces' (0.5.20+); 0.5.16 has only them.
        classes = _input_namespace_classes(mod) + [server_args]
        dc_options.extend(_dataclass_options(mod, classes))
    all_opts = dc_options + options

    flags, deprecated, choices, unresolved = set(), set(), {}, {}
    for opt in all_opts:
        longs = [n for n in opt.names if n.startswith("--")]
        dup = flags & set(longs)
        if dup:
            raise SystemExit(f"{src.wheel.name}: option string(s) registered twice: {sorted(dup)}")
        flags.update(longs)
        if opt.deprecated:
            deprecated.update(longs)
        if longs and opt.choices is not None:
            choices[longs[0]] = sorted({str(c) for c in opt.choices})
        elif longs and opt.choices_unresolved:
            unresolved[longs[0]] = opt.choices_unresolved
    shorts = sorted(n for o in all_opts for n in o.names if not n.startswith("--"))
    return {
        "flags": sorted(flags),
        "short_flags": shorts,
        "deprecated": sorted(deprecated),
        "choices": dict(sorted(choices.items())),
        "choices_unresolved": dict(sorted(unresolved.items())),
        "_help": {o.names[0]: o.help for o in all_opts},
    }


# ---------------------------------------------------------------------------------------------
# Wheels, output
# ---------------------------------------------------------------------------------------------


# Pin the wheel flavour (newer sglang releases ship per-CPython manylinux wheels) so the output,
# which records the wheel's name and hash, is the same whichever interpreter runs this tool.
WHEEL_TAGS = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
              "--platform", "manylinux_2_34_x86_64"]


def _cached_wheel(version: str, cache: Path) -> Path | None:
    found = sorted(p for p in cache.glob(f"sglang-{version}-*.whl")
                   if "-py3-none-any" in p.name or "-cp311-cp311-" in p.name)
    return found[0] if found else None


def wheel_for(version: str, cache: Path) -> Path:
    cache.mkdir(parents=True, exist_ok=True)
    found = _cached_wheel(version, cache)
    if found is None:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               *WHEEL_TAGS, f"sglang=={version}", "-d", str(cache)]
        print("+", " ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        found = _cached_wheel(version, cache)
    if found is None:
        raise SystemExit(f"no wheel for sglang=={version} in {cache}")
    return found


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dumps(doc: dict) -> str:
    """JSON with one line per version key: sorted, deterministic, and compact."""

    def one(v):
        return json.dumps(v, sort_keys=True, ensure_ascii=False)

    lines = ["{"]
    top = [k for k in doc if k != "versions"]
    for k in top:
        lines.append(f"  {one(k)}: {one(doc[k])},")
    lines.append('  "versions": {')
    vers = sorted(doc["versions"], key=version_key)
    for i, v in enumerate(vers):
        entry = doc["versions"][v]
        lines.append(f"    {one(v)}: {{")
        keys = sorted(entry)
        for j, k in enumerate(keys):
            val = entry[k]
            if k == "choices":
                lines.append(f'      "choices": {{')
                ck = sorted(val)
                for n, c in enumerate(ck):
                    lines.append(f"        {one(c)}: {one(val[c])}{',' if n < len(ck) - 1 else ''}")
                lines.append("      }" + ("," if j < len(keys) - 1 else ""))
            else:
                lines.append(f"      {one(k)}: {one(val)}{',' if j < len(keys) - 1 else ''}")
        lines.append("    }" + ("," if i < len(vers) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def check_real(python: str, static: dict) -> int:
    script = REPO / "tests" / "engine_parsers" / "sglang_check.py"
    out = subprocess.run([python, str(script), "--list-flags"], check=True, capture_output=True, text=True)
    real = json.loads(out.stdout)
    rc = 0
    for key in ("flags", "deprecated", "short_flags"):
        a, b = set(static[key]), set(real[key])
        print(f"{key}: static {len(a)}, real {len(b)}; only static {sorted(a - b)}; only real {sorted(b - a)}")
        rc |= a != b
    sc, rcs = static["choices"], real["choices"]
    diff = {k for k in set(sc) | set(rcs) if sc.get(k) != rcs.get(k)}
    print(f"choices: static {len(sc)} options, real {len(rcs)}; differing: {len(diff)}")
    for k in sorted(diff):
        print(f"  {k}: static={sc.get(k)} real={rcs.get(k)} unresolved={static['choices_unresolved'].get(k)}")
    rc |= bool(diff)
    print("real parser sglang", real["sglang_version"], "->", "MATCH" if not rc else "DIFFERENT")
    return rc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", nargs="+", default=VERSIONS)
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="wheel cache (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--stdout", action="store_true", help="print the JSON instead of writing --out")
    ap.add_argument("--check-real", metavar="PYTHON",
                    help="compare the newest version's result with the real parser run by this python")
    ap.add_argument("--show-deprecated-help", action="store_true",
                    help="print every help text mentioning 'deprecat' (to review the heuristic)")
    args = ap.parse_args(argv)

    versions = sorted(set(args.versions), key=version_key)
    doc = {"generated_by": "tools/extract_sglang_flags.py",
           "notes": "Static extraction from the sglang wheels' server_args.py / arg_groups; "
                    "flags = every long option string ServerArgs.add_cli_args registers (aliases and "
                    "BooleanOptionalAction --no-* forms included, argparse's --help excluded); "
                    "deprecated = flags with a Deprecated*Action or a help text announcing them "
                    "deprecated; choices as CLI strings; "
                    "choices_unresolved = options with choices this tool could not compute statically.",
           "versions": {}}
    results = {}
    for v in versions:
        wheel = wheel_for(v, args.cache)
        res = extract(Source(wheel))
        results[v] = res
        if args.show_deprecated_help:
            for name, h in sorted(res["_help"].items()):
                if "deprecat" in h.lower():
                    mark = "D" if name in res["deprecated"] else "-"
                    print(f"{v} {mark} {name}: {h[:160]!r}")
        entry = {k: res[k] for k in ("flags", "deprecated", "choices")}
        if res["choices_unresolved"]:
            entry["choices_unresolved"] = sorted(res["choices_unresolved"])
        if res["short_flags"]:
            entry["short_flags"] = res["short_flags"]
        entry["wheel"] = wheel.name
        entry["wheel_sha256"] = _sha256(wheel)
        doc["versions"][v] = entry
        print(f"sglang {v}: {len(res['flags'])} flags, {len(res['deprecated'])} deprecated, "
              f"{len(res['choices'])} with choices, {len(res['choices_unresolved'])} unresolved",
              file=sys.stderr)
    text = dumps(doc)
    if args.check_real:
        return check_real(args.check_real, results[versions[-1]])
    if args.stdout:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out} ({len(text)} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
