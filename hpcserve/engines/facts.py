"""What hpcserve relies on of each engine's pinned release, declared once per engine.

Each table names, with the file and function of the release's source where it is so:
- metrics: every Prometheus name hpcserve reads, its kind, and when the release moves it:
  "step" (each engine iteration that produces or takes in tokens, so it moves while one long
  answer streams), "finish" (only when a request finishes), "env:NAME" (only when the
  environment variable NAME is set true, which hpcserve never does), "set" (a gauge);
  `counts` says what a counter adds ("prompt" or "generated" tokens, "both", "seconds");
  `process` (SGLang) which process exports it: the "tokenizer" (node rank 0, every request) or
  a "scheduler" (its own DP rank's work, in its node's metrics directory);
- health: each health path and what its 200 proves: "generation" (the engine's scheduler
  produced output since the probe began: it makes progress), "process" (the server process
  answers and its engine has not errored; a hung engine core still answers);
- loads: where the engine reports every scheduler's load (every DP rank, every node), when the
  /metrics endpoint cannot see them all;
- liveness_path: the path the liveness probe asks while serving;
- env: the environment variables whose defaults these facts assume.

The adapters (engines/*.py) take the names they read from here; the simulated engines
(hpcserve/sim/) take their metric and health behaviour from here, so a stand-in never moves a
counter, or answers a health path, where the real release would not; and tests/facts/ proves
every entry against the installed release (the name exists; by `ast`, which function moves it
and under which condition). Stdlib only, no imports: it is copied into a simulated job's
directory beside the stand-in as hpcserve_facts.py.
"""

