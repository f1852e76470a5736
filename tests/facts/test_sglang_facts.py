"""SGLang's facts (hpcserve/engines/facts.py SGLANG) proved in the installed 0.5.23 wheel: each
metric's name and kind, which function moves each counter and under which condition, what each
health path proves, where every DP rank's load is reported, the environment's defaults, and the
start-up lines the runtime reads."""

from __future__ import annotations

import ast
import re

import pytest

from factkit import env_default, printed_by

from hpcserve.engines import facts, get
from hpcserve.engines.sglang import CHECKED

pytestmark = pytest.mark.engine_parser

F = facts.SGLANG
KINDS = {"counter": "Counter", "gauge": "Gauge", "histogram": "Histogram"}
ENVIRON = "srt/environ.py"
HTTP = "srt/entrypoints/http_server.py"
REPORTER = "srt/managers/scheduler_components/metrics_reporter.py"


def test_the_facts_cover_every_release_hpcserve_accepts(sglang):
    assert sglang.version in F["releases"]
    assert tuple(F["releases"]) == CHECKED and get("sglang").facts is F


@pytest.mark.parametrize("name", sorted(F["metrics"]))
def test_each_metric_is_defined_with_its_kind(sglang, name):
    defs = sglang.metric_definitions(name)
    assert defs, f"{name} is not defined anywhere in {sglang}"
    kinds = {cls for _, cls, _ in defs}
    assert kinds == {KINDS[F["metrics"][name]["kind"]]}, (name, defs)


def _movers(sglang, name):
    """Every function that moves the metric `name` (through the attribute it is assigned to)."""
    sites = []
    for _, _, attr in sglang.metric_definitions(name):
        sites += sglang.movers(attr, {"inc", "observe"})
    return sites


@pytest.mark.parametrize("name", [n for n, m in F["metrics"].items() if m["moves"] == "finish"])
def test_a_finish_counter_moves_only_when_a_request_finishes(sglang, name):
    sites = _movers(sglang, name)
    assert {s.func for s in sites} == {
        "TokenizerMetricsCollector.observe_one_finished_request"}, [str(s) for s in sites]
    # and that function is called where the tokenizer manager sees a request finish
    callers = sglang.calls("observe_one_finished_request")
    assert callers, "observe_one_finished_request is never called"
    for c in callers:
        assert any(t.endswith(".finished") for t in sglang.conditions(c)), str(c)


@pytest.mark.parametrize("name", [n for n, m in F["metrics"].items() if m["moves"] == "step"])
def test_a_step_counter_moves_every_decode_iteration_and_every_prefill_batch(sglang, name):
    sites = _movers(sglang, name)
    assert sites, f"nothing moves {name}"
    callers = {c.func: c for s in sites for c in sglang.calls(s.func.rsplit(".", 1)[-1])}
    assert {"SchedulerMetricsReporter.report_decode_stats",
            "SchedulerMetricsReporter.report_prefill_stats"} <= set(callers), (
        f"{name} is moved in {[str(s) for s in sites]}, called from {list(callers)}: not "
        "by the scheduler's per-iteration reports")
    # report_decode_stats increments before it returns on forward_ct_decode %
    # decode_log_interval: every decode iteration, not every log interval
    decode = callers["SchedulerMetricsReporter.report_decode_stats"]
    fn = sglang.function(REPORTER, decode.func)
    interval_return = [n for n in ast.walk(fn) if isinstance(n, ast.If)
                       and "decode_log_interval" in ast.unparse(n.test)
                       and any(isinstance(b, ast.Return) for b in n.body)]
    assert interval_return, "report_decode_stats has no decode_log_interval return"
    assert decode.node.lineno < interval_return[0].lineno, str(decode)
    # ... under the scheduler's own metrics switch only
    assert sglang.conditions(decode) == ["self.current_scheduler_metrics_enabled"], str(decode)
    # and the batch result processor reports every decode batch and every prefill batch
    for f in ("report_decode_stats", "report_prefill_stats"):
        assert any("batch_result_processor" in c.file for c in sglang.calls(f)), f


def test_forward_seconds_move_only_under_the_device_timer_environment_variable(sglang):
    (name,) = [n for n, m in F["metrics"].items() if m["moves"].startswith("env:")]
    var = F["metrics"][name]["moves"][4:]
    sites = sglang.calls("increment_forward_execution_seconds")
    assert sites, "increment_forward_execution_seconds is never called"
    for s in sites:
        assert "ENABLE_METRICS_DEVICE_TIMER" in " ".join(
            sglang.conditions(s)) + s.func or s.func.endswith("_wrap_execution_reporter"), str(s)
        outer = sglang.function(s.file, s.func.rsplit("._wrap_execution_reporter", 1)[0])
        guard = [n for n in ast.walk(outer) if isinstance(n, ast.If)
                 and ast.unparse(n.test) == "ENABLE_METRICS_DEVICE_TIMER"
                 and n.lineno < s.node.lineno <= n.end_lineno]
        assert guard, f"{s} is not under `if ENABLE_METRICS_DEVICE_TIMER`"
    assert f"ENABLE_METRICS_DEVICE_TIMER = envs.{var}.get()" in sglang.text(REPORTER)
    assert ast.unparse(env_default(sglang, ENVIRON, var)) == "EnvBool(False)"
    assert F["env"][var] == "false"


