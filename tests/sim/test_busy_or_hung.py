"""What a runtime reads to tell a hung engine from a busy one, from each simulated engine as the
real one shows it: Prometheus /metrics whose token counters move while a request generates
(SGLang only with --enable-metrics, vLLM always), TensorRT-LLM's JSON iteration stats; the slow
fault (health probes answer late while generation goes on), each engine's own kind of hang, and
faults that hit only some attempts of an instance."""

from __future__ import annotations

import re
import sys
import threading
import time

import pytest

from simlib import REPO, clean_env, free_port, get_status, http, sse_events, wait_status

from hpcserve.engines import facts

DECODE = 0.05  # seconds per output token: a 60-token stream takes 3 s
PROCS: dict = {}  # port -> the engine's process (its log), for the waits on its faults


def metric(text, name):
    """The value of the first sample of `name` in Prometheus text."""
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, f"{name} not in:\n{text}"
    return float(m.group(1))


def until(fn, timeout=15.0, what="the condition"):
    """fn()'s first truthy value, asked every 20 ms; the test fails after `timeout` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError(f"{what} not seen within {timeout} s")


def metrics_when(url, ok, timeout=15.0):
    """The engine's /metrics text once ok(text) holds."""
    def read():
        text = http("GET", url, timeout=1)[1]
        return text if ok(text) else None
    return until(read, timeout, f"metrics at {url} as expected")


def hanging(proc):
    """Until the engine's fault has started (its log says so)."""
    until(lambda: "fault injection: hanging" in proc.log(), what="the hang")


