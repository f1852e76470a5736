"""Run-time failures on the real test cluster: wrong rank, wrong leader address, wrong bootstrap
port, a dead decode engine, a dead router. Each must end the job with the reason recorded, and
each test proves the job failed for that reason and left no process behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from jobkit import NO_RESTART, deployment, find_pid, fire_fault, wait_no_job_processes

pytestmark = pytest.mark.slurm


def _edit(rel: str, old: str, new: str):
    def edit(job_dir: Path) -> None:
        p = job_dir / rel
        text = p.read_text()
        assert old in text, f"{old!r} not in {rel}"
        p.write_text(text.replace(old, new))
    return edit


def _decode_logs(job) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (job.dir / "logs").glob("decode-0.node*.log"))


def test_every_node_rank_zero_fails_like_nccl_init(submit, dev_cluster):
    # The upstream SGLang Slurm example's bug: $SLURM_NODEID expanded in the batch shell, so every
    # node gets rank 0. The leader must see a duplicate rank and the job must fail for it.
    job = submit(deployment(1, 2, name="t-rank0"),
                 edit=_edit("launch/decode-0.sh", '--node-rank "${NODE_RANK}"', "--node-rank 0"))
    st = job.wait({"failed", "serving", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    f = st["failure"]
    rows = job.node_rows("decode-0")
    # The second node, told it is rank 0, tries to host the rendezvous on the leader's address,
    # which is not its own: like torch's TCPStore it cannot bind, and the job names that node.
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("decode", 0, rows[1][1], 1)
    assert f["exit_code"] == 1
    assert any(f"cannot bind {rows[0][2]}:5757" in ln for ln in f["log_tail"]), f["log_tail"]
    assert "serving" not in [h["phase"] for h in st["history"]]
    wait_no_job_processes(dev_cluster, 15)


def test_wrong_dist_init_address_fails_naming_the_node_rank_and_address(submit, dev_cluster):
    # Each node believes it is the leader's address: rank 1 looks for the rendezvous at its own
    # address, where nothing listens. It gives up first (3 s, the leader waits 30 s), so the
    # failure must name rank 1, its node and the address it tried.
    dep = deployment(1, 2, name="t-addr", readiness={"engine_timeout": 30, "poll_interval": 0.1})

    def edit(job_dir: Path) -> None:
        _edit("launch/decode-0.sh", '--dist-init-addr "${LEADER_IP}"',
              '--dist-init-addr "${NODE_IP}"')(job_dir)
        _edit("launch/decode-0.sh", "\nexec \\\n",
              '\nexport HPCSERVE_SIM_INIT_TIMEOUT=$([ "$NODE_RANK" = 1 ] && echo 3 || echo 30)'
              "\nexec \\\n")(job_dir)

    job = submit(dep, edit=edit)
    st = job.wait({"failed", "serving", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    rows = job.node_rows("decode-0")
    f = st["failure"]
    assert st["reason"] == "step decode-0 exited with code 1", st["reason"]  # not a timeout
    assert (f["role"], f["instance"], f["node"], f["node_rank"], f["exit_code"]) == (
        "decode", 0, rows[1][1], 1, 1)
    # the address it tried is its own, not the leader's
    assert any(f"connecting to {rows[1][2]}:5757" in ln and "node_rank=1" in ln
               for ln in f["log_tail"]), f["log_tail"]
    wait_no_job_processes(dev_cluster, 15)


def test_wrong_bootstrap_port_fails_the_smoke_request(submit, dev_cluster):
    # The router tells decode to fetch KV from a port where no bootstrap server listens: the
    # smoke request must fail, so the deployment never claims to serve.
    dep = deployment(1, 1, name="t-bport")
    dep["roles"]["decode"]["env"] = {"HPCSERVE_SIM_BOOTSTRAP_TIMEOUT": 3}
    job = submit(dep, edit=_edit("launch/router.sh", ":30000 8998", ":30000 8997"))
    st = job.wait({"failed", "serving", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    assert "smoke request" in st["reason"]
    assert "8997" in _decode_logs(job) and "bootstrap" in _decode_logs(job)
    wait_no_job_processes(dev_cluster, 15)


def test_killed_decode_engine_without_restart_ends_the_job_within_5s(submit, dev_cluster):
    dep = deployment(1, 2, name="t-kill")
    dep["roles"]["decode"].update(NO_RESTART)
    job = submit(dep)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    rows = job.node_rows("decode-0")
    victim_node = rows[1][1]  # decode node-rank 1
    pid = find_pid(dev_cluster, victim_node, r"hpcserve_sim\.py")
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    st = job.wait({"failed", "cancelled", "done"}, 10)
    assert time.time() - t0 < 5, f"terminal after {time.time() - t0:.1f}s"
    f = st["failure"]
    assert st["phase"] == "failed"
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("decode", 0, victim_node, 1)
    assert f["exit_code"] == 128 + 9  # Killed, as srun reported it
    assert {"node": victim_node, "node_rank": 1, "task": 1, "how": "Killed", "exit_code": 137,
            "cause": True} in f["tasks"]
    wait_no_job_processes(dev_cluster, 15)


def test_a_rank_that_exits_0_while_serving_fails_its_instance_naming_the_node(submit, dev_cluster):
    """vLLM's headless rank shuts down with exit code 0 once its worker died: srun's
    --kill-on-bad-exit does not act on that, its --wait does, and the job names that rank."""
    dep = deployment(1, 2, name="t-exit0")
    dep["roles"]["decode"].update(NO_RESTART)
    dep["roles"]["decode"]["sim_fault"] = {"kind": "exit", "exit_code": 0, "on_signal": True,
                                           "ranks": [1]}
    # and, as vLLM's API server on node rank 0 did, the leader does not notice
    dep["env"] = {"HPCSERVE_SIM_PEER_LOSS_DELAY": 600}
    job = submit(dep)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    victim = job.node_rows("decode-0")[1][1]
    fire_fault(dev_cluster, victim)
    st = job.wait({"failed", "cancelled", "done"}, 30)
    f = st["failure"]
    assert st["phase"] == "failed", st
    assert (f["role"], f["instance"], f["node"], f["node_rank"], f["exit_code"]) == \
        ("decode", 0, victim, 1, 0), f
    assert {"node": victim, "node_rank": 1, "task": 1, "how": "exited", "exit_code": 0,
            "cause": True} in f["tasks"]
    wait_no_job_processes(dev_cluster, 15)


def test_dead_router_ends_the_deployment(submit, dev_cluster):
    job = submit(deployment(1, 1, name="t-router"))
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    # sglang-router sets its process title to `sglang::router` (its cmdline shows that title)
    pid = find_pid(dev_cluster, "node1", r"^sglang::router")
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    st = job.wait({"failed", "cancelled", "done"}, 10)
    assert time.time() - t0 < 5
    f = st["failure"]
    assert st["phase"] == "failed" and f["role"] == "router", st
    # where it ran and how it ended, as srun reported it
    assert (f["node"], f["exit_code"]) == ("node1", 128 + 9), f
    assert st["reason"] == "step router exited with code 137", st["reason"]
    wait_no_job_processes(dev_cluster, 15)
    # both engines (one per het component) were signalled as Slurm steps, not as srun clients
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    term = [ln for ln in log.splitlines() if "scancel --signal=TERM" in ln]
    assert term and len(term[-1].split("TERM", 1)[1].split()) == 2, log
    assert "not listed by squeue" not in log, log