SGLANG = {
    "engine": "sglang",
    # every release hpcserve accepts (engines/sglang.py CHECKED), each proved by tests/facts/
    "releases": ("0.5.20", "0.5.21", "0.5.22", "0.5.23"),
    # /metrics on the HTTP port, with --enable-metrics (sglang/srt/utils/common.py
    # add_prometheus_middleware: prometheus_client's MultiProcessCollector over
    # PROMETHEUS_MULTIPROC_DIR, which set_prometheus_multiproc_dir makes a TemporaryDirectory of
    # the node it runs on: node rank 0's /metrics shows the processes of node rank 0 only).
    "metrics_path": "/metrics",
    "metrics": {
        "sglang:realtime_tokens_total": {
            "kind": "counter", "moves": "step", "counts": "both", "process": "scheduler",
            "where": "sglang/srt/managers/scheduler_components/metrics_reporter.py: "
                     "SchedulerMetricsReporter.report_decode_stats (every decode iteration, "
                     "before its decode_log_interval return) and report_prefill_stats (each "
                     "prefill batch), through SchedulerMetricsCollector.increment_realtime_tokens"},
        "sglang:prompt_tokens_total": {
            "kind": "counter", "moves": "finish", "counts": "prompt", "process": "tokenizer",
            "where": "sglang/srt/observability/metrics_collector.py: "
                     "TokenizerMetricsCollector.observe_one_finished_request"},
        "sglang:generation_tokens_total": {
            "kind": "counter", "moves": "finish", "counts": "generated", "process": "tokenizer",
            "where": "sglang/srt/observability/metrics_collector.py: "
                     "TokenizerMetricsCollector.observe_one_finished_request"},
        "sglang:forward_execution_seconds_total": {
            "kind": "counter", "moves": "env:SGLANG_ENABLE_METRICS_DEVICE_TIMER",
            "counts": "seconds", "process": "scheduler",
            "where": "sglang/srt/managers/scheduler_components/metrics_reporter.py: "
                     "SchedulerMetricsReporter._init_metrics, only under "
                     "ENABLE_METRICS_DEVICE_TIMER (SGLANG_ENABLE_METRICS_DEVICE_TIMER)"},
        "sglang:num_running_reqs": {
            "kind": "gauge", "moves": "set", "process": "scheduler",
            "where": "sglang/srt/observability/metrics_collector.py: "
                     "SchedulerMetricsCollector.log_stats"},
        "sglang:num_queue_reqs": {
            "kind": "gauge", "moves": "set", "process": "scheduler",
            "where": "sglang/srt/observability/metrics_collector.py: "
                     "SchedulerMetricsCollector.log_stats"},
        "sglang:token_usage": {
            "kind": "gauge", "moves": "set", "process": "scheduler",
            "where": "sglang/srt/observability/metrics_collector.py: "
                     "SchedulerMetricsCollector.log_stats"},
    },
    # Which schedulers export the scheduler metrics: sglang/srt/observability/metrics_collector.py
    # (SchedulerMetricsCollector.init_new): is_stats_logging_rank (attn_tp_rank == 0)
    # or --enable-metrics-for-all-schedulers. Under DP attention that is already one scheduler
    # per attention-DP group; the flag adds the TP copies of each group's figures.
    "exporting_schedulers": "attn_tp_rank == 0 or enable_metrics_for_all_schedulers",
    # Every DP rank's load, whatever node it runs on: sglang/srt/entrypoints/v1_loads.py
    # get_loads (TokenizerManager.get_loads reads every scheduler's snapshot) and
    # _format_loads_prometheus (one sample per dp_rank of each core number).
    "loads": {
        "path": "/v1/loads?include=core&format=prometheus",
        "label": "dp_rank",
        "running": "sglang_num_running_reqs",
        "waiting": "sglang_num_waiting_reqs",
        "kv_usage": "sglang_token_usage",
        "where": "sglang/srt/entrypoints/v1_loads.py: get_loads, _format_loads_prometheus; "
                 "sglang/srt/managers/load_snapshot.py: LoadSnapshot",
    },
    "health": {
        "/health": {
            "proves": "generation", "unless_env": "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION",
            "where": "sglang/srt/entrypoints/http_server.py: health_generate (one handler for "
                     "both paths; /health answers 200 at once when "
                     "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false)"},
        "/health_generate": {
            "proves": "generation",
            "where": "sglang/srt/entrypoints/http_server.py: health_generate (a 1-token "
                     "generate; 200 once any scheduler output arrives after the probe began, "
                     "503 after SGLANG_HEALTH_CHECK_TIMEOUT)"},
    },
    # /health_generate: what a site sets in SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION cannot
    # turn the probe into a process check.
    "liveness_path": "/health_generate",
    "env": {
        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "true",   # sglang/srt/environ.py
        "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "false",        # sglang/srt/environ.py
        "SGLANG_HEALTH_CHECK_TIMEOUT": "20",   # sglang/srt/entrypoints/http_server.py
    },
}

VLLM = {
    "engine": "vllm",
    "releases": ("0.32.0", "0.33.0"),
    # vllm/v1/metrics/loggers.py PrometheusStatLogger: always on, one series per engine (DP
    # rank, label "engine"), each recorded by the API server from that engine core's outputs.
    "metrics_path": "/metrics",
    "label": "engine",
    "metrics": {
        "vllm:iteration_tokens_total": {
            "kind": "histogram", "moves": "step", "counts": "both",
            "where": "vllm/v1/metrics/loggers.py: PrometheusStatLogger.record "
                     "(histogram_iteration_tokens.observe, each engine iteration)"},
        "vllm:prompt_tokens": {
            "kind": "counter", "moves": "step", "counts": "prompt",
            "where": "vllm/v1/metrics/loggers.py: PrometheusStatLogger.record "
                     "(counter_prompt_tokens.inc(iteration_stats.num_prompt_tokens))"},
        "vllm:generation_tokens": {
            "kind": "counter", "moves": "step", "counts": "generated",
            "where": "vllm/v1/metrics/loggers.py: PrometheusStatLogger.record "
                     "(counter_generation_tokens.inc(iteration_stats.num_generation_tokens))"},
        "vllm:num_requests_running": {
            "kind": "gauge", "moves": "set",
            "where": "vllm/v1/metrics/loggers.py: PrometheusStatLogger.record "
                     "(gauge_scheduler_running)"},
        "vllm:num_requests_waiting": {
            "kind": "gauge", "moves": "set",
            "where": "vllm/v1/metrics/loggers.py: PrometheusStatLogger.record "
                     "(gauge_scheduler_waiting)"},
        "vllm:kv_cache_usage_perc": {
            "kind": "gauge", "moves": "set",
            "where": "vllm/v1/metrics/loggers.py: PrometheusStatLogger.record "
                     "(gauge_kv_cache_usage)"},
    },
    "health": {
        "/health": {
            "proves": "process",
            "where": "vllm/entrypoints/serve/instrumentator/health.py: health (503 only on "
                     "EngineDeadError from engine_client.check_health)"},
    },
    "liveness_path": "/health",
    "env": {},
}

