#!/usr/bin/env python3
"""Extract the legacy KTransformers server's flag matrix from KTransformers' git tags, statically.

KTransformers had its own OpenAI/Ollama-compatible server, ``ktransformers/server/main.py``
(console script ``ktransformers``, or ``python ktransformers/server/main.py``), up to tag v0.4.1.
Commit 57d14d22 ("Refactor: restructure repository to focus on kt-kernel and KT-SFT modules",
#1581, first tagged in v0.4.2) moved the whole package to ``archive/``; from then on the
``ktransformers`` distribution no longer contains a server, and models are served by the
kvcache-ai SGLang fork (``sglang-kt``) with kt-kernel (``python -m sglang.launch_server
--kt-...``), whose flags belong in the SGLang matrix, not here. This tool reads the git mirror
of https://github.com/kvcache-ai/ktransformers (``git show TAG:path``) and, with ``ast`` only,
never importing KTransformers (which needs torch, CUDA extensions and a model directory just to
build its parser), rebuilds what each release's server parser accepts:

* the parser: ``ArgumentParser.parse_args`` in ``ktransformers/server/args.py`` (v0.2.0 on), or
  the ``main`` function of ``ktransformers/server/main.py`` (v0.1.x, before args.py existed);
  every ``<x>.add_argument("--opt", ...)`` call in that function is one option;
* ``flags``: every long option string (``--no-<opt>`` added for ``argparse.BooleanOptionalAction``,
  as argparse does); argparse's own ``--help`` is not listed;
* ``bare``: options that take no value (``store_true``-like actions, both spellings of a
  ``BooleanOptionalAction``);
* ``types``: ``int``/``str``/``float``/``bool``/``list`` from ``type=`` (no ``type`` = ``str``);
  ``bool_from_str`` lists the options declared ``type=bool`` with a value: argparse calls
  ``bool(text)``, so ``--web False`` and ``--web 0`` are True and only ``--web ""`` is False;
  ``type=list`` likewise turns the text into a list of its characters;
* ``defaults``: literal defaults, and defaults read from the ``Config`` singleton
  (``self.cfg.<attr>``, ``cfg.<attr>``): ``ktransformers/server/config/config.py`` is evaluated
  statically over the package's ``ktransformers/configs/config.yaml`` (read by a small YAML
  subset reader below, stdlib having none). That is what a *fresh* ``$HOME`` gives: on its first
  start the server copies that file to ``~/.ktransformers/config.yaml`` and from then on reads
  only the copy, so an older copy in a shared home changes every default taken from it.
  Defaults that depend on the machine, the home directory or the install location
  (``psutil.cpu_count(...)``, ``$HOME/.ktransformers/...``, ``<ktransformers>/...`` = the
  installed package directory) go to ``defaults_dynamic`` as text instead, and so does
  ``--user_secret_key`` (a literal JWT key in config.yaml, deliberately not copied);
* ``deprecated``: options whose help announces it ("deprecated", "Abandoning this parameter");
* ``choices``: argparse ``choices`` (no legacy release declares any; ``--backend_type`` is
  checked later, by ``create_interface``);
* ``legacy_server``, ``tag``, ``commit``, ``package_version`` (``ktransformers/__init__.py``'s
  ``__version__``, which lags some tags: v0.3.2 says 0.3.1, v0.4.1 says 0.3.2), ``parser``.

For release tags without ``ktransformers/server/main.py`` (v0.4.2 on) the entry is
``{"legacy_server": false, "flags": [], "commit": ..., "removed_note": ...}``; by default only
the first ``--after-removal`` such tags and the newest are written, to keep the file small.
Version keys are the tag without its ``v``, PEP 440-normalised (``v0.2.3post1`` -> ``0.2.3.post1``);
pre-release tags (``rc``) are skipped unless named with ``--tags``.

Usage::

    python3 tools/extract_ktransformers_flags.py GIT_DIR   # writes DEFAULT_OUT (engines/data)
    python3 tools/extract_ktransformers_flags.py GIT_DIR --tags v0.3.2 v0.4.1 --stdout

GIT_DIR is a clone or bare mirror of kvcache-ai/ktransformers with its tags.
"""

