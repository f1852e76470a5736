"""No circle among the runtime's concerns: who calls whom through the job object.

The import-cycle test (test_import_cycles.py) cannot see this coupling: the job object
(hpcserve/runtime/job.py's `Job`) holds every concern (`self.recovery = Recovery(self)`, ...),
and a concern that is handed the job can call any other through it (`self.job.drains.tick()`)
without importing it. Such calls are read here with `ast`, never run:

- the hub is the class whose `__init__` builds the concerns: each `self.NAME = Class(...)` is a
  concern NAME;
- a concern uses another when its class reaches `<job>.OTHER` (where `<job>` is `self.job`, a
  local or parameter bound to it, or a parameter named `job`), or when the hub builds it with
  the other concern as an argument (`Recovery(self.table, ...)`);
- a use of the hub's own method (`job.restart_router()`) is a use of every concern that method
  reaches.

The runtime's concerns report to the serving loop, which hands events between them; a concern
may use the ones below it (the state, the log, the instance table, Slurm) but two concerns must
never reach each other in a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_cycles import _tree, cycles

ROOT = Path(__file__).resolve().parents[2]
HUB = ("hpcserve/runtime/job.py", "Job")


def _classes(root: Path, package_dir: str) -> dict[str, ast.ClassDef]:
    """Every class of the package by name (the runtime's class names are unique)."""
    out = {}
    for path in sorted((root / package_dir).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                out[node.name] = node
    return out


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name),
                None)


def _attr_of_self(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
            node.value.id == "self":
        return node.attr
    return None


def hub_concerns(hub: ast.ClassDef) -> tuple[dict[str, str], dict[str, set[str]]]:
    """(concern name -> its class, concern name -> the concerns passed to its constructor)."""
    init = _method(hub, "__init__")
    kinds, given = {}, {}
    for node in ast.walk(init) if init else ():
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        name, call = _attr_of_self(node.targets[0]), node.value
        if name and isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            kinds[name] = call.func.id
            args = list(call.args) + [k.value for k in call.keywords]
            given[name] = {a for a in map(_attr_of_self, args) if a}
    return kinds, given


def _job_names(fn: ast.FunctionDef) -> set[str]:
    """The names bound to the job inside `fn`: a parameter named job, `job = self.job`."""
    names = {a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg == "job"}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and _attr_of_self(node.value) == "job":
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        # `job, at = self.job, now()`
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple) and \
                len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple):
            for t, v in zip(node.targets[0].elts, node.value.elts):
                if isinstance(t, ast.Name) and _attr_of_self(v) == "job":
                    names.add(t.id)
    return names


def reached(node: ast.AST, in_hub: bool = False) -> set[str]:
    """The attributes of the job that the code under `node` reaches (in the hub: of self)."""
    out = set()
    for fn in [n for n in ast.walk(node) if isinstance(n, ast.FunctionDef)]:
        names = _job_names(fn)
        for n in ast.walk(fn):
            if not isinstance(n, ast.Attribute):
                continue
            v = n.value
            if (isinstance(v, ast.Name) and v.id in names) or \
                    (_attr_of_self(v) == "job" and not in_hub) or \
                    (in_hub and isinstance(v, ast.Name) and v.id == "self"):
                out.add(n.attr)
    return out


def concern_graph(root: Path, package_dir: str, hub_file: str, hub_name: str
                  ) -> dict[str, set[str]]:
    classes = _classes(root, package_dir)
    hub = classes[hub_name]
    kinds, given = hub_concerns(hub)
    methods = {n.name: n for n in hub.body if isinstance(n, ast.FunctionDef)}

    def through(attrs: set[str], seen: set[str]) -> set[str]:
        """Concerns among `attrs`, with those the hub's methods among them reach."""
        out = {a for a in attrs if a in kinds}
        for m in sorted(attrs & set(methods) - seen):
            seen.add(m)
            out |= through(reached(methods[m], in_hub=True), seen)
        return out

    graph = {}
    for name, cls in kinds.items():
        uses = through(reached(classes[cls]), set()) if cls in classes else set()
        graph[name] = (uses | given[name]) - {name}
    return graph


def test_the_runtime_concerns_call_each_other_in_no_circle():
    graph = concern_graph(ROOT, "hpcserve/runtime", *HUB)
    assert {"recovery", "liveness", "drains", "autoscaler"} <= set(graph), \
        f"the job's concerns were not read: {sorted(graph)}"
    found = cycles(graph)
    assert not found, "concerns that reach each other through the job:\n  " + \
        "\n  ".join(found)


HUB_SRC = """
class Hub:
    def __init__(self):
        self.log = Log()
        self.a = A(self)
        self.b = B(self)
        self.c = C(self.log, self.a)

    def helper(self):
        return self.b.go()
"""


def test_the_detector_sees_calls_through_the_job_and_its_methods(tmp_path):
    root = _tree(tmp_path, {
        "rt/hub.py": HUB_SRC,
        "rt/log.py": "class Log:\n    def __call__(self, m): ...\n",
        # through self.job, and a local bound to it
        "rt/a.py": ("class A:\n    def __init__(self, job):\n        self.job = job\n"
                    "    def tick(self):\n        job = self.job\n        job.log('x')\n"
                    "        self.job.helper()\n"),
        # through a parameter named job, and a tuple assignment
        "rt/b.py": ("class B:\n    def __init__(self, job):\n        self.job = job\n"
                    "    def go(self):\n        job, n = self.job, 1\n        job.c.run()\n"),
        "rt/c.py": "class C:\n    def __init__(self, log, a):\n        self.a = a\n",
    })
    graph = concern_graph(root, "rt", "rt/hub.py", "Hub")
    # a reaches b through the hub's method; c was given a; b reaches c
    assert graph == {"log": set(), "a": {"log", "b"}, "b": {"c"}, "c": {"log", "a"}}
    assert cycles(graph) == ["a -> b -> c -> a"]


def test_the_detector_passes_concerns_that_report_down(tmp_path):
    root = _tree(tmp_path, {
        "rt/hub.py": HUB_SRC.replace("self.b.go()", "1").replace("self.a)", ")"),
        "rt/log.py": "class Log: ...\n",
        "rt/a.py": ("class A:\n    def __init__(self, job):\n        self.job = job\n"
                    "    def tick(self):\n        self.job.log('x')\n"),
        "rt/b.py": "class B:\n    def go(self, job):\n        job.a.tick()\n",
        "rt/c.py": "class C:\n    def __init__(self, log):\n        self.log = log\n",
    })
    graph = concern_graph(root, "rt", "rt/hub.py", "Hub")
    assert graph == {"log": set(), "a": {"log"}, "b": {"a"}, "c": {"log"}}
    assert cycles(graph) == []