def test_which_schedulers_export_their_metrics(sglang):
    fn = sglang.function("srt/observability/metrics_collector.py",
                         "SchedulerMetricsCollector.init_new")
    src = ast.unparse(fn)
    # (the parallel state is `ps` in 0.5.20, `parallel` from 0.5.21 on)
    assert re.search(r"is_stats_logging_rank = \w+\.attn_tp_rank == 0", src), src[:2000]
    assert re.search(r"current_scheduler_metrics_enabled = enable_metrics and \(\s*"
                     r"is_stats_logging_rank or get_observability\(\)\."
                     r"enable_metrics_for_all_schedulers\)", src), src[:3000]
    assert F["exporting_schedulers"] == \
        "attn_tp_rank == 0 or enable_metrics_for_all_schedulers"


def test_metrics_of_node_rank_0_cover_only_its_own_node(sglang):
    # each node keeps its processes' metric files in a temporary directory of its own; the
    # HTTP server's /metrics reads that directory: hence the loads endpoint for gauges
    fn = sglang.function("srt/utils/common.py", "set_prometheus_multiproc_dir")
    assert "tempfile.TemporaryDirectory" in ast.unparse(fn)
    add = ast.unparse(sglang.function("srt/utils/common.py", "add_prometheus_middleware"))
    assert "multiprocess.MultiProcessCollector(registry)" in add


def test_the_loads_endpoint_reports_every_dp_rank_as_prometheus_text(sglang):
    loads = F["loads"]
    v1 = "srt/entrypoints/v1_loads.py"
    path = loads["path"].split("?")[0]
    route = [d for d in sglang.function(v1, "get_loads").decorator_list
             if ast.unparse(d) == f"router.get('{path}')"]
    assert route, f"get_loads is not routed at {path}"
    src = ast.unparse(sglang.function(v1, "get_loads"))
    assert "tokenizer_manager.get_loads(" in src and "format == 'prometheus'" in src
    for q in loads["path"].split("?")[1].split("&"):
        assert q.split("=")[0] in src, q
    read = ast.unparse(sglang.function("srt/managers/tokenizer_control_mixin.py",
                                       "TokenizerControlMixin.get_loads"))
    assert "reader.read_all()" in read, read
    fmt = ast.unparse(sglang.function(v1, "_format_loads_prometheus"))
    assert "f'sglang_{key}'" in fmt and '{{dp_rank="{dp_rank}"}}' in fmt, fmt
    assert loads["label"] == "dp_rank"
    snap = sglang.text("srt/managers/load_snapshot.py")
    for key in ("running", "waiting", "kv_usage"):
        field = loads[key].removeprefix("sglang_")
        assert re.search(rf"^    {field}: (int|float) = ", snap, re.M), field


def test_both_health_paths_generate_unless_the_environment_turns_health_off(sglang):
    fn = sglang.function(HTTP, "health_generate")
    routes = {ast.unparse(d) for d in fn.decorator_list}
    assert {"app.get('/health')", "app.get('/health_generate')"} <= routes, routes
    src = ast.unparse(fn)
    # the shortcut: only /health, only with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION false
    var = F["health"]["/health"]["unless_env"]
    assert re.search(rf"if not envs\.{var}\.get\(\) and request\.url\.path == '/health':\s*"
                     r"return Response\(status_code=200\)", src), src[:1500]
    assert "GenerateReqInput(" in src and "last_receive_tstamp > tic" in src
    assert ast.unparse(env_default(sglang, ENVIRON, var)) == "EnvBool(True)"
    assert F["env"][var] == "true"
    assert {p: h["proves"] for p, h in F["health"].items()} == {
        "/health": "generation", "/health_generate": "generation"}
    # the liveness probe asks the path no environment variable turns into a process check
    assert "unless_env" not in F["health"][F["liveness_path"]]
    assert re.search(r"^HEALTH_CHECK_TIMEOUT = int\(os\.getenv\('SGLANG_HEALTH_CHECK_TIMEOUT', "
                     r"(\d+)\)\)", ast.unparse(sglang.tree(HTTP)), re.M).group(1) == \
        F["env"]["SGLANG_HEALTH_CHECK_TIMEOUT"]


def test_the_start_up_lines_the_runtime_reads_are_printed_by_the_release(sglang):
    lines = get("sglang").startup_patterns[sglang.version]
    for phase, pattern in lines.items():
        assert pattern and not printed_by(sglang, pattern), (phase, printed_by(sglang, pattern))


def test_the_adapter_reads_exactly_what_the_facts_declare(sglang):
    m = get("sglang").metrics
    assert m.path == F["metrics_path"]
    assert list(m.progress) == facts.moving(F, {})
    assert m.gauges_path == F["loads"]["path"]
    assert (m.pending, m.queued, m.kv_usage) == ((F["loads"]["running"],),
                                                 (F["loads"]["waiting"],),
                                                 (F["loads"]["kv_usage"],))
    assert get("sglang").liveness_path == F["liveness_path"]