from __future__ import annotations

import argparse
import ast
import json
import posixpath
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "hpcserve" / "engines" / "data" / "ktransformers_flags.json"

SERVER_MAIN = "ktransformers/server/main.py"
SERVER_ARGS = "ktransformers/server/args.py"
CONFIG_PY = "ktransformers/server/config/config.py"
CONFIG_YAML = "ktransformers/configs/config.yaml"
INIT_PY = "ktransformers/__init__.py"

REMOVED_NOTE = (
    "No legacy server: ktransformers/server (main.py, args.py) was moved to archive/ by commit "
    "{commit} ({subject}) and is not built or installed any more; the ktransformers distribution "
    "is a thin package that requires kt-kernel (extra [sglang] adds sglang-kt). Serve with the "
    "kvcache-ai SGLang fork: python -m sglang.launch_server ... --kt-weight-path ... "
    "--kt-cpuinfer ... --kt-threadpool-count ... --kt-method ... --kt-num-gpu-experts ...")

NOTES = (
    "Extracted statically (ast, never importing KTransformers) from the git tags of "
    "kvcache-ai/ktransformers: the legacy server's parser is ArgumentParser.parse_args in "
    "ktransformers/server/args.py (v0.2.0-v0.4.1) or main() in ktransformers/server/main.py "
    "(v0.1.x). Options use underscores (--model_path, --cache_lens); argparse allow_abbrev is on "
    "(unique prefixes are accepted; not listed). bare = options taking no value: only the "
    "argparse.BooleanOptionalAction pairs --force_think/--no-force_think and "
    "--use_cuda_graph/--no-use_cuda_graph (v0.2.2 on); bool_from_str = options declared "
    "type=bool that take a value: argparse applies bool() to the text, so any non-empty value "
    "(even 'False') is True and only an empty string is False. defaults = what a fresh $HOME "
    "gives: Config() copies the package's ktransformers/configs/config.yaml to "
    "~/.ktransformers/config.yaml on first start and afterwards reads only that copy; "
    "defaults_dynamic = defaults that depend on the machine, on $HOME or on the install location "
    "(<ktransformers> = the installed package directory), as text. The server also creates "
    "~/.ktransformers/, ~/.ktransformers/kvc2/ and ~/.ktransformers/logs/ and keeps its SQLite "
    "database there. Entries with legacy_server false are releases after the server was moved to "
    "archive/ (v0.4.2 on): KTransformers is then served through sglang-kt + kt-kernel, whose "
    "--kt-* flags belong to SGLang's launch_server. Pre-release tags (rc) are not included.")


