"""Run SGLang's REAL launch_server argument parser over command lines (engines venv only).

Run with the python of the engines venv (scripts/setup-engines.sh), never with the project's:

    echo '{"argvs": [["--model-path", "/m", "--tp-size", "8"]]}' | .venv-engines/bin/python sglang_check.py
    .venv-engines/bin/python sglang_check.py --list-flags

Batch mode reads ``{"argvs": [[...], ...], "keys": [...]?, "list_flags": true?}`` on stdin and
prints ``{"sglang_version": "...", "results": [...], "list_flags": {...}?}``, one result per argv
(and, when asked, what ``--list-flags`` prints):

* ``ok`` / ``error``: the strict parse, exactly
  ``parser = argparse.ArgumentParser(allow_abbrev=False); ServerArgs.add_cli_args(parser);
  parser.parse_args(argv)``. ``error`` is argparse's message (the text after ``error: ``).
* ``server_ok`` / ``server_error``: the same argv through the parser the real server builds in
  ``sglang.srt.server_args.prepare_server_args`` (``ArgumentParser(prog="sglang serve")``, i.e.
  ``allow_abbrev=True``, then ``parse_args``). Strict is stricter: an abbreviation such as
  ``--tp 8`` passes here and fails strict; a prefix of two flags is "ambiguous" here.
* ``values``: on a strict success, the parsed namespace values of ``keys`` (default below) that
  exist in this version's namespace.
* ``warnings``: messages SGLang logged while parsing (deprecated flags log one each).

``--stub MODULE`` (repeatable) makes ``import MODULE`` (and its submodules) give a placeholder
when, and only when, no real MODULE can be found: an older SGLang release imports at module level
packages the engines venv does not hold (and its parser never calls). The placeholders are listed,
with why each is harmless, in conftest.py's ``SGLANG_RELEASES``; the output names the ones used.
An older release itself comes first on ``PYTHONPATH`` (scripts/setup-sglang-releases.sh).

``--serve`` answers one such request per line of stdin from one import (checkserve.py).

``--list-flags`` prints ``{"sglang_version", "flags", "deprecated", "choices"}`` for the strict
parser: every option string starting with ``--`` except argparse's own ``--help``, the flags whose
action is one of SGLang's ``Deprecated*Action`` classes or whose help announces them deprecated, and the
``choices`` of every option that has them (keyed by the option's first ``--`` string).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import logging
import re
import sys
import types

DEFAULT_KEYS = [
    "kt_weight_path", "kt_method", "kt_cpuinfer", "kt_threadpool_count", "kt_num_gpu_experts",
    "model_path",
    "served_model_name",
    "host",
    "port",
    "tp_size",
    "dp_size",
    "attn_dp_size",
    "enable_dp_attention",
    "ep_size",
    "nnodes",
    "node_rank",
    "dist_init_addr",
    "moe_a2a_backend",
    "deepep_mode",
    "disaggregation_mode",
    "disaggregation_transfer_backend",
    "disaggregation_bootstrap_port",
    "disaggregation_ib_device",
    "mem_fraction_static",
    "max_running_requests",
    "disable_radix_cache",
    "cuda_graph_max_bs_decode",
    "trust_remote_code",
    "load_balance_method",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEPRECATED_LEAD = re.compile(r"^\W*(?:note:\s*)?deprecated\b|\(deprecated\b", re.I)


def announces_deprecated(help_text: str, names) -> bool:
    """Same rule as tools/extract_sglang_flags.py: the help announces ITS flag as deprecated
    ("Deprecated. Use ...", "(Deprecated: ...", "--x is deprecated"), not merely mentions the word
    ("Replaces the deprecated --grpc-mode")."""
    if _DEPRECATED_LEAD.search(help_text):
        return True
    low = help_text.lower()
    if re.search(r"\bthis (?:flag|option|argument) is deprecated", low):
        return True
    return any(f"{n.lower()} is deprecated" in low for n in names)


class _StubMeta(type):
    """A placeholder class: any attribute is another placeholder, ``X[...]`` is X itself, and it
    iterates as empty, so module-level uses (subclassing, type hints, registries) get through."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")

    def __getitem__(cls, _key):
        return cls

    def __iter__(cls):
        return iter(())