def background(fn):
    """Run fn in a thread; returns a dict that gets `result` (or `error`) and `done_at`."""
    out = {}

    def run():
        try:
            out["result"] = fn()
        except Exception as e:  # noqa: BLE001 - reported by the test that reads it
            out["error"] = e
        out["done_at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    out["thread"] = t
    return out


def stream(port, tokens, timeout=30):
    return sse_events(f"http://127.0.0.1:{port}/v1/completions",
                      {"model": "m", "prompt": "one two three", "max_tokens": tokens,
                       "stream": True}, timeout=timeout)


def ready(proc, url, line, timeout=15):
    """Until the engine is ready: its info route answers from the moment the port listens (its
    own warm-up request included), but health says ready only after that warm-up, which the
    engine's ready line marks."""
    wait_status(url, proc=proc, timeout=timeout)
    until(lambda: line in proc.log(), timeout, f"the ready line {line!r}")


def sglang(procs, *extra, name="sglang", **env):
    port = free_port()
    p = procs.engine("--model-path", "/m", "--served-model-name", "kimi-k2", "--port", port,
                     *extra, name=name, HPCSERVE_SIM_DECODE_S_PER_TOKEN=DECODE, **env)
    ready(p, f"http://127.0.0.1:{port}/model_info", "The server is fired up and ready to roll!")
    PROCS[port] = p
    return port


def vllm(procs, name="vllm", **env):
    port = free_port()
    p = procs.vllm("/m", "--served-model-name", "kimi-k2", "--host", "127.0.0.1", "--port",
                   port, name=name, HPCSERVE_SIM_DECODE_S_PER_TOKEN=DECODE, **env)
    ready(p, f"http://127.0.0.1:{port}/v1/models", "Application startup complete.")
    PROCS[port] = p
    return port


# (a counter that moves every step, running gauge, waiting gauge), as each release has them
PROM = {"sglang": ("sglang:realtime_tokens_total", "sglang:num_running_reqs",
                   "sglang:num_queue_reqs"),
        "vllm": ("vllm:generation_tokens_total", "vllm:num_requests_running",
                 "vllm:num_requests_waiting")}
FACTS = {"sglang": facts.SGLANG, "vllm": facts.VLLM}


def start(procs, engine, **env):
    return (sglang(procs, "--enable-metrics", **env) if engine == "sglang"
            else vllm(procs, **env))


def exported(engine):
    """name -> (exported name, how it moves, what it counts) of each counter of the facts."""
    return {n: (facts.exported(n, m["kind"]), m["moves"], m["counts"])
            for n, m in FACTS[engine]["metrics"].items() if m["kind"] != "gauge"}


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_counters_move_while_a_stream_generates_only_as_the_release_moves_them(procs, engine):
    step, running, waiting = PROM[engine]
    port = start(procs, engine)
    url = f"http://127.0.0.1:{port}/metrics"
    text = http("GET", url)[1]
    assert f"# TYPE {step} counter" in text and f"# TYPE {running} gauge" in text
    assert 'model_name="kimi-k2"' in text
    req = background(lambda: stream(port, 60))
    first = metrics_when(url, lambda t: metric(t, step) > 3)
    second = metrics_when(url, lambda t: metric(t, step) > metric(first, step))
    # mid-stream: the request runs; "step" counters move token by token, "finish" ones and
    # ones behind an environment variable hpcserve never sets stand at 0
    assert metric(first, running) == 1 and metric(first, waiting) == 0
    for name, (shown, moves, counts) in exported(engine).items():
        if moves == "step" and counts == "prompt":  # the prompt is in once
            assert metric(first, shown) == metric(second, shown) == 3, name
        elif moves == "step":
            assert 0 < metric(first, shown) < metric(second, shown), name
        elif moves != "step":
            assert metric(second, shown) == 0, (name, moves)
    req["thread"].join(10)
    assert req["result"][0] == 200
    done = http("GET", url)[1]
    want = {"prompt": 3, "generated": 60, "both": 63}
    for name, (shown, moves, counts) in exported(engine).items():
        if moves in ("step", "finish") and counts in want and not shown.endswith("_count"):
            assert metric(done, shown) == want[counts], (name, metric(done, shown))
        elif moves.startswith("env:"):
            assert metric(done, shown) == 0, name
    assert metric(done, running) == 0


def test_a_counter_behind_an_environment_variable_moves_once_it_is_set(procs):
    (name, m), = [(n, m) for n, m in facts.SGLANG["metrics"].items()
                  if m["moves"].startswith("env:")]
    port = sglang(procs, "--enable-metrics", **{m["moves"][4:]: "1"})
    stream(port, 20)
    assert metric(http("GET", f"http://127.0.0.1:{port}/metrics")[1], name) > 0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_stand_in_exports_no_metric_its_release_does_not_declare(procs, engine):
    port = start(procs, engine)
    stream(port, 5)
    text = http("GET", f"http://127.0.0.1:{port}/metrics")[1]
    shown = {n.split("{")[0].split(" ")[0] for n in text.splitlines() if n and n[0] != "#"}
    declared = {facts.exported(n, m["kind"]) for n, m in FACTS[engine]["metrics"].items()}
    assert shown and shown <= declared, shown - declared


def test_sglang_serves_metrics_only_with_enable_metrics(procs):
    port = sglang(procs)
    assert http("GET", f"http://127.0.0.1:{port}/metrics")[0] == 404


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_slow_fault_answers_health_late_while_generation_goes_on(procs, engine):
    gen, running, _ = PROM[engine]
    port = start(procs, engine, HPCSERVE_SIM_FAULT="slow:2")
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    probe = background(lambda: get_status(f"{base}/health", timeout=10))
    req = background(lambda: stream(port, 20))  # 1 s of tokens
    metrics_when(f"{base}/metrics", lambda t: metric(t, gen) > 0)
    m0 = time.monotonic()
    first = http("GET", f"{base}/metrics", timeout=1)[1]
    metrics_took = time.monotonic() - m0
    second = metrics_when(f"{base}/metrics", lambda t: metric(t, gen) > metric(first, gen))
    probe["thread"].join(10)
    req["thread"].join(10)
    assert probe["result"] == 200
    assert probe["done_at"] - t0 >= 2.0, "the slow fault's probe answered early"
    # the request finished while the probe was still waiting: busy, not hung
    assert req["result"][0] == 200 and req["done_at"] < probe["done_at"]
    assert metrics_took < 0.5
    assert metric(first, running) == 1 and metric(first, gen) < metric(second, gen)


def test_slow_fault_waits_for_its_start(procs):
    port = sglang(procs, HPCSERVE_SIM_FAULT="slow:2:2.5")
    t0 = time.monotonic()
    assert get_status(f"http://127.0.0.1:{port}/health", timeout=5) == 200
    assert time.monotonic() - t0 < 1.0
    until(lambda: get_status(f"http://127.0.0.1:{port}/health", timeout=1) == "TimeoutError",
          what="a late health answer once the fault started")


def test_hung_vllm_answers_health_while_its_counters_stand_still(procs):
    gen, running, waiting = PROM["vllm"]
    port = vllm(procs, HPCSERVE_SIM_FAULT="hang:1.5")
    base = f"http://127.0.0.1:{port}"
    background(lambda: stream(port, 200, timeout=60))  # 10 s of tokens; the hang comes first
    metrics_when(f"{base}/metrics", lambda t: metric(t, gen) > 0)
    hanging(PROCS[port])
    background(lambda: stream(port, 5, timeout=60))  # a new request: queued, never run
    metrics_when(f"{base}/metrics", lambda t: metric(t, waiting) == 1)
    assert get_status(f"{base}/health", timeout=1) == 200  # the API server is fine
    first = http("GET", f"{base}/metrics", timeout=1)[1]
    time.sleep(0.6)
    second = http("GET", f"{base}/metrics", timeout=1)[1]
    assert metric(first, gen) == metric(second, gen) > 0
    assert metric(second, running) == 1 and metric(second, waiting) == 1


def test_hung_sglang_times_out_health_but_shows_still_counters(procs):
    gen, running, _ = PROM["sglang"]
    port = sglang(procs, "--enable-metrics", HPCSERVE_SIM_FAULT="hang:1.5")
    base = f"http://127.0.0.1:{port}"
    background(lambda: stream(port, 200, timeout=60))
    metrics_when(f"{base}/metrics", lambda t: metric(t, gen) > 0)
    hanging(PROCS[port])
    # SGLang's /health runs a generation through the wedged scheduler
    assert get_status(f"{base}/health", timeout=1) == "TimeoutError"
    first = http("GET", f"{base}/metrics", timeout=1)[1]
    time.sleep(0.6)
    second = http("GET", f"{base}/metrics", timeout=1)[1]
    assert metric(first, gen) == metric(second, gen) > 0 and metric(second, running) == 1


@pytest.mark.parametrize("attempt, hit", [(None, True), ("0", True), ("1", False)])
def test_fault_hits_only_the_attempts_named(procs, attempt, hit):
    env = {"HPCSERVE_SIM_FAULT": "unhealthy", "HPCSERVE_SIM_FAULT_ATTEMPTS": "0"}
    if attempt is not None:
        env["HPCSERVE_ATTEMPT"] = attempt
    port = sglang(procs, **env)
    assert get_status(f"http://127.0.0.1:{port}/health") == (503 if hit else 200)


def test_fault_attempts_default_to_every_attempt(procs):
    port = sglang(procs, HPCSERVE_SIM_FAULT="unhealthy", HPCSERVE_ATTEMPT="3")
    assert get_status(f"http://127.0.0.1:{port}/health") == 503


# ---------------------------------------------------------------- TensorRT-LLM: JSON iterations

def trtllm(procs, tmp_path, api, **env):
    port = free_port()
    opts = tmp_path / "api.yaml"
    opts.write_text("".join(f"{k}: {v}\n" for k, v in api.items()) or "{}\n")
    cmd = [sys.executable, str(REPO / "hpcserve" / "sim" / "trtllm.py"), "serve", "/m",
           "--host", "127.0.0.1", "--port", str(port), "--extra_llm_api_options", str(opts)]
    p = procs.start(cmd, "trtllm", clean_env(HPCSERVE_SIM_DECODE_S_PER_TOKEN=DECODE, **env))
    ready(p, f"http://127.0.0.1:{port}/v1/models", "Application startup complete.", timeout=30)
    PROCS[port] = p
    return port


def test_trtllm_metrics_are_json_iteration_stats_drained_per_read(procs, tmp_path):
    port = trtllm(procs, tmp_path, {"enable_iter_perf_stats": "true"})
    url = f"http://127.0.0.1:{port}/metrics"
    req = background(lambda: stream(port, 40))
    first = until(lambda: http("GET", url)[1], what="iteration stats")
    second = until(lambda: http("GET", url)[1], what="further iteration stats")
    req["thread"].join(10)
    assert isinstance(first, list) and first and second
    # each read takes what came since the last one: iterations move on, none read twice
    assert first[-1]["iter"] < second[0]["iter"]
    assert first[0]["inflightBatchingStats"]["numCtxTokens"] == 3
    assert second[-1]["numActiveRequests"] == 1
    assert {"kvCacheStats", "numQueuedRequests", "numCompletedRequests"} <= set(second[0])


def test_trtllm_metrics_without_iter_perf_stats_is_an_empty_list_after_2s(procs, tmp_path):
    port = trtllm(procs, tmp_path, {})
    background(lambda: stream(port, 20))
    t0 = time.monotonic()
    assert http("GET", f"http://127.0.0.1:{port}/metrics")[1] == []
    assert time.monotonic() - t0 >= 1.9  # get_stats_async(2) waited for stats that never come


def test_hung_trtllm_answers_health_and_an_empty_metrics_but_not_health_generate(procs,
                                                                                tmp_path):
    port = trtllm(procs, tmp_path, {"enable_iter_perf_stats": "true"},
                  HPCSERVE_SIM_FAULT="hang:1.5")
    base = f"http://127.0.0.1:{port}"
    background(lambda: stream(port, 200, timeout=60))
    until(lambda: http("GET", f"{base}/metrics")[1], what="iteration stats")
    hanging(PROCS[port])
    http("GET", f"{base}/metrics")  # what came before the hang
    assert get_status(f"{base}/health", timeout=1) == 200
    assert http("GET", f"{base}/metrics", timeout=5)[1] == []
    # its liveness path runs a 1-token chat through the (hung) executor
    assert facts.TRTLLM["liveness_path"] == "/health_generate"
    assert get_status(f"{base}/health_generate", timeout=1) == "TimeoutError"


# ---------------------------------------------------------------- SGLang: health and loads

def test_sglang_health_paths_answer_only_through_a_scheduler_that_makes_progress(procs):
    off = facts.SGLANG["health"]["/health"]["unless_env"]
    port = sglang(procs, SGLANG_HEALTH_CHECK_TIMEOUT="2", HPCSERVE_SIM_FAULT="hang:1.5",
                  **{off: "false"})
    base = f"http://127.0.0.1:{port}"
    assert get_status(f"{base}/health_generate", timeout=5) == 200  # before the hang
    hanging(PROCS[port])
    # the liveness path generates, whatever the environment says of /health ...
    assert facts.SGLANG["liveness_path"] == "/health_generate"
    assert get_status(f"{base}/health_generate", timeout=1) == "TimeoutError"
    assert get_status(f"{base}/health_generate", timeout=5) == 503  # after the check's timeout
    # ... while /health, turned off by the variable, answers without asking the scheduler
    assert get_status(f"{base}/health", timeout=1) == 200


def test_sglang_loads_cover_every_dp_rank_where_metrics_see_node_0_only(procs):
    """Two nodes, attention DP 2 (one DP rank per node): a request on DP rank 1 runs on node 1,
    whose scheduler's metrics node 0's /metrics cannot show; /v1/loads shows it."""
    port, dist = free_port(), free_port()
    common = ["--model-path", "/m", "--served-model-name", "kimi-k2", "--enable-metrics",
              "--tp-size", "2", "--attn-dp-size", "2", "--nnodes", "2",
              "--dist-init-addr", f"127.0.0.1:{dist}"]
    env = {"HPCSERVE_SIM_DECODE_S_PER_TOKEN": DECODE}
    procs.engine(*common, "--node-rank", "1", "--port", free_port(), name="nr1", **env)
    p = procs.engine(*common, "--node-rank", "0", "--port", port, name="nr0", **env)
    wait_status(f"http://127.0.0.1:{port}/model_info", proc=p)
    base = f"http://127.0.0.1:{port}"
    stream(port, 2)  # DP rank 0: done; the next request goes to DP rank 1
    req = background(lambda: stream(port, 100))
    def loads_with_rank_1_busy():
        text = http("GET", f"{base}/v1/loads?include=core&format=prometheus")[1]
        return text if 'sglang_num_running_reqs{dp_rank="1"} 1' in text else None

    loads = until(loads_with_rank_1_busy, what="DP rank 1 running its request in /v1/loads")
    assert 'sglang_num_running_reqs{dp_rank="0"} 0' in loads
    text = http("GET", f"{base}/metrics")[1]
    assert 'dp_rank="1"' not in text  # node 1's scheduler is not in node 0's metrics
    assert metric(text, "sglang:num_running_reqs") == 0
    req["thread"].join(15)
    assert req["result"][0] == 200