class Unresolved:
    """A value the static evaluation cannot know (machine, file system); keeps its source text."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"Unresolved({self.text!r})"


class DynPath(str):
    """A path that depends on the machine: under "$HOME", or under "<ktransformers>" (the
    installed package directory, e.g. .../site-packages/ktransformers)."""


# config.py's __file__, as installed; Config uses dirname(dirname(dirname(__file__))).
CONFIG_FILE = DynPath("<ktransformers>/server/config/config.py")


# ---------------------------------------------------------------------------------------------
# git
# ---------------------------------------------------------------------------------------------

def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(git_dir), *args], check=True,
                          capture_output=True, text=True).stdout


def show(git_dir: Path, tag: str, path: str) -> str | None:
    r = subprocess.run(["git", "-C", str(git_dir), "show", f"{tag}:{path}"],
                       capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def tag_commit(git_dir: Path, tag: str) -> str:
    return git(git_dir, "rev-list", "-n", "1", tag).strip()


def release_tags(git_dir: Path) -> list[str]:
    """Every v* tag, oldest commit first; rc pre-releases left out."""
    out = git(git_dir, "for-each-ref", "--sort=creatordate", "--format=%(refname:short)",
              "refs/tags/v*")
    return [t for t in out.split() if not re.search(r"rc\d*$", t)]


def version_key(tag: str) -> str:
    """v0.2.3post1 -> 0.2.3.post1; v0.2.4post1 -> 0.2.4.post1; v0.3 -> 0.3."""
    v = tag[1:] if tag.startswith("v") else tag
    return re.sub(r"(?<=\d)\.?post", ".post", v)


def sort_key(version: str) -> tuple:
    nums = [int(p) for p in version.replace(".post", ".").split(".") if p.isdigit()]
    main, post = nums[:3], (nums[3] if ".post" in version else -1)
    return tuple(main + [0] * (3 - len(main))) + (post,)


# ---------------------------------------------------------------------------------------------
# A YAML subset: nested block mappings of scalars (all config.yaml files of the legacy releases)
# ---------------------------------------------------------------------------------------------

_INT = re.compile(r"^[-+]?\d+$")
_FLOAT = re.compile(r"^[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?$")


def _strip_comment(line: str) -> str:
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def yaml_scalar(text: str) -> Any:
    t = text.strip()
    if t == "" or t in ("~", "null", "Null", "NULL"):
        return None
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "\"'":
        return t[1:-1]
    if t in ("true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"):
        return True
    if t in ("false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"):
        return False
    if _INT.match(t):
        return int(t)
    if _FLOAT.match(t):
        return float(t)
    if t[0] in "[{&*!|>":
        raise ValueError(f"YAML construct not supported by this reader: {t!r}")
    return t


def read_yaml(text: str) -> dict:
    root: dict = {}
    stack: list[tuple[int, dict]] = [(-1, root)]
    pending: tuple[int, dict, str] | None = None   # a "key:" with no value yet
    for raw in text.splitlines():
        line = _strip_comment(raw).rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        if body.startswith("- "):
            raise ValueError(f"YAML sequences are not supported by this reader: {raw!r}")
        if pending is not None:
            p_indent, p_parent, p_key = pending
            pending = None
            if indent > p_indent:
                child: dict = {}
                p_parent[p_key] = child
                stack.append((p_indent, child))
        while stack and indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        key, sep, value = body.partition(":")
        if not sep:
            raise ValueError(f"not a mapping entry: {raw!r}")
        key = key.strip()
        if value.strip() == "":
            parent[key] = None
            pending = (indent, parent, key)
        else:
            parent[key] = yaml_scalar(value)
    return root


# ---------------------------------------------------------------------------------------------
# Config(): its attributes, evaluated statically over config.yaml
# ---------------------------------------------------------------------------------------------

def _call_name(node: ast.AST) -> str:
    return ast.unparse(node)


def _eval(node: ast.AST, env: dict, attrs: dict) -> Any:
    """Evaluate an expression of Config.__init__; Unresolved where the value needs the machine."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Dict,)) and not node.keys:
        return {}
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_eval(e, env, attrs) for e in node.elts]
        return Unresolved(ast.unparse(node)) if any(isinstance(i, Unresolved) for i in items) \
            else items
    if isinstance(node, ast.Name):
        if node.id == "__file__":
            return CONFIG_FILE
        return env.get(node.id, Unresolved(node.id))
    if isinstance(node, ast.IfExp):
        test = _eval(node.test, env, attrs)
        if isinstance(test, Unresolved):
            return Unresolved(ast.unparse(node))
        return _eval(node.body if test else node.orelse, env, attrs)
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            return attrs.get(node.attr, Unresolved(ast.unparse(node)))
        return Unresolved(ast.unparse(node))
    if isinstance(node, ast.Subscript):
        base = _eval(node.value, env, attrs)
        key = _eval(node.slice, env, attrs)
        if isinstance(base, dict) and not isinstance(key, Unresolved):
            if key not in base:
                return Unresolved(ast.unparse(node) + "  (KeyError in the packaged config.yaml)")
            return base[key]
        return Unresolved(ast.unparse(node))
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env, attrs), _eval(node.right, env, attrs)
        if isinstance(a, Unresolved) or isinstance(b, Unresolved):
            return Unresolved(ast.unparse(node))
        ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
               ast.Mult: lambda x, y: x * y, ast.FloorDiv: lambda x, y: x // y,
               ast.Div: lambda x, y: x / y, ast.Pow: lambda x, y: x ** y}
        try:
            return ops[type(node.op)](a, b)
        except Exception:
            return Unresolved(ast.unparse(node))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _eval(node.operand, env, attrs)
        return -v if isinstance(v, (int, float)) else Unresolved(ast.unparse(node))
    if isinstance(node, ast.Call):
        fn = node.func
        name = _call_name(fn)
        if name == "os.path.expanduser" and len(node.args) == 1 \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "~":
            return DynPath("$HOME")
        if name == "os.path.join":
            parts = [_eval(a, env, attrs) for a in node.args]
            if any(isinstance(p, Unresolved) or not isinstance(p, str) for p in parts):
                return Unresolved(ast.unparse(node))
            joined = parts[0]
            for p in parts[1:]:
                if p.startswith("/") or isinstance(p, DynPath):
                    joined = p   # an absolute part restarts the path, as in os.path.join
                else:
                    joined = joined.rstrip("/") + "/" + p
            return DynPath(joined) if isinstance(joined, DynPath) or (
                isinstance(parts[0], DynPath) and not any(p.startswith("/") for p in parts[1:])
            ) else joined
        if name == "os.path.dirname" and len(node.args) == 1:
            v = _eval(node.args[0], env, attrs)
            if isinstance(v, str) and not isinstance(v, Unresolved):
                return (DynPath if isinstance(v, DynPath) else str)(posixpath.dirname(v))
            return Unresolved(ast.unparse(node))
        if name == "Config.to_path" and len(node.args) == 1:
            # to_path: an absolute path as it is, else joined to the package directory
            v = _eval(node.args[0], env, attrs)
            if isinstance(v, str):
                return v if v.startswith("/") else DynPath("<ktransformers>/" + v)
            return Unresolved(ast.unparse(node))
        if isinstance(fn, ast.Attribute) and fn.attr == "get" and 1 <= len(node.args) <= 2:
            base = _eval(fn.value, env, attrs)
            key = _eval(node.args[0], env, attrs)
            default = _eval(node.args[1], env, attrs) if len(node.args) == 2 else None
            if isinstance(base, dict) and not isinstance(key, Unresolved):
                # dict.get returns the stored value even when it is None (an empty YAML value)
                return base[key] if key in base else default
            return Unresolved(ast.unparse(node))
        return Unresolved(ast.unparse(node))
    return Unresolved(ast.unparse(node))


