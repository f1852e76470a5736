#!/usr/bin/env python3
"""Extract TensorRT-LLM's ``trtllm-serve`` CLI and config-file grammar from its git history, statically.

TensorRT-LLM has no wheel that pip can fetch from the public index (NVIDIA hosts its wheels
elsewhere), and importing ``tensorrt_llm`` needs CUDA, TensorRT and MPI, so -- like
``tools/extract_sglang_flags.py`` and unlike ``tools/extract_vllm_flags.py`` -- this reads the
source with ``ast`` and never imports it. The input is a git directory of
https://github.com/NVIDIA/TensorRT-LLM (a bare mirror is enough: files are read with
``git show REF:path``) and a list of refs (release tags ``v1.0.0``, ``v1.1.0``, ``v1.2.0``,
``v1.2.1`` by default). A ref that does not exist is reported on stderr and skipped.

For every ref it reads:

* ``tensorrt_llm/commands/serve.py``: the ``@click.option``/``@click.argument`` decorators of the
  ``serve`` command (``trtllm-serve [serve] MODEL``) and of the ``disaggregated`` command
  (``trtllm-serve disaggregated -c cfg.yaml``). Every option string is listed: aliases
  (``--tp_size`` and ``--tensor_parallel_size``), both halves of ``--x/--no-x`` switches, short
  options (mapped to the option's first long spelling). ``bare`` lists flags that take no value
  (``is_flag=True``, ``count=True``, either half of a ``--x/--no-x`` pair). ``choices`` come from
  ``click.Choice(...)`` (or TensorRT-LLM's ``ChoiceWithAlias(choices, aliases)``: the alias keys
  are accepted spellings too): a literal list, a module-level name, ``get_args(<Literal alias>)``,
  or ``<dict>.keys()`` where the dict is a module-level or class-level dict literal, following
  ``from X import Y`` into other files of the same ref (``severity_map`` in
  ``tensorrt_llm/logger.py``, ``ReasoningParserFactory.parsers``, ``ToolParserFactory.parsers``).
  Anything else goes to ``choices_unresolved``. ``defaults`` holds literal defaults only (a
  default such as ``BuildConfig.model_fields["max_batch_size"].default`` is not evaluated).
  ``deprecated`` lists flags whose help text announces them deprecated (click has no
  deprecation flag on these releases' options).
* ``tensorrt_llm/llmapi/llm_args.py``: the pydantic fields (annotated class attributes, not
  ``ClassVar``, not ``_private``) of ``TorchLlmArgs`` including those inherited from its bases
  defined in the same file (``BaseLlmArgs``): the top-level keys accepted in the
  ``--config``/``--extra_llm_api_options`` YAML of the PyTorch backend; and the fields of
  ``CudaGraphConfig``, ``CacheTransceiverConfig`` (with the ``Literal`` choices of its ``backend``
  field), ``KvCacheConfig`` and ``MoeConfig`` (with its ``backend`` choices). ``forbids_extra``
  says whether ``StrictBaseModel`` sets ``extra = "forbid"`` (an unknown YAML key is then a
  validation error).
* ``tensorrt_llm/llmapi/disagg_utils.py``: the grammar of the ``disaggregated -c`` YAML as
  ``parse_disagg_config_file`` reads it: ``yaml.safe_load`` then ``extract_disagg_cfg(**config)``,
  whose keyword parameters are the known top-level keys; each of ``context_servers`` and
  ``generation_servers`` goes through ``extract_router_config`` (keys it pops: ``router``) and
  ``extract_ctx_gen_cfgs(type=..., **section)``, whose keyword parameters are the known section
  keys. ``required`` lists parameters without a default. ``unknown_keys`` says what the code does
  with other keys (the ``**kwargs`` of those two functions), derived from the shape of the code.
* ``tensorrt_llm/version.py``: ``__version__``, used as the version key of the output.

The input can also be a directory of single files saved at one commit (``--src-dir``), laid out
by their repository paths, for when the repository (2.5 GB) cannot be mirrored: only the files
above are read (plus the ones their ``from X import Y`` lead to, e.g. ``tensorrt_llm/logger.py``
and ``tensorrt_llm/llmapi/reasoning_parser.py``; a missing one leaves that option's choices in
``choices_unresolved``). ``--repo``, ``--tag`` and ``--commit`` then say where the files come
from and are recorded as the version's ``repo``, ``ref`` and ``commit``.

Usage::

    python3 tools/extract_trtllm_flags.py --git-dir /path/to/TensorRT-LLM.git
    # the files of NVIDIA/TensorRT-LLM at tag v1.2.1, each saved from
    # https://raw.githubusercontent.com/NVIDIA/TensorRT-LLM/v1.2.1/<path> into DIR/<path>:
    python3 tools/extract_trtllm_flags.py --src-dir DIR --repo NVIDIA/TensorRT-LLM \
        --tag v1.2.1 --commit <the tag's 40-hex commit> --no-merge
    python3 tools/extract_trtllm_flags.py --git-dir DIR --refs v1.2.1 --stdout
    python3 tools/extract_trtllm_flags.py --git-dir DIR --refs HEAD --out /tmp/x.json

Without ``--out`` it writes ``hpcserve/engines/data/trtllm_flags.json``; an existing file there is
merged: versions extracted now replace the same keys, others are kept.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

REFS = ["v1.0.0", "v1.1.0", "v1.2.0", "v1.2.1"]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "hpcserve" / "engines" / "data" / "trtllm_flags.json"

SERVE = "tensorrt_llm/commands/serve.py"
LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"
DISAGG = "tensorrt_llm/llmapi/disagg_utils.py"
VERSION = "tensorrt_llm/version.py"

NOTES = (
    "Extracted statically (ast, tensorrt_llm never imported) from the NVIDIA/TensorRT-LLM git "
    "tree at each ref by tools/extract_trtllm_flags.py. flags = every long option string of the "
    "`serve` click command in tensorrt_llm/commands/serve.py (aliases and --no-x halves "
    "included; click's --help excluded); short = single-dash option -> the option's first long "
    "spelling; bare = flags taking no value; choices from click.Choice/ChoiceWithAlias "
    "(alias keys included) where statically resolvable, else listed in choices_unresolved; "
    "defaults = literal defaults only. disaggregated = the same for `trtllm-serve "
    "disaggregated`. llm_api = pydantic fields in tensorrt_llm/llmapi/llm_args.py (TorchLlmArgs "
    "with its in-file bases = top-level keys of the --config/--extra_llm_api_options YAML). "
    "disagg_config = keys read by extract_disagg_cfg / extract_ctx_gen_cfgs / "
    "extract_router_config in tensorrt_llm/llmapi/disagg_utils.py. Options are underscore-"
    "spelled; click does not rewrite dashes to underscores, so only the listed spellings parse."
)


class Unresolved(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Source access
# ---------------------------------------------------------------------------------------------


class GitTree:
    """Files of one ref of a (possibly bare) git directory."""

    def __init__(self, git_dir: Path, ref: str):
        self.git_dir = git_dir
        self.ref = ref
        self._cache: dict[str, str | None] = {}
        self._ast: dict[str, ast.Module] = {}

    def _git(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "--git-dir", str(self.git_dir), *args],
                              capture_output=True, text=True, check=False)

    def commit(self) -> str | None:
        p = self._git("rev-parse", "--verify", "--quiet", f"{self.ref}^{{commit}}")
        return p.stdout.strip() or None

    def read(self, path: str) -> str | None:
        if path not in self._cache:
            p = self._git("show", f"{self.ref}:{path}")
            self._cache[path] = p.stdout if p.returncode == 0 else None
        return self._cache[path]

    def module(self, path: str) -> ast.Module | None:
        if path not in self._ast:
            text = self.read(path)
            if text is None:
                return None
            self._ast[path] = ast.parse(text, filename=path)
        return self._ast[path]

    def module_path(self, dotted: str) -> str | None:
        """``a.b.c`` -> ``a/b/c.py`` or ``a/b/c/__init__.py``, whichever exists at this ref."""
        base = dotted.replace(".", "/")
        for cand in (f"{base}.py", f"{base}/__init__.py"):
            if self.read(cand) is not None:
                return cand
        return None


class FileTree(GitTree):
    """The same files, saved one by one under a directory at one commit (no git history)."""

    def __init__(self, root: Path, ref: str, commit: str | None):
        super().__init__(root, ref)
        self._commit = commit

    def commit(self) -> str | None:
        return self._commit

    def read(self, path: str) -> str | None:
        if path not in self._cache:
            f = self.git_dir / path
            self._cache[path] = f.read_text() if f.is_file() else None
        return self._cache[path]


def package_of(path: str) -> str:
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    else:
        parts = parts[:-1]
    return ".".join(parts)


# ---------------------------------------------------------------------------------------------
# Static evaluation (small: literals, module names, imports, dict keys, Literal args)
# ---------------------------------------------------------------------------------------------


def find_binding(tree: GitTree, path: str, name: str, depth: int = 0):
    """Where a module-level ``name`` of ``path`` is defined: ("assign", path, value node) or
    ("class", path, ClassDef), following ``from X import name`` (absolute and relative)."""
    if depth > 6:
        raise Unresolved(name)
    mod = tree.module(path)
    if mod is None:
        raise Unresolved(f"{path} missing")
    found = None
    for node in mod.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            found = ("class", path, node)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == name:
                    found = ("assign", path, node.value)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id == name and node.value is not None:
            found = ("assign", path, node.value)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    if node.level:
                        pkg = package_of(path).split(".")
                        if node.level > 1:
                            pkg = pkg[:-(node.level - 1)]
                        dotted = ".".join(pkg + ([node.module] if node.module else []))
                    else:
                        dotted = node.module or ""
                    target = tree.module_path(dotted)
                    if target is None:
                        # "from pkg import submodule"
                        sub = tree.module_path(f"{dotted}.{alias.name}")
                        if sub is not None:
                            found = ("module", sub, None)
                            continue
                        found = ("external", dotted, alias.name)
                        continue
                    found = ("import", target, alias.name)
    if found is None:
        raise Unresolved(name)
    if found[0] == "import":
        return find_binding(tree, found[1], found[2], depth + 1)
    if found[0] == "external":
        raise Unresolved(f"{found[1]}.{found[2]} (outside the tree)")
    return found


def literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except Exception as e:  # noqa: BLE001 - any non-literal
        raise Unresolved(ast.unparse(node)) from e


def class_attr(cls: ast.ClassDef, attr: str) -> ast.AST:
    for node in cls.body:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == attr:
                    return node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                and node.target.id == attr and node.value is not None:
            return node.value
    raise Unresolved(f"{cls.name}.{attr}")


def literal_strings(node: ast.AST) -> list[str]:
    """String arguments of every ``Literal[...]`` inside an annotation."""
    out: list[str] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and _name(sub.value) == "Literal":
            sl = sub.slice
            elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
            out += [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return out


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def evaluate(tree: GitTree, path: str, node: ast.AST):
    """A list/tuple/dict/str value, as far as this small evaluator can tell."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [evaluate(tree, path, e) for e in node.elts]
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        keys = [evaluate(tree, path, k) for k in node.keys if k is not None]
        return {k: None for k in keys}
    if isinstance(node, ast.Name):
        kind, where, value = find_binding(tree, path, node.id)
        if kind == "assign":
            return evaluate(tree, where, value)
        raise Unresolved(node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        kind, where, value = find_binding(tree, path, node.value.id)
        if kind == "class":
            return evaluate(tree, where, class_attr(value, node.attr))
        if kind == "module":
            k2, w2, v2 = find_binding(tree, where, node.attr)
            if k2 == "assign":
                return evaluate(tree, w2, v2)
        raise Unresolved(ast.unparse(node))
    if isinstance(node, ast.Subscript) and _name(node.value) == "Literal":
        return literal_strings(node)
    if isinstance(node, ast.Call):
        fn = node.func
        if isinstance(fn, ast.Attribute) and fn.attr == "keys" and not node.args:
            d = evaluate(tree, path, fn.value)
            if isinstance(d, dict):
                return list(d)
        if _name(fn) in ("list", "tuple", "sorted") and len(node.args) == 1:
            v = evaluate(tree, path, node.args[0])
            if isinstance(v, (list, dict)):
                return sorted(v) if _name(fn) == "sorted" else list(v)
        if _name(fn) == "get_args" and len(node.args) == 1:
            v = evaluate(tree, path, node.args[0])
            if isinstance(v, list):
                return v
        # enum-like: [x.value for x in Enum] is not attempted
    raise Unresolved(ast.unparse(node))


# ---------------------------------------------------------------------------------------------
# click commands
# ---------------------------------------------------------------------------------------------

_DEPRECATED = re.compile(r"\bdeprecated\b", re.I)


def _command_name(dec: ast.AST, func: ast.FunctionDef) -> str | None:
    """``@click.command("serve")`` / ``@click.command(name=...)`` / ``@main.command()``."""
    if not isinstance(dec, ast.Call) or _name(dec.func) != "command":
        return None
    if dec.args and isinstance(dec.args[0], ast.Constant):
        return dec.args[0].value
    for kw in dec.keywords:
        if kw.arg == "name" and isinstance(kw.value, ast.Constant):
            return kw.value.value
    return func.name.replace("_", "-")


def find_command(mod: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in mod.body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if _command_name(dec, node) == name:
                    return node
    return None


def _help_text(node: ast.AST | None) -> str:
    if node is None:
        return ""
    return " ".join(s.value for s in ast.walk(node)
                    if isinstance(s, ast.Constant) and isinstance(s.value, str))


def extract_command(tree: GitTree, func: ast.FunctionDef) -> dict:
    flags: set[str] = set()
    short: dict[str, str] = {}
    bare: set[str] = set()
    choices: dict[str, list[str]] = {}
    unresolved: set[str] = set()
    defaults: dict[str, object] = {}
    deprecated: set[str] = set()
    positional: list[str] = []
    for dec in func.decorator_list:
        if not isinstance(dec, ast.Call):
            continue
        kind = _name(dec.func)
        strs = [a.value for a in dec.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if kind == "argument":
            if strs:
                positional.append(strs[0])
            continue
        if kind != "option":
            continue
        kws = {kw.arg: kw.value for kw in dec.keywords if kw.arg}
        opts: list[str] = []
        secondary: list[str] = []
        for s in strs:
            if not s.startswith("-"):
                continue  # the python parameter name
            if "/" in s:
                a, b = s.split("/", 1)
                opts.append(a.strip())
                secondary.append(b.strip())
            else:
                opts.append(s)
        longs = [o for o in opts + secondary if o.startswith("--")]
        if not longs:
            continue
        primary = next(o for o in opts if o.startswith("--")) if any(
            o.startswith("--") for o in opts) else longs[0]
        flags.update(longs)
        for o in opts + secondary:
            if not o.startswith("--"):
                short[o] = primary
        is_bare = bool(secondary)
        for k in ("is_flag", "count"):
            if k in kws:
                try:
                    is_bare = is_bare or bool(literal(kws[k]))
                except Unresolved:
                    pass
        if is_bare:
            bare.update(longs)
        if "default" in kws:
            try:
                defaults[primary] = literal(kws["default"])
            except Unresolved:
                pass
        if _DEPRECATED.search(_help_text(kws.get("help"))):
            deprecated.update(longs)
        typ = kws.get("type")
        if isinstance(typ, ast.Call) and _name(typ.func) in ("Choice", "ChoiceWithAlias"):
            try:
                vals = [str(v) for v in evaluate(tree, SERVE, typ.args[0])]
                if _name(typ.func) == "ChoiceWithAlias" and len(typ.args) > 1:
                    vals += [str(v) for v in evaluate(tree, SERVE, typ.args[1])]
                choices[primary] = sorted(set(vals))
            except (Unresolved, IndexError, TypeError):
                unresolved.add(primary)
    return {
        "flags": sorted(flags),
        "short": dict(sorted(short.items())),
        "bare": sorted(bare),
        "choices": dict(sorted(choices.items())),
        "choices_unresolved": sorted(unresolved),
        "defaults": dict(sorted(defaults.items())),
        "deprecated": sorted(deprecated),
        "positional": positional,
    }


# ---------------------------------------------------------------------------------------------
# llm_args.py
# ---------------------------------------------------------------------------------------------


def _classes(mod: ast.Module) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in mod.body if isinstance(n, ast.ClassDef)}


def class_fields(classes: dict[str, ast.ClassDef], name: str, seen=None) -> dict[str, ast.AnnAssign]:
    """Annotated fields of ``name`` and of its bases defined in the same file (base first)."""
    seen = seen or set()
    if name not in classes or name in seen:
        return {}
    seen.add(name)
    cls = classes[name]
    out: dict[str, ast.AnnAssign] = {}
    for base in cls.bases:
        bn = _name(base)
        if bn:
            out.update(class_fields(classes, bn, seen))
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            field = node.target.id
            if field.startswith("_") or "ClassVar" in ast.unparse(node.annotation):
                continue
            if isinstance(node.value, ast.Call) and _name(node.value.func) == "PrivateAttr":
                continue
            out[field] = node
    return out


def field_literal_choices(classes, cls: str, field: str) -> list[str]:
    node = class_fields(classes, cls).get(field)
    return sorted(set(literal_strings(node.annotation))) if node is not None else []


def extract_llm_api(tree: GitTree) -> dict | None:
    mod = tree.module(LLM_ARGS)
    if mod is None:
        return None
    classes = _classes(mod)
    forbids = False
    strict = classes.get("StrictBaseModel")
    if strict is not None:
        src = ast.unparse(strict)
        forbids = bool(re.search(r"extra\s*=\s*['\"]forbid['\"]", src))

    def names(cls):
        return sorted(class_fields(classes, cls)) if cls in classes else []

    return {
        "fields": names("TorchLlmArgs"),
        "cuda_graph_config": names("CudaGraphConfig"),
        "cache_transceiver_config": names("CacheTransceiverConfig"),
        "cache_transceiver_backends": field_literal_choices(classes, "CacheTransceiverConfig", "backend"),
        "kv_cache_config": names("KvCacheConfig"),
        "moe_config": names("MoeConfig"),
        "moe_backends": field_literal_choices(classes, "MoeConfig", "backend"),
        "forbids_extra": forbids,
    }


# ---------------------------------------------------------------------------------------------
# disagg_utils.py
# ---------------------------------------------------------------------------------------------


def _params(fn: ast.FunctionDef) -> tuple[list[str], list[str], bool]:
    """(all keyword-able parameter names, those without default, has **kwargs)."""
    a = fn.args
    pos = a.posonlyargs + a.args
    n_nodef = len(pos) - len(a.defaults)
    names = [p.arg for p in pos] + [p.arg for p in a.kwonlyargs]
    required = [p.arg for p in pos[:n_nodef]]
    required += [p.arg for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    return names, required, a.kwarg is not None


def _popped_keys(fn: ast.FunctionDef, var: str) -> list[str]:
    """String keys read from parameter ``var`` with .pop/.get/[...] in ``fn``."""
    keys = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("pop", "get") and _name(node.func.value) == var \
                and node.args and isinstance(node.args[0], ast.Constant):
            keys.append(node.args[0].value)
    return keys


def extract_disagg(tree: GitTree) -> dict | None:
    mod = tree.module(DISAGG)
    if mod is None:
        return None
    funcs = {n.name: n for n in mod.body if isinstance(n, ast.FunctionDef)}
    top_fn, srv_fn, router_fn = (funcs.get(n) for n in
                                 ("extract_disagg_cfg", "extract_ctx_gen_cfgs", "extract_router_config"))
    if top_fn is None or srv_fn is None:
        return {"top": [], "server_keys": [], "required": [], "unknown_keys": "parser not found"}
    top, top_req, top_kw = _params(top_fn)
    srv, srv_req, srv_kw = _params(srv_fn)
    srv = [p for p in srv if p != "type"]  # passed by the caller, not a YAML key
    srv_req = [p for p in srv_req if p != "type"]
    if router_fn is not None:
        rparams = _params(router_fn)[0]
        if rparams:
            srv = srv + [k for k in _popped_keys(router_fn, rparams[0]) if k not in srv]
    src = ast.unparse(top_fn)
    notes = []
    if top_kw:
        if re.search(r"servers\[key\]\s*=\s*value", src):
            notes.append("unknown top-level keys are copied into both context_servers and "
                         "generation_servers (ValueError if a section sets the same key to a "
                         "different value)")
        else:
            notes.append("unknown top-level keys are accepted (**kwargs) and not used")
    else:
        notes.append("unknown top-level keys raise TypeError (no **kwargs)")
    if srv_kw:
        notes.append("unknown keys of a server section are kept as that instance's other_args "
                     "(LLM-API arguments; used by disaggregated_mpi_worker, and tp*pp*cp of them "
                     "gives instance_num_ranks); the `trtllm-serve disaggregated` proxy itself "
                     "uses only the urls")
    else:
        notes.append("unknown keys of a server section raise TypeError")
    if router_fn is not None:
        notes.append("`router` is popped from each section (its `type` defaults to round_robin)")
    return {
        "top": sorted(top),
        "server_keys": sorted(srv),
        "required": sorted(set(top_req) | {f"<section>.{r}" for r in srv_req}),
        "unknown_keys": "; ".join(notes),
    }


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def read_version(tree: GitTree) -> str | None:
    text = tree.read(VERSION)
    if text:
        m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text)
        if m:
            return m.group(1)
    return None


def extract_ref(git_dir: Path, ref: str, tree: GitTree | None = None) -> tuple[str, dict] | None:
    tree = tree or GitTree(git_dir, ref)
    commit = tree.commit()
    if commit is None:
        print(f"{ref}: no such ref in {git_dir}; skipped", file=sys.stderr)
        return None
    mod = tree.module(SERVE)
    if mod is None:
        print(f"{ref}: {SERVE} missing; skipped", file=sys.stderr)
        return None
    serve_fn = find_command(mod, "serve")
    if serve_fn is None:
        print(f"{ref}: no `serve` click command in {SERVE}; skipped", file=sys.stderr)
        return None
    entry = extract_command(tree, serve_fn)
    dis_fn = find_command(mod, "disaggregated")
    if dis_fn is not None:
        d = extract_command(tree, dis_fn)
        entry["disaggregated"] = {k: d[k] for k in ("flags", "bare", "short", "defaults",
                                                    "choices", "choices_unresolved")}
    entry["llm_api"] = extract_llm_api(tree)
    entry["disagg_config"] = extract_disagg(tree)
    entry["ref"] = ref
    entry["commit"] = commit
    version = read_version(tree) or (ref[1:] if re.fullmatch(r"v\d.*", ref) else ref)
    return version, dict(sorted(entry.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--git-dir", type=Path,
                     help="NVIDIA/TensorRT-LLM git directory (bare mirror or .git)")
    src.add_argument("--src-dir", type=Path,
                     help="directory of single files saved at one commit, by repository path")
    ap.add_argument("--repo", default=None,
                    help="the repository the files come from (with --src-dir: default "
                    "NVIDIA/TensorRT-LLM); recorded as each version's `repo`")
    ap.add_argument("--tag", help="with --src-dir: the release tag the files were saved at")
    ap.add_argument("--commit", help="with --src-dir: the tag's commit (40 hex digits)")
    ap.add_argument("--refs", nargs="+", default=REFS, help=f"tags or commits (default: {REFS})")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--stdout", action="store_true", help="print the JSON instead of writing it")
    ap.add_argument("--no-merge", action="store_true",
                    help="do not keep versions of an existing output file")
    ap.add_argument("--source", default=None,
                    help="recorded as each extracted version's `source` (say which repository the "
                    "git dir is, when it is not a mirror of NVIDIA/TensorRT-LLM)")
    args = ap.parse_args(argv)

    versions: dict[str, dict] = {}
    if not args.stdout and not args.no_merge and args.out.exists():
        versions.update(json.loads(args.out.read_text()).get("versions", {}))
    jobs: list[tuple[str, GitTree | None]] = [(ref, None) for ref in args.refs]
    if args.src_dir is not None:
        if not (args.tag and args.commit and re.fullmatch(r"[0-9a-f]{40}", args.commit)):
            ap.error("--src-dir needs --tag and --commit (40 hex digits): the table must say "
                     "which release its files come from")
        jobs = [(args.tag, FileTree(args.src_dir, args.tag, args.commit))]
        args.repo = args.repo or "NVIDIA/TensorRT-LLM"
    for ref, tree in jobs:
        got = extract_ref(args.git_dir or args.src_dir, ref, tree)
        if got is not None:
            if args.repo:
                got[1]["repo"] = args.repo
            if args.source:
                got[1]["source"] = args.source
            elif tree is not None:
                got[1]["source"] = (f"{args.repo} tag {args.tag} (commit {args.commit}): "
                                    f"{SERVE}, {LLM_ARGS}, {DISAGG}, {VERSION}, saved file by "
                                    "file at that commit")
            versions[got[0]] = got[1]
            print(f"{ref} -> {got[0]} ({got[1]['commit'][:12]}): {len(got[1]['flags'])} serve "
                  f"flags", file=sys.stderr)
    if not versions:
        print("nothing extracted", file=sys.stderr)
        return 1
    doc = {
        "generated_by": "tools/extract_trtllm_flags.py",
        "notes": NOTES,
        "versions": dict(sorted(versions.items())),
    }
    text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
    if args.stdout:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
