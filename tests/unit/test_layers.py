"""The package's folders are its layers, and each imports only what lies below it.

  author/     a deployment file -> a job directory (config, schema, plan, render): runs on the
              user's machine, without Slurm;
  engines/    the engine adapters the planner asks (between author's value types and its plan);
  operate/    the commands' operations on deployments that exist, through one runner;
  slurm/      the runner: Slurm's commands here or over SSH;
  runtime/    what runs inside the job: stdlib only, copied into every job directory;
  devcluster/ and sim/: the development cluster, the demo and the engines' stand-ins, which
              nothing of the product imports.

Read with `ast` through the import-cycle test's graph: every import counts, also a lazy one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_import_cycles import import_graph

ROOT = Path(__file__).resolve().parents[2]

# folder -> the folders it must never import (the top-level modules cli, errors and
# package_data are "hpcserve"; only __main__ may import cli)
NEVER = {
    "runtime": {"author", "operate", "engines", "slurm", "devcluster", "sim", "hpcserve"},
    "author": {"operate", "slurm", "devcluster", "sim", "cli"},
    "engines": {"operate", "slurm", "devcluster", "sim", "cli"},
    "slurm": {"author", "operate", "engines", "devcluster", "sim", "cli"},
    "operate": {"devcluster", "sim", "cli"},
    "sim": {"author", "operate", "engines", "slurm", "devcluster", "cli"},
}


def folder(module: str) -> str:
    """hpcserve.author.plan -> author; hpcserve.errors -> hpcserve; hpcserve.cli -> cli."""
    parts = module.split(".")
    if len(parts) == 2 and parts[1] == "cli":
        return "cli"
    if len(parts) == 2 and (ROOT / "hpcserve" / parts[1]).is_dir():
        return parts[1]  # a folder's __init__
    return parts[1] if len(parts) > 2 else "hpcserve"


def crossings(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            if folder(b) in NEVER.get(folder(a), ()):
                out.append(f"{a} -> {b}")
    return out


def test_every_folder_imports_only_the_layers_below_it():
    graph = import_graph(ROOT, "hpcserve")
    assert {"hpcserve.author.render", "hpcserve.operate.ops",
            "hpcserve.runtime.job"} <= set(graph), "the layer folders were not read"
    found = crossings(graph)
    assert not found, "imports across the layers:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("edge, bad", [
    (("hpcserve.author.plan", "hpcserve.operate.ops"), True),
    (("hpcserve.runtime.job", "hpcserve.errors"), True),
    (("hpcserve.operate.ops", "hpcserve.cli"), True),
    (("hpcserve.operate.ops", "hpcserve.author.render"), False),
    (("hpcserve.author.plan", "hpcserve.engines"), False),
])
def test_the_rule_sees_a_crossing(edge, bad):
    a, b = edge
    assert bool(crossings({a: {b}})) is bad
