"""vLLM's facts (hpcserve/engines/facts.py VLLM) proved in both releases hpcserve runs: 0.32.0
(the CPU release of the real-engine tier) and 0.33.0 (the pinned GPU release): each metric's
name, kind and per-engine label, which function moves it and when, what /health proves, and the
start-up lines the runtime reads."""

from __future__ import annotations

import ast
import re

import pytest

from factkit import printed_by

from hpcserve.engines import facts, get

pytestmark = pytest.mark.engine_parser

F = facts.VLLM
KINDS = {"counter": "Counter", "gauge": "Gauge", "histogram": "Histogram"}
LOGGERS = "v1/metrics/loggers.py"
RECORD = "PrometheusStatLogger.record"


def test_the_releases_installed_are_the_ones_the_facts_name(vllm):
    assert vllm.version.split("+")[0] in F["releases"]
    assert get("vllm").facts is F


@pytest.mark.parametrize("name", sorted(F["metrics"]))
def test_each_metric_is_defined_per_engine_with_its_kind(vllm, name):
    defs = vllm.metric_definitions(name)
    assert defs, f"{name} is not defined in {vllm}"
    site, cls, _ = defs[0]
    # self._counter_cls / self._gauge_cls / self._histogram_cls: prometheus_client's classes
    assert cls == f"_{F['metrics'][name]['kind']}_cls", (name, cls, str(site))
    assert site.file == LOGGERS and site.func == "PrometheusStatLogger.__init__", str(site)
    # created per engine with the label "engine": one series per DP engine, which add up
    init = ast.unparse(vllm.function(LOGGERS, "PrometheusStatLogger.__init__"))
    assert 'labelnames = ["model_name", "engine"]' in init or \
        "labelnames = ['model_name', 'engine']" in init, init[:1500]
    assert F["label"] == "engine"


def _attrs(vllm, name):
    """The attributes the metric lives in: the per-engine dict made from its definition."""
    (_, _, first), = vllm.metric_definitions(name)
    init = vllm.function(LOGGERS, "PrometheusStatLogger.__init__")
    out = {first}
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute) and \
                first in ast.unparse(node.value):
            out.add(node.targets[0].attr)
    return out


@pytest.mark.parametrize("name", [n for n, m in F["metrics"].items() if m["moves"] == "step"])
def test_a_step_metric_moves_in_record_with_every_iteration(vllm, name):
    sites = [s for a in _attrs(vllm, name) for s in vllm.movers(a, {"inc", "observe"})]
    assert sites and {s.func for s in sites} == {RECORD}, [str(s) for s in sites]
    for s in sites:
        # only behind `if iteration_stats is None: return`, never behind a finished request
        assert not any("finish" in c for c in vllm.conditions(s)), (str(s), vllm.conditions(s))
    fn = ast.unparse(vllm.function(LOGGERS, RECORD))
    assert re.search(r"if iteration_stats is None:\s+return\n", fn), fn[:1500]
    # and record is called from the output handler loop, each engine core output batch
    callers = vllm.calls("record", ["v1/engine/async_llm.py"])
    assert callers, "AsyncLLM never calls a stat logger's record"


@pytest.mark.parametrize("name", [n for n, m in F["metrics"].items() if m["kind"] == "gauge"])
def test_a_gauge_is_set_from_the_scheduler_stats(vllm, name):
    sites = [s for a in _attrs(vllm, name) for s in vllm.movers(a, {"set"})]
    assert any(s.func == RECORD and "scheduler_stats is not None" in vllm.conditions(s)
               for s in sites), [(str(s), vllm.conditions(s)) for s in sites]


def test_health_answers_503_only_on_a_dead_engine(vllm):
    (path, fact), = F["health"].items()
    rel = "entrypoints/serve/instrumentator/health.py"
    fn = vllm.function(rel, "health")
    src = ast.unparse(fn)
    assert f"'{path}'" in ast.unparse(vllm.tree(rel)), f"{path} is not routed in {rel}"
    assert "await client.check_health()" in src and "except EngineDeadError:" in src, src
    assert "generate" not in src  # nothing goes through the engine core
    assert fact["proves"] == "process" and F["liveness_path"] == path


def test_the_start_up_lines_the_runtime_reads_are_printed_by_the_release(vllm):
    lines = get("vllm").startup_patterns.get(vllm.version.split("+")[0]) or {}
    assert lines, f"no start-up lines for {vllm.version}"
    for phase, pattern in lines.items():
        assert pattern and not printed_by(vllm, pattern), (phase, printed_by(vllm, pattern))


def test_the_adapter_reads_exactly_what_the_facts_declare():
    m = get("vllm").metrics
    assert m.path == F["metrics_path"] and m.gauges_path is None
    assert list(m.progress) == facts.moving(F, {})
    gauges = {facts.exported(n, g["kind"]) for n, g in F["metrics"].items()
              if g["kind"] == "gauge"}
    assert set(m.pending + m.queued + m.kv_usage) == gauges
    assert get("vllm").liveness() == (F["liveness_path"], False)