def config_attributes(config_py: str, config: dict) -> dict:
    """Config.__init__'s self.<attr> values, the top-level assignments in order."""
    tree = ast.parse(config_py)
    init = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Config":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    init = item
    if init is None:
        raise ValueError("no Config.__init__ in config.py")
    env: dict = {}
    attrs: dict = {}
    for stmt in init.body:
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue   # if/for/expression statements: side effects (mkdir), not values
        if isinstance(value, ast.Call) and _call_name(value.func) == "Config.load":
            result: Any = config
        else:
            result = _eval(value, env, attrs)
        for t in targets:
            if isinstance(t, ast.Name):
                env[t.id] = result
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                    and t.value.id == "self":
                attrs[t.attr] = result
    return attrs


# ---------------------------------------------------------------------------------------------
# The parser: add_argument calls
# ---------------------------------------------------------------------------------------------

BARE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help",
                "version"}
TYPE_NAMES = {"int": "int", "str": "str", "float": "float", "bool": "bool", "list": "list"}
_DEPRECATED = re.compile(r"deprecat|abandon", re.I)


def parser_function(git_dir: Path, tag: str) -> tuple[str, ast.FunctionDef]:
    src = show(git_dir, tag, SERVER_ARGS)
    if src is not None:
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ClassDef) and node.name == "ArgumentParser":
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "parse_args":
                        return f"{SERVER_ARGS} ArgumentParser.parse_args", item
        raise ValueError(f"{tag}: {SERVER_ARGS} has no ArgumentParser.parse_args")
    src = show(git_dir, tag, SERVER_MAIN)
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            return f"{SERVER_MAIN} main", node
    raise ValueError(f"{tag}: no parser found in {SERVER_MAIN}")


