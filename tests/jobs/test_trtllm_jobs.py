"""Simulated TensorRT-LLM on the real test cluster, launched as the real one is: one Slurm task
per GPU under `srun --mpi=pmix`, the world formed by real OpenMPI through mpi4py. Two nodes x 2
tasks serve from rank 0; a wrong task count or a step without PMIx fails for that reason,
naming the rank and its node; 1 context + 1 generation server serve through the disaggregated
front server's stand-in, the KV moving from the context to the generation server; a cancel
leaves no process behind."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from jobkit import chat, deployment, wait_no_job_processes

pytestmark = pytest.mark.slurm


def trtllm(roles: dict, **over) -> dict:
    d = deployment(**over)
    d["name"] = over.get("name", "t-trt")
    # 2 "GPUs" per node: 2 MPI ranks per node
    d["site"] = {"base": "local", "node": {"gpus": 2}}
    d["engine"] = {"name": "trtllm", "version": "1.3.0rc3", "simulate": True}
    d["model"] = {"profile": "tiny-llama", "path": "/models/tiny-llama", "served_name": "kimi-k2"}
    d["roles"] = roles
    return d


def _edit(rel: str, *pairs: tuple[str, str]):
    def edit(job_dir: Path) -> None:
        p = job_dir / rel
        text = p.read_text()
        for old, new in pairs:
            assert old in text, f"{old!r} not in {rel}"
            text = text.replace(old, new)
        p.write_text(text)
    return edit


def _task_log(job, inst: str, node_rank: int, task: int) -> str:
    node = job.node_rows(inst)[node_rank][1]
    return (job.dir / "logs" / f"{inst}.node{node_rank}.{node}.task{task}.log").read_text()


def test_two_nodes_of_mpi_ranks_serve_from_rank_0(submit, dev_cluster):
    job = submit(trtllm({"worker": {"nodes": 2}}, router={"enabled": False},
                        name="t-trt-tp4"))
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    # the preflight ran as one MPI world too (the engine runs under PMIx): node rank 1's clock
    # measured against rank 0's by ping-pong
    assert st["preflight"]["mode"] == "mpi" and st["preflight"]["passed"]
    rows = job.node_rows("worker-0")
    assert "from rank 0" in st["preflight"]["nodes"][rows[1][1]]["clock"][1]
    leader = f"http://{rows[0][2]}:8200"
    assert st["health_urls"] == {"worker-0": leader + "/health"}
    resp = chat(leader, 6)
    assert resp["usage"]["completion_tokens"] == 6
    with urllib.request.urlopen(leader + "/v1/models", timeout=10) as r:
        assert json.load(r)["data"][0]["id"] == "/models/tiny-llama"
    # one world of 4 ranks over both nodes: rank 0 serves, ranks 1-3 are its workers, each
    # with its own log on its own node
    assert "world of 4 ranks on 2 node(s)" in _task_log(job, "worker-0", 0, 0)
    for node_rank, task, rank in ((0, 1, 1), (1, 0, 2), (1, 1, 3)):
        text = _task_log(job, "worker-0", node_rank, task)
        assert f"rank {rank} of 4 on {rows[node_rank][1]}" in text, text
        assert f"MPI worker rank {rank} ready" in text, text
    job.scancel()
    assert job.wait({"cancelled", "failed", "done"}, 60)["phase"] == "cancelled", job.logs()
    wait_no_job_processes(dev_cluster, 30)


def test_wrong_task_count_fails_naming_rank_node_and_sizes(submit):
    # One task per node instead of one per GPU: a world of 2 for TP 4.
    job = submit(trtllm({"worker": {"nodes": 2}}, router={"enabled": False},
                        name="t-trt-ntasks"),
                 edit=_edit("steps/worker-0.sh", ("--ntasks=4", "--ntasks=2"),
                            ("--ntasks-per-node=2", "--ntasks-per-node=1")))
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    f = st["failure"]
    assert f["step"] == "worker-0" and f["exit_code"] == 1, f
    assert f["node"] in {r[1] for r in job.node_rows("worker-0")}, f
    assert any("MPI world size 2 != tp_size 4 x pp_size 1 = 4" in ln for ln in f["log_tail"]), f
    assert f["log"].endswith(".task0.log"), f


def test_step_without_pmix_fails_for_that_reason(submit):
    job = submit(trtllm({"worker": {"nodes": 2}}, router={"enabled": False},
                        name="t-trt-nopmix"),
                 edit=_edit("steps/worker-0.sh", ("--mpi=pmix", "--mpi=none")))
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    f = st["failure"]
    assert f["step"] == "worker-0", f
    text = "\n".join(f["log_tail"])
    # each task is an MPI world of its own (or OpenMPI refuses to start without PMI)
    assert "not started with srun --mpi=pmix" in text or "PMI support" in text, text


def test_disaggregated_serving_through_the_front_server(submit, dev_cluster):
    job = submit(trtllm({"prefill": {"cache_transceiver": "UCX"},
                         "decode": {"cache_transceiver": "UCX"}}, name="t-trt-disagg"))
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    assert st["endpoint"] == f"http://{dev_cluster.node_addresses()['node1']}:8000"
    assert chat(st["endpoint"], 5)["usage"]["completion_tokens"] == 5
    events = chat(st["endpoint"], 4, stream=True)
    assert len([e for e in events if e.get("choices") and
                e["choices"][0]["delta"].get("content")]) == 4
    # the generation server took each request's KV from the context server's node
    ctx_ip = job.node_rows("prefill-0")[0][2]
    gen_log = _task_log(job, "decode-0", 0, 0)
    assert gen_log.count(f"received from {ctx_ip}:8200 over UCX") >= 3, gen_log
    router_log = (job.dir / "logs" / "router.log").read_text()
    assert "server" in router_log and "is ready" in router_log, router_log
    job.scancel()
    assert job.wait({"cancelled", "failed", "done"}, 60)["phase"] == "cancelled", job.logs()
    wait_no_job_processes(dev_cluster, 30)
