"""Runs command lines through the legacy KTransformers server's OWN parser, unmodified:
`ArgumentParser(Config()).parse_args()` of ktransformers/server/args.py, as
ktransformers/server/main.py calls it (v0.2.1.post1: `main()`, lines 106-111), from the files
scripts/setup-ktransformers-parser.sh took out of the release's sdist.

    python ktransformers_check.py SRC_DIR < {"argvs": [[...], ...]}   -> {"results": [...]}
    python ktransformers_check.py SRC_DIR --describe                   -> the parser's options

Only what args.py imports is loaded: ktransformers/__init__.py (its version),
server/backend/args.py (pydantic), server/config/config.py (PyYAML) and server/config/
singleton.py; the package's heavy modules (torch, the CUDA operators, the backends) are never
imported, and this script fails if torch or transformers got imported all the same. No stub is
needed for 0.2.1.post1. Config() reads the packaged configs/config.yaml through a copy it makes
under $HOME/.ktransformers, so the caller gives this process a fresh HOME.

Each argv gets a new Config (the singleton is emptied): parse_args writes the parsed values into
it, and the next argv's defaults must not be the last one's values. Each result: ok, error
(argparse's message, which it writes to stderr before exiting 2) and values (the namespace).
--describe wraps argparse.ArgumentParser.parse_args to keep the parser parse_args built (its own
code still runs as it is) and lists each option: its strings, whether it takes a value, its type.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys


def load(src: str):
    sys.dont_write_bytecode = True
    sys.path.insert(0, src)
    import ktransformers
    from ktransformers.server import args as kargs
    from ktransformers.server.config.config import Config
    from ktransformers.server.config.singleton import Singleton
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
    if heavy:
        sys.exit(f"ktransformers_check: loading args.py imported {heavy}")
    return ktransformers.__version__, kargs, Config, Singleton


def parse(kargs, Config, Singleton, argv: list[str]):
    Singleton._instances.clear()
    sys.argv = ["ktransformers/server/main.py", *argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns = kargs.ArgumentParser(Config()).parse_args()
    except SystemExit as e:
        return {"ok": False, "code": e.code, "error": err.getvalue().strip().splitlines()[-1:]}
    return {"ok": True, "values": {k: v for k, v in vars(ns).items()
                                   if v is None or isinstance(v, (str, int, float, bool, list))}}


def describe(kargs, Config, Singleton) -> list[dict]:
    built: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def keep(self, *a, **kw):
        built.append(self)
        return original(self, *a, **kw)

    argparse.ArgumentParser.parse_args = keep
    try:
        parse(kargs, Config, Singleton, [])
    finally:
        argparse.ArgumentParser.parse_args = original
    (parser,) = built
    out = []
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        t = getattr(a.type, "__name__", None) if a.type is not None else "str"
        if isinstance(a, argparse.BooleanOptionalAction) or a.nargs == 0:
            t = "bool"
        out.append({"options": list(a.option_strings), "bare": a.nargs == 0
                    or isinstance(a, argparse.BooleanOptionalAction), "type": t,
                    "required": a.required})
    return out


def main() -> None:
    src = sys.argv[1]
    version, kargs, Config, Singleton = load(src)
    if sys.argv[2:] == ["--describe"]:
        rules = os.path.join(src, "ktransformers", "optimize", "optimize_rules")
        print(json.dumps({"version": version, "options": describe(kargs, Config, Singleton),
                          "optimize_rules": sorted(
                              os.path.relpath(os.path.join(d, f), rules)
                              for d, _, fs in os.walk(rules) for f in fs)}))
        return
    req = json.load(sys.stdin)
    print(json.dumps({"version": version,
                      "results": [parse(kargs, Config, Singleton, [str(a) for a in argv])
                                  for argv in req["argvs"]]}))


if __name__ == "__main__":
    main()
