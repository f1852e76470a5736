"""Liveness with the real engine, on the defaults: vLLM 0.32.0 on CPU streaming one long answer
for minutes is busy, never hung; the same engine with its engine core stopped (SIGSTOP, as a
wedged GPU collective leaves it) is named hung within 30 s and replaced.

vLLM's /health only asks whether its engine core has died (vllm/entrypoints/serve/instrumentator/
health.py), so a stopped engine core still answers it: what tells hung from busy is the
engine's own per-step counters (hpcserve/engines/facts.py VLLM), standing still while it holds
a request. Each step is made 0.02 s slower by the tests' vLLM plugin (tests/real/vllm_plugins/
hpcserve_test_slow_steps.py), so that 2,000 tokens of the tiny model take well over the 20 s
after which a still engine is called hung."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import plugins_for, real_deployment, write_deployment
from test_vllm_cpu import _job_id, _status, api_key, read_state, wait_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from jobkit import cmdline, node_processes, owners_jobs, wait_no_job_processes  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.real_engine]

TOKENS = 2000


def _stream(url: str, tokens: int, timeout: float, key: str) -> tuple[int, float]:
    """One streamed chat of `tokens` tokens (EOS ignored: random weights may end early):
    (tokens received, seconds it streamed)."""
    body = {"model": "tiny", "max_tokens": tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Think aloud about the cluster"}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  "Authorization": f"Bearer {key}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    t0, usage = time.time(), None
    with opener.open(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    return (usage or {}).get("completion_tokens", 0), time.time() - t0


def _engine_core(cluster, node: str) -> int:
    (pid,) = [p for p in node_processes(cluster)[node]
              if cmdline(p).startswith("VLLM::EngineCore")]
    return pid


def test_a_long_answer_is_busy_and_a_stopped_engine_core_is_hung_within_30_s(
        hs, dev_cluster, tiny_models, tmp_path):
    jobs = str(owners_jobs(dev_cluster))
    cache = str(Path(dev_cluster.state_dir).parent / "inductor-cache")
    dep = real_deployment("real-live", tiny_models["llama"], "tiny-llama", jobs,
                          {"recovery": {"backoff_s": 1}, "context_length": TOKENS + 512},
                          cache)
    # the tiny llama declares 512 positions; its dummy weights serve any length
    dep["env"].update({"PYTHONPATH": plugins_for(tmp_path),
                       "VLLM_PLUGINS": "hpcserve_test_slow_steps",
                       "HPCSERVE_TEST_STEP_S": 0.02, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": 1})
    assert "liveness" not in dep  # hpcserve's defaults
    out = hs("submit", str(write_deployment(tmp_path, dep)), "--wait").stdout
    job = _job_id(out)
    st = _status(hs, job)
    job_dir, url = Path(st["job_dir"]), st["endpoint"]
    assert st["phase"] == "serving", (out, st)
    job_log = job_dir / "logs" / "hpcserve-job.log"
    plan = json.loads((job_dir / "plan.json").read_text())
    assert plan["instances"][0]["liveness"]["hung_after"] == 20

    def why() -> str:
        return (f"state: {json.dumps(read_state(job_dir), indent=1)[-3000:]}\n"
                f"job log: {job_log.read_text()[-3000:]}")

    # 1. one long answer: well past every threshold, never called hung
    got, took = _stream(url, TOKENS, timeout=600, key=api_key(job_dir))
    assert got == TOKENS, why()
    assert took > 40, f"the answer streamed for {took:.1f} s only: the plugin is not in force"
    w0 = read_state(job_dir)["instances"]["worker-0"]
    assert (w0["status"], w0["attempt"], w0["restarts"]) == ("serving", 0, 0), why()
    assert "worker-0: hung" not in job_log.read_text(), why()

    # 2. its engine core stopped while it holds a request: hung within 30 s, then replaced
    node = (job_dir / "run" / "worker-0.nodes").read_text().split()[1]
    core = _engine_core(dev_cluster, node)
    held = threading.Thread(target=lambda: _swallow(_stream, url, 400, 120, api_key(job_dir)),
                            daemon=True)
    held.start()
    time.sleep(2)  # the request is in the engine core: it holds it from now on
    t_stop = time.time()
    os.kill(core, signal.SIGSTOP)
    # (Slurm's KILL of the step ends a stopped process as any other)
    st = wait_state(job_dir, lambda s: s["instances"]["worker-0"]["attempts"][0].get(
        "ended_at"), 60)
    first = st["instances"]["worker-0"]["attempts"][0]
    assert first["end"] == "hung", why()
    assert first["failure"]["node"] == node and "request(s)" in first["failure"]["detail"], first
    assert first["ended_at"] - t_stop < 30, f"named hung {first['ended_at'] - t_stop:.1f} s after"
    st = wait_state(job_dir, lambda s: s["instances"]["worker-0"]["status"] == "serving"
                    and s["instances"]["worker-0"]["attempt"] == 1, 900)
    assert st["phase"] == "serving", why()
    hs("cancel", job)
    assert wait_state(job_dir, {"cancelled", "failed", "done"}, 180)["phase"] == "cancelled"
    wait_no_job_processes(dev_cluster, 60)


def _swallow(fn, *args):
    """fn(*args), its failure ignored (a request the stopped engine never answers)."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - the outcome is read from the job's state
        return None