def _stub_class(name: str) -> type:
    def any_schema(_cls, *_a):  # a pydantic model may name it as a field's type
        from pydantic_core import core_schema
        return core_schema.any_schema()

    return _StubMeta(name, (), {
        "__init__": lambda self, *a, **k: None,
        "__init_subclass__": classmethod(lambda c, **k: None),
        "__call__": lambda self, *a, **k: None,
        "__get_pydantic_core_schema__": classmethod(any_schema),
    })


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: it only answers for a listed top-level name no other finder found,
    so a stub never hides a real package."""

    def __init__(self, names):
        self.names = set(names)
        self.used: set[str] = set()

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in self.names:
            return None
        self.used.add(top)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


_STUBS = _StubFinder(())


def install_stubs(names) -> _StubFinder:
    """Placeholders for `names`, LAST on sys.meta_path so every real finder answers first."""
    _STUBS.names.update(names)
    if _STUBS not in sys.meta_path:
        sys.meta_path.append(_STUBS)
    return _STUBS


def _import_server_args():
    # Importing sglang may print to stdout; keep stdout for our JSON only.
    with contextlib.redirect_stdout(sys.stderr):
        import sglang
        from sglang.srt.server_args import ServerArgs
    return getattr(sglang, "__version__", "unknown"), ServerArgs


def _build(ServerArgs, *, server: bool) -> argparse.ArgumentParser:
    if server:  # what sglang.srt.server_args.prepare_server_args builds
        parser = argparse.ArgumentParser(prog="sglang serve")
    else:
        parser = argparse.ArgumentParser(allow_abbrev=False)
    ServerArgs.add_cli_args(parser)
    return parser


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # pragma: no cover - defensive
            msg = str(record.msg)
        self.messages.append(_ANSI.sub("", msg))


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _parse(parser, argv):
    """Parse one argv; return (namespace | None, error | None, logged warnings)."""
    err = io.StringIO()
    cap = _Capture()
    root = logging.getLogger()
    root.addHandler(cap)
    old_level = root.level
    root.setLevel(min(old_level or logging.WARNING, logging.WARNING))
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
            try:
                return parser.parse_args(argv), None, cap.messages
            except SystemExit as exc:
                text = err.getvalue().strip()
                m = re.search(r"error: (.*)\Z", text, re.S)
                msg = m.group(1).strip() if m else (text or f"SystemExit({exc.code})")
                return None, msg, cap.messages
            except Exception as exc:  # a custom action raising (e.g. a bad JSON value)
                return None, f"{type(exc).__name__}: {exc}", cap.messages
    finally:
        root.removeHandler(cap)
        root.setLevel(old_level)


def check(argvs, keys=None):
    version, ServerArgs = _import_server_args()
    keys = list(keys or DEFAULT_KEYS)
    results = []
    # Built once, used for every argv: building one runs add_cli_args (~0.1 s for 500 options),
    # parsing takes ~1 ms, and parse_args keeps no state between calls (argparse makes a fresh
    # namespace; SGLang's own actions, sglang/srt/arg_groups/argparse_actions.py, only log and
    # set the namespace), so a reused parser answers each argv as a fresh one would.
    strict, server = _build(ServerArgs, server=False), _build(ServerArgs, server=True)
    for argv in argvs:
        argv = [str(a) for a in argv]
        ns, error, warnings = _parse(strict, argv)
        res: dict = {"ok": error is None}
        if error is None:
            res["values"] = {k: _jsonable(getattr(ns, k)) for k in keys if hasattr(ns, k)}
        else:
            res["error"] = error
        sns, serror, _ = _parse(server, argv)
        res["server_ok"] = serror is None
        if serror is not None:
            res["server_error"] = serror
        res["warnings"] = warnings
        results.append(res)
    return {"sglang_version": version, "results": results, "stubs": sorted(_STUBS.used)}


def list_flags():
    version, ServerArgs = _import_server_args()
    parser = _build(ServerArgs, server=False)
    flags, deprecated, choices = set(), set(), {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        flags.update(longs)
        help_text = action.help if isinstance(action.help, str) else ""
        if type(action).__name__.startswith("Deprecated") or announces_deprecated(help_text, action.option_strings):
            deprecated.update(longs)
        if action.choices is not None and longs:
            choices[longs[0]] = sorted({str(c) for c in action.choices})
    shorts = sorted(
        s
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction)
        for s in a.option_strings
        if not s.startswith("--")
    )
    return {
        "sglang_version": version,
        "flags": sorted(flags),
        "short_flags": shorts,
        "deprecated": sorted(deprecated),
        "choices": dict(sorted(choices.items())),
        "stubs": sorted(_STUBS.used),
    }


def answer(args: argparse.Namespace, stdin: str | None) -> dict:
    if args.list_flags:
        return list_flags()
    req = json.loads(stdin)
    out = check(req["argvs"], req.get("keys"))
    if req.get("list_flags"):  # both answers from one import of SGLang (~5 s each)
        out["list_flags"] = list_flags()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list-flags", action="store_true")
    ap.add_argument("--stub", action="append", default=[], metavar="MODULE")
    ap.add_argument("--serve", action="store_true",
                    help="answer one request per stdin line (checkserve.py)")
    args = ap.parse_args(argv)
    install_stubs(args.stub)
    if args.serve:
        from checkserve import serve
        return serve(lambda a, stdin: answer(ap.parse_args(a), stdin))
    json.dump(answer(args, None if args.list_flags else sys.stdin.read()), sys.stdout,
              sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
