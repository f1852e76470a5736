"""SGLang's benchmark client's own argument parser, without importing its module (which needs
transformers, datasets and torchvision, absent beside a CPU torch): `cli_main` is taken from
sglang/benchmark/serving.py's source (with the module's other definitions) and run up to its
`parser.parse_args()`, which parses the
given argv strictly (no abbreviations) and stops there. The backends' names are the keys of the
module's own ASYNC_REQUEST_FUNCS.

    python sglang_bench_check.py SERVING_PY < argv.json   ->   {"ok": bool, "error": str, "args": {...}}
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import sys


class Parsed(Exception):
    def __init__(self, ns: argparse.Namespace):
        self.ns = ns


def parser_of(argv: list[str]) -> type:
    class Strict(argparse.ArgumentParser):
        def __init__(self, *a, **kw):
            super().__init__(*a, allow_abbrev=False, **kw)

        def parse_args(self, args=None, namespace=None):
            raise Parsed(super().parse_args(argv))
    return Strict


def definitions(path: str, depth: int = 1) -> dict:
    """What a module of sglang.benchmark defines without its third-party imports: its functions,
    classes and constants, and the names it imports from its sibling modules."""
    pkg = os.path.dirname(path)
    names: dict = {"argparse": argparse}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.ImportFrom) and depth and \
                (node.module or "").startswith("sglang.benchmark."):
            sib = os.path.join(pkg, node.module.split(".")[-1] + ".py")
            if os.path.isfile(sib):
                there = definitions(sib, depth - 1)
                names.update({a.asname or a.name: there[a.name] for a in node.names
                              if a.name in there})
        elif isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "ASYNC_REQUEST_FUNCS" for t in node.targets):
            names["ASYNC_REQUEST_FUNCS"] = dict.fromkeys(k.value for k in node.value.keys)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
            # function bodies do not run; one that needs the module's imports is left out
            try:
                exec(compile(ast.Module([node], []), path, "exec"), names)
            except Exception:  # noqa: BLE001 - what it needed was an import
                pass
    return names


def check(path: str, argv: list[str]) -> dict:
    names = definitions(path)
    names["ArgumentParser"] = parser_of(argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            names["cli_main"]()
    except Parsed as p:
        return {"ok": True, "error": "", "args": {k: v for k, v in vars(p.ns).items()
                                                   if isinstance(v, (str, int, float, bool))}}
    except SystemExit:
        return {"ok": False, "error": err.getvalue().strip().splitlines()[-1], "args": {}}
    return {"ok": False, "error": "cli_main returned without parsing", "args": {}}


if __name__ == "__main__":
    print(json.dumps(check(sys.argv[1], json.load(sys.stdin))))
