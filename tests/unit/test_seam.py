"""The engine seam holds: no module outside hpcserve/engines/ (and the stand-ins in sim/) names an
engine in its code, and every registered engine provides the whole adapter interface."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from hpcserve import engines
from hpcserve.engines.base import EngineAdapter, RouterAdapter

PKG = Path(__file__).resolve().parents[2] / "hpcserve"
NAMES = re.compile(r"\b(" + "|".join(map(re.escape, engines.names())) + r")(\b|_)", re.I)


def _code_mentions(path: Path) -> list[str]:
    """Identifiers, imports and string constants naming an engine; docstrings and the help
    texts of config fields (doc(...)) are prose and may give examples."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body and \
                isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
            prose.add(id(node.body[0].value))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "doc":
            prose.update(id(a) for a in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            text = " ".join([getattr(node, "module", None) or ""] + [a.name for a in node.names])
        else:
            continue
        if NAMES.search(text):
            found.append(f"{path.relative_to(PKG.parent)}:{getattr(node, 'lineno', '?')}: {text!r}")
    return found


# The demo runs two bundled example files by name and says what they run; it holds no engine
# logic.
SHOWCASE = {"demo.py"}


def test_no_module_outside_the_engines_names_an_engine():
    outside = [p for p in PKG.rglob("*.py")
               if p.relative_to(PKG).parts[0] not in ("engines", "sim")
               and p.name not in SHOWCASE]
    assert len(outside) > 10
    mentions = [m for p in outside for m in _code_mentions(p)]
    assert not mentions, "\n".join(mentions)


@pytest.mark.parametrize("name", engines.names())
def test_every_engine_provides_the_whole_adapter(name):
    a = engines.get(name)
    for method in ("layout", "ports", "launch", "command", "describe"):
        assert getattr(type(a), method) is not getattr(EngineAdapter, method), method
    for method in ("command", "argv", "readiness"):
        assert getattr(type(a.router), method) is not getattr(RouterAdapter, method), method
    assert a.name == name and a.title and a.sim_source().is_file()
    assert a.matrix.known_versions(), "a flag matrix with at least one release"


def test_a_router_config_file_is_written_in_the_task_with_the_discovered_addresses(
        tmp_path, stubs, monkeypatch):
    # How a front server that reads its workers from a file (trtllm-serve disaggregated -c) fits
    # the seam: the adapter gives lines, the router's launch script writes them after discovery.
    from hpcserve.engines import sglang
    from hpcserve.author.render import render_files, write_job
    from unitkit import ROOT, load_plan, read_stub_log, run_bash, stub_env

    class FileRouter(sglang.SGLangRouter):
        def config_files(self, *, pd, prefill, decode, workers, port):
            return {"front.yaml": ["context_servers:",
                                   *[("  - ", url[1], f":{url[2].split(':')[-1]}")
                                     for url, _ in prefill],
                                   f"port: {port}", "note: $(touch PWNED) `touch PWNED` 'q' \"d\""]}

    monkeypatch.setattr(sglang.ADAPTER, "router", FileRouter())
    plan = load_plan(ROOT / "examples" / "demo.yaml")
    assert plan.router.files[0][0] == "front.yaml"
    jd = tmp_path / "job"
    write_job(render_files(plan, str(jd)), jd)
    (jd / "run" / "endpoints.env").write_text("PREFILL_0_IP=10.3.0.7\nDECODE_0_IP=10.3.0.8\n"
                                             "ROUTER_IP=10.3.0.7\n")
    bindir, log = stubs
    r = run_bash(jd / "launch" / "router.sh", stub_env(bindir, log, tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (jd / "run" / "front.yaml").read_text() == (
        "context_servers:\n  - 10.3.0.7:30000\nport: 8000\n"
        "note: $(touch PWNED) `touch PWNED` 'q' \"d\"\n")
    assert not list(tmp_path.rglob("PWNED"))
    assert [c["prog"] for c in read_stub_log(log)] == ["python3"]  # then the router started
