"""Teardown on the real test cluster: scancel during start-up, and the time limit's TERM."""

from __future__ import annotations

import subprocess
import time

import pytest

from jobkit import cmdline, deployment, node_processes, until, wait_no_job_processes

pytestmark = pytest.mark.slurm

GRACE = 10  # site_configs/local.yaml slurm.signal_grace


def test_scancel_during_startup_cancels_and_leaves_nothing(submit, dev_cluster):
    dep = deployment(1, 2, name="t-cancel-start", engine={"sim_startup_delay": 60})
    job = submit(dep)
    job.wait({"starting"}, 30)
    # wait until the three engine processes really run on their nodes (still loading)
    def engines() -> int:
        return sum(1 for ps in node_processes(dev_cluster).values() for p in ps
                   if "hpcserve_sim.py" in cmdline(p) and not cmdline(p).startswith("bash"))
    end = time.time() + 20
    while time.time() < end and engines() < 3:
        time.sleep(0.1)
    assert engines() == 3
    assert job.state()["phase"] == "starting"
    t0 = time.time()
    job.scancel()
    st = job.wait({"cancelled", "failed", "done"}, GRACE + 5)
    assert st["phase"] == "cancelled" and st["reason"] == "cancelled", st
    wait_no_job_processes(dev_cluster, GRACE + 2)
    assert time.time() - t0 <= GRACE + 2


def test_time_limit_tears_down_through_the_term_trap(submit, dev_cluster):
    # A one-minute job: Slurm sends TERM to the batch shell GRACE s before the limit (or up to
    # 60 s earlier); the runtime must tear down and record it before Slurm's own kill.
    job = submit(deployment(1, 1, name="t-timelimit", time_limit="00:01:00"))
    st = job.wait({"serving", "failed"}, 60)
    assert st["phase"] == "serving", job.logs()
    st = job.wait({"cancelled", "failed", "done"}, 90)
    assert st["phase"] == "cancelled" and st["reason"] == "time_limit", st
    # the TERM was told from a scancel's (the scancel test above records `cancelled`) by what
    # Slurm said was left of the time limit when it came
    assert "received SIGTERM: time_limit" in (job.dir / "logs" / "hpcserve-job.log").read_text()
    stopping = [h["at"] for h in st["history"] if h["phase"] == "stopping"][0]
    assert st["finished_at"] - stopping < GRACE
    wait_no_job_processes(dev_cluster, 5)
    # the batch script ended on its own before the limit: Slurm did not have to time it out
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job.id, "-o", "%T"], env=job.env,
                         capture_output=True, text=True).stdout.split()
    assert out and "TIMEOUT" not in out, out


def test_engines_ignoring_term_are_killed_and_the_state_still_written(submit, dev_cluster):
    # Hung engines ignore SIGTERM. After a plain scancel Slurm SIGKILLs the whole job KillWait
    # (5 s here) later, the orchestrator included: its KILL tier and final state must come first.
    dep = deployment(1, 2, name="t-hung")
    dep["roles"]["decode"]["sim_fault"] = {"kind": "hang", "after": 0}
    job = submit(dep)
    job.wait({"starting"}, 30)
    end = time.time() + 20
    while time.time() < end and sum(1 for ps in node_processes(dev_cluster).values() for p in ps
                                    if "hpcserve_sim.py" in cmdline(p)
                                    and not cmdline(p).startswith("bash")) < 3:
        time.sleep(0.1)
    # the hang fault is in force on both decode nodes (their logs say so), however slow the start
    def both_hung() -> bool:
        logs = [p.read_text(errors="replace") for p in (job.dir / "logs").glob("decode-0.node*.log")]
        return len(logs) == 2 and all("fault injection: hanging" in t for t in logs)
    until("the hang on both decode nodes", both_hung, 30, poll=0.1)
    t0 = time.time()
    job.scancel()
    st = job.wait({"cancelled", "failed", "done"}, 10)
    assert st["phase"] == "cancelled", st
    assert st["finished_at"] - t0 < 5, "final state after Slurm's KillWait"
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    assert "SIGKILL to decode-0" in log, log
    wait_no_job_processes(dev_cluster, GRACE + 2)
