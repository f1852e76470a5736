"""Serving means serving, on the real test cluster: with recovery off (restart: false) and one
decode instance, a decode leader that hangs (the simulated engine's hang fault, or SIGSTOP) and a
node that crashes (every process of its namespace, slurmstepd and slurmd included) each end the
deployment with the reason, role, instance and node named, and leave nothing behind on the other
nodes. (test_recovery.py: the same failures replaced while the others serve.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from jobkit import NO_RESTART, deployment, find_pid, fire_fault, wait_no_job_processes

pytestmark = pytest.mark.slurm

FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1, "hung_after": 1}


@pytest.mark.parametrize("how", ["fault", "sigstop"])
def test_a_hung_decode_leader_ends_the_deployment_as_hung(submit, dev_cluster, how):
    dep = deployment(1, 2, name=f"t-hung-{how}", liveness=FAST)
    dep["roles"]["decode"].update(NO_RESTART)
    if how == "fault":
        dep["roles"]["decode"]["sim_fault"] = {"kind": "hang", "on_signal": True, "ranks": [0]}
    job = submit(dep)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    leader = job.node_rows("decode-0")[0]
    t0 = time.time()
    if how == "sigstop":
        os.kill(find_pid(dev_cluster, leader[1], r"hpcserve_sim\.py"), signal.SIGSTOP)
    else:
        fire_fault(dev_cluster, leader[1])
    st = job.wait({"failed", "cancelled", "done"}, 30)
    f = st["failure"]
    assert st["phase"] == "failed" and f["reason"] == "hung", st
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("decode", 0, leader[1], 0)
    assert f["probe"] == f"http://{leader[2]}:30000/health_generate"
    if how == "sigstop":
        assert time.time() - t0 < 10, f"failed {time.time() - t0:.1f} s after the hang"
    wait_no_job_processes(dev_cluster, 30)


def test_a_crashed_node_ends_the_deployment_as_node_lost(submit, dev_cluster):
    dep = deployment(1, 2, name="t-crash", liveness=FAST)
    dep["roles"]["decode"].update(NO_RESTART)
    job = submit(dep)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    victim = job.node_rows("decode-0")[1][1]  # decode node rank 1
    t0 = time.time()
    try:
        dev_cluster.crash_node(victim)
        st = job.wait({"failed", "cancelled", "done"}, 30)
        took = time.time() - t0
    finally:
        dev_cluster.restart_node(victim)
    f = st["failure"]
    assert st["phase"] == "failed" and f["reason"] == "node lost", st
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("decode", 0, victim, 1)
    assert f"node {victim} lost" in st["reason"]
    assert took < 10, f"failed {took:.1f} s after the crash"
    wait_no_job_processes(dev_cluster, 30)


def test_status_probe_reports_each_instance_not_only_the_router(submit, dev_cluster, tmp_path,
                                                               owners_hpcserve):
    """`hpcserve status --probe`, run by the job's user."""
    job = submit(deployment(1, 2, name="t-probe"))  # default liveness: minutes to give up
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    env = {**job.env, "HPCSERVE_STATE_DIR": str(tmp_path / "state")}

    def probe(*more: str) -> str:
        r = subprocess.run([*owners_hpcserve, "status", job.id, "--probe", *more], env=env,
                           cwd="/", capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
        return r.stdout
    (v,) = json.loads(probe("--json"))
    assert v["health"] == "router ok, prefill-0 ok, decode-0 ok", v
    leader = job.node_rows("decode-0")[0]
    os.kill(find_pid(dev_cluster, leader[1], r"hpcserve_sim\.py"), signal.SIGSTOP)
    table = probe()
    assert "decode-0 no answer" in table and "prefill-0 ok" in table, table


def test_a_lost_node_with_requeue_serves_again_without_that_node(submit, dev_cluster):
    job = submit(deployment(1, 1, name="t-requeue", liveness=FAST, requeue=1))
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    victim = job.node_rows("decode-0")[0][1]
    try:
        dev_cluster.crash_node(victim)
        st = job.wait({"requeued", "failed", "cancelled", "done"}, 30)
        assert st["phase"] == "requeued" and f"node {victim} lost" in st["reason"], st
        st = job.wait({"serving", "failed", "cancelled", "done"}, 120, restarts=1)
        assert st["phase"] == "serving" and st["restarts"] == 1, job.logs()
        used = {r[1] for inst in ("prefill-0", "decode-0") for r in job.node_rows(inst)}
        assert victim not in used, (victim, used)
    finally:
        dev_cluster.restart_node(victim)


def test_a_node_slurm_ends_the_job_for_fails_it_as_node_lost_not_cancelled(submit, dev_cluster):
    # hpcserve's own checks are slowed down so that Slurm notices the crash first
    # (SlurmdTimeout). --no-kill keeps a job running only where the failed node's component has
    # nodes left: decode's component is that one node, so Slurm ends the job NODE_FAIL with a
    # TERM, and the runtime must ask Slurm why, not take the TERM for a scancel.
    slow = {**FAST, "node_interval": 600, "failures": 1000}
    job = submit(deployment(1, 1, name="t-nodefail", liveness=slow))
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    victim = job.node_rows("decode-0")[0][1]
    try:
        dev_cluster.crash_node(victim)
        st = job.wait({"failed", "cancelled", "done"}, 60)
    finally:
        dev_cluster.restart_node(victim)
    f = st["failure"]
    assert st["phase"] == "failed" and f["reason"] == "node lost", st
    assert (f["role"], f["instance"], f["node"]) == ("decode", 0, victim), f
    assert f"node {victim} lost: Slurm reports it down" in st["reason"], st["reason"]
    assert "Slurm is ending the job" in st["reason"], st["reason"]
    job.squeue_gone(30)
    wait_no_job_processes(dev_cluster, 30)