def describe_parser(func: ast.FunctionDef, cfg_attrs: dict) -> dict:
    flags: set[str] = set()
    bare: set[str] = set()
    choices: dict[str, list] = {}
    defaults: dict[str, Any] = {}
    dynamic: dict[str, str] = {}
    types: dict[str, str] = {}
    bool_from_str: set[str] = set()
    deprecated: set[str] = set()
    required: set[str] = set()
    seen: dict[str, int] = {}
    conflicts: list[str] = []
    lines: dict[str, int] = {}

    for node in ast.walk(func):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str)]
        if not names or len(names) != len(node.args):
            raise ValueError(f"line {node.lineno}: add_argument with non-literal names")
        longs = [n for n in names if n.startswith("--")]
        if not longs:
            continue   # positional or short-only: none in any legacy release
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        main = longs[0]
        for n in longs:
            if n in seen:
                conflicts.append(f"{n} (lines {seen[n]} and {node.lineno})")
            seen[n] = node.lineno
        lines[main] = node.lineno

        action = kw.get("action")
        action_name = None
        if isinstance(action, ast.Constant):
            action_name = action.value
        elif action is not None:
            action_name = ast.unparse(action).split(".")[-1]
        optional_forms = list(longs)
        if action_name == "BooleanOptionalAction":
            optional_forms += ["--no-" + n[2:] for n in longs]
            bare.update(optional_forms)
            types[main] = "bool"
        elif action_name in BARE_ACTIONS:
            bare.update(longs)
            if action_name in ("store_true", "store_false"):
                types[main] = "bool"
        elif action_name not in (None, "store", "append", "extend"):
            raise ValueError(f"line {node.lineno}: unknown action {action_name}")
        flags.update(optional_forms)
        nargs = kw.get("nargs")
        if isinstance(nargs, ast.Constant) and nargs.value == 0:
            bare.update(longs)

        if main not in types:
            t = kw.get("type")
            if t is None:
                types[main] = "str"
            elif isinstance(t, ast.Name) and t.id in TYPE_NAMES:
                types[main] = TYPE_NAMES[t.id]
            else:
                types[main] = ast.unparse(t)
            if types[main] == "bool" and main not in bare:
                bool_from_str.add(main)

        if "choices" in kw:
            try:
                choices[main] = sorted(str(c) for c in ast.literal_eval(kw["choices"]))
            except ValueError:
                choices[main] = [f"<unresolved: {ast.unparse(kw['choices'])}>"]

        d = kw.get("default")
        if d is None:
            value: Any = False if action_name == "store_true" else \
                True if action_name == "store_false" else None
        else:
            try:
                value = ast.literal_eval(d)
            except ValueError:
                value = _default_from_config(d, cfg_attrs)
        if isinstance(value, Unresolved):
            dynamic[main] = value.text
        elif isinstance(value, DynPath):
            dynamic[main] = str(value)
        elif "secret" in main and isinstance(value, str) and value:
            dynamic[main] = "(a literal secret in the packaged config.yaml; not copied here)"
        else:
            defaults[main] = value

        req = kw.get("required")
        if isinstance(req, ast.Constant) and req.value is True:
            required.add(main)
        h = kw.get("help")
        if isinstance(h, ast.Constant) and isinstance(h.value, str) and _DEPRECATED.search(h.value):
            deprecated.add(main)

    return {
        "flags": sorted(flags),
        "bare": sorted(bare),
        "choices": dict(sorted(choices.items())),
        "defaults": dict(sorted(defaults.items())),
        "defaults_dynamic": dict(sorted(dynamic.items())),
        "types": dict(sorted(types.items())),
        "bool_from_str": sorted(bool_from_str),
        "deprecated": sorted(deprecated),
        "required": sorted(required),
        "conflicts": conflicts,
        "lines": dict(sorted(lines.items())),
    }


