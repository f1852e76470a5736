"""Simulated vLLM behind the real vllm-router on the real test cluster: TP across two nodes,
DP over two nodes (head + headless) and 1P1D PD serve streamed and plain chat; a wrong start
rank, master address or side-channel host fails for that reason; an engine kill and a scancel
end the job as they do for SGLang."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from jobkit import NO_RESTART, chat, find_pid, vllm_deployment, wait_no_job_processes

pytestmark = pytest.mark.slurm

ORDER = ["starting", "engines_ready", "router_ready", "serving"]


def _edit(rel: str, old: str, new: str):
    def edit(job_dir: Path) -> None:
        p = job_dir / rel
        text = p.read_text()
        assert old in text, f"{old!r} not in {rel}"
        p.write_text(text.replace(old, new))
    return edit


def _log(job, inst: str, rank: int) -> str:
    rows = job.node_rows(inst)
    return (job.dir / "logs" / f"{inst}.node{rank}.{rows[rank][1]}.log").read_text()


def _serves_chat(st: dict, key: str) -> None:
    resp = chat(st["endpoint"], 7, key=key)
    assert resp["usage"]["completion_tokens"] == 7
    events = chat(st["endpoint"], 5, stream=True, key=key)
    pieces = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    assert len([p for p in pieces if p]) == 5
    assert [e["usage"]["completion_tokens"] for e in events if e.get("usage")][-1] == 5


LAYOUTS = {
    "tp16-2nodes": {"worker": {"nodes": 2, "tp": 16}},
    "dp4-2nodes": {"worker": {"nodes": 2, "dp": 4, "expert_parallel": True}},
    "1p1d": {"prefill": {"nodes": 1}, "decode": {"nodes": 1}},
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=list(LAYOUTS))
def test_vllm_layout_serves_through_vllm_router(submit, dev_cluster, layout):
    job = submit(vllm_deployment(LAYOUTS[layout], name=f"t-v-{layout}"))
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    assert [h["phase"] for h in st["history"]] == ORDER
    assert st["endpoint"] == f"http://{dev_cluster.node_addresses()['node1']}:8000"
    _serves_chat(st, job.key)
    if layout == "tp16-2nodes":
        # rank 1 joined rank 0's torch.distributed store at the leader's address, headless
        rows = job.node_rows("worker-0")
        assert f"head node address {rows[0][2]}:29501" in _log(job, "worker-0", 1)
        assert "Starting vLLM server" not in _log(job, "worker-0", 1)
    if layout == "dp4-2nodes":
        rows = job.node_rows("worker-0")
        assert (f"Launching 2 data parallel engine(s) in headless mode, with head node address "
                f"tcp://{rows[0][2]}:29550") in _log(job, "worker-0", 1)
    if layout == "1p1d":
        # every request's KV came from the prefill node's own side channel
        prefill_ip = job.node_rows("prefill-0")[0][2]
        assert f"read from {prefill_ip}:5600" in _log(job, "decode-0", 0)
    t0 = time.time()
    job.scancel()
    st = job.wait({"cancelled", "failed", "done"}, 20)
    assert st["phase"] == "cancelled" and st["reason"] == "cancelled"
    wait_no_job_processes(dev_cluster, 12)
    assert time.time() - t0 < 14


def test_wrong_start_rank_fails_on_the_head_for_that_reason(submit, dev_cluster):
    dep = vllm_deployment({"worker": {"nodes": 2, "dp": 4, "expert_parallel": True}},
                          name="t-v-start")
    job = submit(dep, edit=_edit("launch/worker-0.sh", "--data-parallel-start-rank 2",
                                 "--data-parallel-start-rank 1"))
    st = job.wait({"failed", "serving", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    f = st["failure"]
    rows = job.node_rows("worker-0")
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("worker", 0, rows[0][1], 0)
    assert any("HELLO message from remote engine 1, expected it to be local" in ln
               for ln in f["log_tail"]), f["log_tail"]
    wait_no_job_processes(dev_cluster, 15)


def test_wrong_master_addr_fails_for_that_reason(submit, dev_cluster):
    # Node rank 0 is told to host torch.distributed's store on another node's address.
    dep = vllm_deployment({"worker": {"nodes": 2, "tp": 16}}, name="t-v-master")
    job = submit(dep, edit=_edit("launch/worker-0.sh", '--master-addr "${LEADER_IP}"',
                                 '--master-addr "$(awk \'$1 == 1 {print $3}\' "$NODES_FILE")"'))
    st = job.wait({"failed", "serving", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    f = st["failure"]
    rows = job.node_rows("worker-0")
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("worker", 0, rows[0][1], 0)
    assert any(f"cannot bind {rows[1][2]}:29501" in ln for ln in f["log_tail"]), f["log_tail"]
    wait_no_job_processes(dev_cluster, 15)


def test_side_channel_host_left_at_localhost_fails_the_smoke_request(submit, dev_cluster):
    # vLLM's default VLLM_NIXL_SIDE_CHANNEL_HOST is localhost: the prefill advertises it and the
    # decode, on another node, dials localhost, where no prefill is. The deployment must not
    # claim to serve.
    dep = vllm_deployment({"prefill": {"nodes": 1}, "decode": {"nodes": 1}}, name="t-v-side")
    job = submit(dep, edit=_edit("launch/prefill-0.sh",
                                 'export VLLM_NIXL_SIDE_CHANNEL_HOST="${NODE_IP}"\n', ""))
    st = job.wait({"failed", "serving", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    assert st["failure"]["reason"] == "smoke request failed" and "HTTP 500" in st["reason"]
    decode = _log(job, "decode-0", 0)
    assert "NIXL transfer failure: handshake_failed | Context: {'remote_host': 'localhost', " \
           "'remote_port': 5600" in decode, decode
    assert "NIXL side channel listening on localhost:5600" in _log(job, "prefill-0", 0)
    wait_no_job_processes(dev_cluster, 15)


def test_killed_headless_rank_without_restart_ends_the_job_naming_it(submit, dev_cluster):
    job = submit(vllm_deployment({"worker": {"nodes": 2, "dp": 4, "expert_parallel": True,
                                             **NO_RESTART}}, name="t-v-kill"))
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    victim = job.node_rows("worker-0")[1][1]
    pid = find_pid(dev_cluster, victim, r"hpcserve_sim\.py")
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    st = job.wait({"failed", "cancelled", "done"}, 10)
    assert time.time() - t0 < 5
    f = st["failure"]
    assert (f["role"], f["instance"], f["node"], f["node_rank"], f["exit_code"]) == (
        "worker", 0, victim, 1, 137)
    wait_no_job_processes(dev_cluster, 15)