# TensorRT-LLM 1.3.0rc3 (the release hpcserve pins): read in tensorrt_llm/serve/openai_server.py
# as the nctu6/vllm-tensorrt fork imported that release (commit 5978a46). No NVIDIA tag of these
# files could be read where hpcserve is built (the repository is 2.5 GB; its index keeps files
# at the commits that changed them), so no test proves these against NVIDIA's own release:
# docs/engines.md says so.
TRTLLM = {
    "engine": "trtllm",
    "release": "1.3.0rc3",
    # /metrics answers JSON iteration statistics (OpenAIServer.get_iteration_stats, drained per
    # read), only with enable_iter_perf_stats: no Prometheus counter hpcserve reads
    "metrics_path": None,
    "metrics": {},
    "health": {
        "/health": {
            "proves": "process",
            "where": "tensorrt_llm/serve/openai_server.py: OpenAIServer.health -> "
                     "LLM._check_health (not self._executor.is_shutdown())"},
        "/health_generate": {
            "proves": "generation",
            "where": "tensorrt_llm/serve/openai_server.py: OpenAIServer.health_generate "
                     "(a 1-token chat completion through the executor; 500 when it fails)"},
    },
    "liveness_path": "/health_generate",
    # a context or generation server of a disaggregated pair answers a chat only through the
    # front server that pairs them: its process health is what can be asked alone
    "liveness_path_pd": "/health",
    "env": {},
}

# The legacy KTransformers server (ktransformers/server/main.py), at 0.2.1.post1, the release
# whose sdist PyPI has (scripts/setup-ktransformers-parser.sh fetches it for the tests): no
# health route and no metrics on its port; /v1/models answers a fixed list from the HTTP
# process (ktransformers/server/api/openai/endpoints/chat.py: list_models), which uvicorn
# serves only once main() has built the interface, the model loaded.
KTRANSFORMERS_LEGACY = {
    "engine": "ktransformers_legacy",
    "release": "0.2.1.post1",
    "metrics_path": None,
    "metrics": {},
    "health": {
        "/v1/models": {
            "proves": "process",
            "where": "ktransformers/server/api/openai/endpoints/chat.py: list_models (returns "
                     "the module's fixed `models` list)"},
    },
    "liveness_path": "/v1/models",
    "env": {},
}


def exported(name: str, kind: str) -> str:
    """The name prometheus_client exposes: a counter gets _total, a histogram's sample count
    _count (prometheus_client/metrics.py: Counter and Histogram _samples)."""
    if kind == "counter" and not name.endswith("_total"):
        return name + "_total"
    if kind == "histogram":
        return name + "_count"
    return name


def moving(facts: dict, env: dict) -> list[str]:
    """The exported names of the counters that move while tokens are produced, under `env`."""
    out = []
    for name, m in facts["metrics"].items():
        moves = m["moves"]
        if moves.startswith("env:"):
            on = env.get(moves[4:], "").strip().lower() in ("1", "true", "yes", "on")
            moves = "step" if on else "never"
        if moves == "step":
            out.append(exported(name, m["kind"]))
    return out