def _default_from_config(node: ast.AST, cfg_attrs: dict) -> Any:
    """self.cfg.X / cfg.X -> the Config attribute; anything else stays unresolved."""
    if isinstance(node, ast.Attribute):
        owner = ast.unparse(node.value)
        if owner in ("self.cfg", "cfg"):
            if node.attr not in cfg_attrs:
                return Unresolved(f"{ast.unparse(node)} (not set by Config.__init__)")
            v = cfg_attrs[node.attr]
            if isinstance(v, Unresolved):
                return Unresolved(f"{ast.unparse(node)} = {v.text}")
            return v
    return Unresolved(ast.unparse(node))


# ---------------------------------------------------------------------------------------------
# Per tag
# ---------------------------------------------------------------------------------------------

def package_version(git_dir: Path, tag: str) -> str | None:
    src = show(git_dir, tag, INIT_PY)
    if src is None:
        return None
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def legacy_entry(git_dir: Path, tag: str) -> dict:
    where, func = parser_function(git_dir, tag)
    config = read_yaml(show(git_dir, tag, CONFIG_YAML) or "")
    cfg_attrs = config_attributes(show(git_dir, tag, CONFIG_PY) or "", config)
    d = describe_parser(func, cfg_attrs)
    if d["conflicts"]:
        raise ValueError(f"{tag}: option registered twice: {d['conflicts']}")
    del d["conflicts"]
    del d["lines"]
    return {
        "legacy_server": True,
        "tag": tag,
        "commit": tag_commit(git_dir, tag),
        "package_version": package_version(git_dir, tag),
        "parser": where,
        **d,
    }


def removed_entry(git_dir: Path, tag: str) -> dict:
    log = git(git_dir, "log", "-1", "--diff-filter=D", "--format=%H%x00%s", tag, "--",
              SERVER_MAIN).strip()
    commit, _, subject = log.partition("\0")
    archived = show(git_dir, tag, "archive/" + SERVER_MAIN) is not None
    note = REMOVED_NOTE.format(commit=commit[:8] or "?", subject=subject or "?")
    if not archived:
        note = note.replace("was moved to archive/", "was removed")
    return {"legacy_server": False, "tag": tag, "commit": tag_commit(git_dir, tag),
            "flags": [], "removed_note": note}


def build(git_dir: Path, tags: list[str] | None, after_removal: int) -> dict:
    all_tags = release_tags(git_dir)
    chosen = tags or all_tags
    unknown = [t for t in chosen if show(git_dir, t, "README.md") is None
               and show(git_dir, t, SERVER_MAIN) is None]
    if unknown:
        raise SystemExit(f"unknown tags (or no README.md): {unknown}")
    versions: dict[str, dict] = {}
    removed: list[str] = []
    for tag in chosen:
        if show(git_dir, tag, SERVER_MAIN) is not None:
            versions[version_key(tag)] = legacy_entry(git_dir, tag)
        else:
            removed.append(tag)
    if tags is None and removed:
        removed = removed[:after_removal] + ([removed[-1]] if len(removed) > after_removal else [])
    for tag in removed:
        versions[version_key(tag)] = removed_entry(git_dir, tag)
    return {
        "generated_by": "tools/extract_ktransformers_flags.py",
        "notes": NOTES,
        "versions": {k: versions[k] for k in sorted(versions, key=sort_key)},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("git_dir", type=Path,
                    help="a clone or bare mirror of kvcache-ai/ktransformers, with tags")
    ap.add_argument("--tags", nargs="+", help="tags to read (default: every v* release tag)")
    ap.add_argument("--after-removal", type=int, default=3,
                    help="how many tags after the server's removal to list, besides the newest")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--stdout", action="store_true", help="print the JSON instead of writing it")
    a = ap.parse_args(argv)
    data = build(a.git_dir, a.tags, a.after_removal)
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if a.stdout:
        sys.stdout.write(text)
    else:
        a.out.write_text(text, encoding="utf-8")
        for v, d in data["versions"].items():
            print(f"{v:14} {d['tag']:14} legacy_server={d['legacy_server']!s:5} "
                  f"flags={len(d['flags'])}", file=sys.stderr)
        print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
