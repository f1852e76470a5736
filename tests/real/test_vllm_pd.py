"""Prefill/decode disaggregation with the real engine: vLLM 0.32.0 (CPU) as a prefill instance on
one node and a decode instance on another, the real vllm-router in PD mode in front, the KV moved
by vLLM's NixlConnector (CPU buffers, UCX over TCP). One deployment for every check, as each real
deployment costs CI minutes: real tokens through the router (chat and streamed chat), the same
request in both instances' logs, the decode's KV taken from the prefill and not computed (its
own /metrics and the connector's log), vLLM's own benchmark client passing its gate against the
PD route, then the prefill's engine killed: the job fails naming that instance."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import real_deployment, write_deployment
from test_vllm_cpu import (_job_id, _serves_real_tokens, _status, api_key, find_pid, leftovers,
                           wait_no_job_processes, wait_state)
from jobkit import OWNER, owners_jobs, until  # noqa: E402  (tests/jobs: test_vllm_cpu's path)

pytestmark = [pytest.mark.slurm, pytest.mark.real_engine]

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
SOURCE = re.compile(r'^vllm:prompt_tokens_by_source_total\{[^}]*source="(\w+)"[^}]*\} (\S+)$')


def _rows(job_dir: Path, inst: str) -> list[list[str]]:
    return [ln.split() for ln in (job_dir / "run" / f"{inst}.nodes").read_text().splitlines()]


def _by_source(url: str) -> dict[str, float]:
    with OPENER.open(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for ln in text.splitlines()
            if (m := SOURCE.match(ln))}


def _log(job_dir: Path, inst: str) -> str:
    return "".join(p.read_text(errors="replace")
                   for p in sorted((job_dir / "logs").glob(f"{inst}.*.log")))


def test_real_vllm_prefill_decode_moves_the_kv_benchmarks_and_names_a_killed_prefill(
        hs, dev_cluster, tiny_models, tmp_path):
    jobs = str(owners_jobs(dev_cluster))
    cache = str(Path(dev_cluster.state_dir).parent / "inductor-cache")
    before = leftovers(dev_cluster)
    dep = real_deployment("real-pd", tiny_models["llama"], "tiny-llama", jobs, {}, cache)
    role = dep["roles"].pop("worker")
    # restart: false on the prefill: its failure is what the end of this test looks at (with
    # recovery it would be started again: tests/real/test_vllm_recovery.py)
    dep["roles"] = {"prefill": {**role, "recovery": {"restart": False}}, "decode": role}
    dep["router"] = {"port": 8000}
    # the connector's per-request lines (request ids) are DEBUG lines
    dep["env"]["VLLM_LOGGING_LEVEL"] = "DEBUG"
    dep["benchmark"] = {"input_tokens": 48, "output_tokens": 12, "concurrency": [2],
                        "prompts_per_point": 4, "warmup": 0, "then": "serve"}
    out = hs("submit", str(write_deployment(tmp_path, dep)), "--wait").stdout
    job = _job_id(out)
    st = _status(hs, job)
    job_dir, url = Path(st["job_dir"]), st["endpoint"]
    assert st["phase"] == "serving", (out, st)
    (p0,), (d0,) = _rows(job_dir, "prefill-0"), _rows(job_dir, "decode-0")
    assert p0[1] != d0[1], (p0, d0)
    plan = json.loads((job_dir / "plan.json").read_text())
    ports = {i["name"]: i["port"] for i in plan["instances"]}
    decode_url = f"http://{d0[2]}:{ports['decode-0']}"

    def why() -> str:
        log = job_dir / "logs" / "hpcserve-job.log"
        return (f"state: {json.dumps(wait_state(job_dir, lambda s: True, 5), indent=1)[-3000:]}"
                f"\njob log: {log.read_text()[-3000:]}")

    # 1. the benchmark step (vLLM's own client) against the PD route passes its gate
    st = wait_state(job_dir, lambda s: s.get("phase") in ("failed", "cancelled", "done") or
                    "passed" in (s.get("benchmark") or {}), 300)
    b = st["benchmark"]
    assert st["phase"] == "serving" and b["passed"], why()
    assert [(p["label"], p["verdict"], p["completed"], p["output_tokens"]) for p in b["points"]] \
        == [("c2", "ok", 4, 48)], b
    rep = hs("report", job, "--out", str(tmp_path / "r")).stdout
    assert "passed" in rep.splitlines()[0], rep

    # 2. a chat and a streamed chat with real tokens through the router; the decode took the
    # prompt's KV from the prefill (external_kv_transfer) and computed none of it
    src0 = _by_source(decode_url)
    ask = {"model": "tiny", "max_tokens": 8,
           "messages": [{"role": "user", "content": "Where does the KV cache come from? " * 8}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(ask).encode(),
                                 {"Content-Type": "application/json"})
    with OPENER.open(req, timeout=120) as r:
        resp = json.loads(r.read())
    assert resp["usage"]["completion_tokens"] > 0, resp
    prompt = resp["usage"]["prompt_tokens"]
    src1 = _by_source(decode_url)
    assert src1.get("external_kv_transfer", 0) - src0.get("external_kv_transfer", 0) >= \
        prompt - 16, (prompt, src0, src1)  # all but the last, partial block may be recomputed
    assert src1.get("local_compute", 0) - src0.get("local_compute", 0) < 16, (src0, src1)
    # vllm-router's PD mode hands the halves no key (keys_workers): only the router has it,
    # which asks none of a client; the deployment's key goes with the requests all the same
    _serves_real_tokens(url, api_key(job_dir))  # chat with tools, streamed chat

    # 3. the same request in both instances' logs: the router's PD request id names both
    m = re.search(r"___decode_addr_\S+?_([0-9a-f]{32})", resp["id"])
    assert m, resp["id"]
    rid = m.group(1)
    plog = until("the request in the prefill's log", lambda: (t := _log(job_dir, "prefill-0"))
                  and rid in t and t, 30)
    assert re.search(rf"request_finished\(\S*{rid}\S*\) waiting for", plog), plog[-3000:]
    dlog = until("the connector's transfer metrics in the decode's log",
                  lambda: (t := _log(job_dir, "decode-0")) and
                  "KV Transfer metrics: Num successful transfers=" in t and rid in t and t, 60)
    assert re.search(rf"start_load_kv for request \S*{rid}", dlog), dlog[-3000:]

    # 4. the prefill's engine killed while serving (SIGKILL to its engine core, VLLM::EngineCore,
    # as an OOM kill would end it): its API server reports the dead engine and exits, and with
    # restart false the job fails, naming role, instance, node and vLLM's own last error line.
    # (A SIGKILLed API server has no last words: its failure would name no error line.)
    victim = find_pid(dev_cluster, p0[1], r"^VLLM::EngineCore")
    os.kill(victim, signal.SIGKILL)
    st = wait_state(job_dir, {"failed", "cancelled", "done"}, 120)
    f = st["failure"]
    assert st["phase"] == "failed", why()
    assert (f["role"], f["instance"], f["node"]) == ("prefill", 0, p0[1]), f
    assert "EngineDeadError" in (f["error"] or ""), f
    assert any(f["error"] in ln for ln in f["log_tail"]), f
    print("prefill failure:", json.dumps(f)[:2000])
    wait_no_job_processes(dev_cluster, 60)
    assert leftovers(dev_cluster) - before == set()


def test_a_side_channel_port_held_on_the_nodes_fails_naming_role_instance_and_node(
        hs, dev_cluster, tiny_models, tmp_path):
    """vLLM's NIXL side channel cannot bind a port another process holds, and then never
    serves (it waits for its listener without a timeout): the job must name the instance, its
    node and the port at once, not wait for readiness.engine_timeout. The preflight's port check
    would stop it even earlier, so it is waived here to reach the engines."""
    from test_preflight import listener_on
    jobs = str(owners_jobs(dev_cluster))
    cache = str(Path(dev_cluster.state_dir).parent / "inductor-cache")
    dep = real_deployment("real-pd-port", tiny_models["llama"], "tiny-llama", jobs, {}, cache)
    role = dep["roles"].pop("worker")
    dep["roles"] = {"prefill": role, "decode": role}
    dep["router"] = {"port": 8000}
    dep["preflight"] = {"waive": ["ports"]}
    path = write_deployment(tmp_path, dep)
    plan = json.loads(hs("plan", str(path), "--json").stdout)
    side = {i["ports"]["side_channel"] for i in plan["instances"]}
    assert len(side) == 1, side
    port = side.pop()
    nodes = sorted(dev_cluster.node_addresses())
    with contextlib.ExitStack() as held:
        # the job's user's own processes (another user's would be named as such, not by PID)
        holders = {n: held.enter_context(listener_on(dev_cluster, n, port, OWNER))
                   for n in nodes}
        t0 = time.time()
        out = hs("submit", str(path), "--wait", check=False).stdout
        job = _job_id(out)
        st = _status(hs, job)
        took = time.time() - t0
    f = st["failure"]
    assert st["phase"] == "failed" and f["reason"] == "port taken", st
    assert f["role"] in ("prefill", "decode") and f["instance"] == 0, f
    inst = f"{f['role']}-0"
    assert f["node"] == _rows(Path(st["job_dir"]), inst)[0][1], f
    assert f["port"] == port and str(holders[f["node"]]) in f["holder"], f
    assert took < 120, f"named after {took:.0f} s"
    wait_no_job_processes(dev_cluster, 60)
