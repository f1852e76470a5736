"""slurmctld restarts under a deployment that serves, on the real test cluster: through the
outage `hpcserve status` says the controller is unreachable (exit 2, the command named) instead
of calling the deployment ended, the deployment keeps serving and keeps its phase; once the
controller is back, status shows it serving and `hpcserve cancel` ends it as ever."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from hpcserve.operate import deployments
from jobkit import chat, deployment, hand_over, wait_no_job_processes

pytestmark = pytest.mark.slurm

# Fast probes, so that a runtime that took the outage for a failure would show it within the
# outage; Slurm's word on the nodes (sinfo) is asked every 2 s.
LIVENESS = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 2, "hung_after": 1}


def _shim(shim: Path, tool: str, log: Path, in_job: bool) -> None:
    """`tool` in front of the real one: each call (of a job's processes, or of everything else)
    logged as `start end rc stderr`."""
    real = shutil.which(tool)
    only = '[ -n "$SLURM_JOB_ID" ]' if in_job else '[ -z "$SLURM_JOB_ID" ]'
    (shim / tool).write_text(f"""#!/bin/bash
{only} || exec {real} "$@"
start=$(date +%s.%N); err=$(mktemp)
{real} "$@" 2>"$err"; rc=$?
echo "$start $(date +%s.%N) $rc $(tr '\\n' ' ' < "$err")" >> {log}
cat "$err" >&2; rm -f "$err"; exit $rc
""")
    (shim / tool).chmod(0o755)


@pytest.fixture
def sinfo_calls(tmp_path, monkeypatch) -> Path:
    """Every sinfo a job runs (its runtime's node polls) logged by a shim in front of the real
    one on the PATH that sbatch exports to the job; beside it (squeue-calls) every squeue the
    test's own `hpcserve status` runs. Set up before the `submit` fixture reads PATH
    (usefixtures come first)."""
    shim, log = tmp_path / "shim", tmp_path / "sinfo-calls"
    shim.mkdir()
    _shim(shim, "sinfo", log, in_job=True)
    _shim(shim, "squeue", tmp_path / "squeue-calls", in_job=False)
    monkeypatch.setenv("PATH", f"{shim}{os.pathsep}{os.environ['PATH']}")
    return log


def _failed_since(log: Path, offset: int) -> bool:
    """Whether a call logged past `offset` found no controller."""
    text = log.read_text()[offset:] if log.exists() else ""
    return any(ln.split(" ", 3)[2] != "0" for ln in text.splitlines())


def _hpcserve(cli: list[str], env: dict, *args: str,
              timeout: float = 180) -> subprocess.CompletedProcess:
    """`hpcserve ARGS` as the job's user runs it (`cli`: owners_hpcserve)."""
    return subprocess.run([*cli, *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def _log_since(job, offset: int) -> str:
    return (job.dir / "logs" / "hpcserve-job.log").read_text(errors="replace")[offset:]


@pytest.mark.usefixtures("sinfo_calls")
def test_a_deployment_serves_through_a_controller_restart(submit, dev_cluster, tmp_path,
                                                          monkeypatch, sinfo_calls,
                                                          owners_hpcserve):
    job = submit(deployment(1, 1, name="t-ctld", liveness=LIVENESS))
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    # in hpcserve's index, as `hpcserve submit` leaves it: status asks squeue first
    monkeypatch.setenv("HPCSERVE_STATE_DIR", str(tmp_path / "state"))
    deployments.record(deployments.Entry(job.id, "t-ctld", str(job.dir), None, time.time()))
    hand_over(tmp_path)   # the index, as the job's user's own `hpcserve submit` leaves it
    env = {**job.env, "HPCSERVE_STATE_DIR": str(tmp_path / "state")}
    log_at = len((job.dir / "logs" / "hpcserve-job.log").read_text(errors="replace"))

    t0 = time.time()
    old = dev_cluster.stop_controller()
    try:
        r = _hpcserve(owners_hpcserve, env, "status", job.id)
        assert r.returncode == 2, (r.stdout, r.stderr)
        (line,) = r.stderr.splitlines()
        assert line.startswith("hpcserve: error: Slurm controller unreachable: squeue --me -h "
                               "-t all -o ...: slurm_load_jobs error: Unable to contact slurm "
                               "controller (connect failure) ("), line
        assert r.stdout == ""
        # the deployment serves on, its state untouched by the outage
        resp = chat(st["endpoint"], 6, key=job.key)
        assert resp["usage"]["completion_tokens"] == 6
        during = job.state()
        outage_log = _log_since(job, log_at)
        # a status asked while slurmctld restarts waits for it: the controller comes back once
        # that status's first squeue gave up (~9 s: the client's own connect retries last
        # MessageTimeout), so that its answer comes from hpcserve's own next try
        squeues = tmp_path / "squeue-calls"
        at = len(squeues.read_text()) if squeues.exists() else 0
        riding = subprocess.Popen([*owners_hpcserve, "status", job.id], env=env, text=True,
                                  cwd="/", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        end = time.time() + 60
        while not _failed_since(squeues, at) and riding.poll() is None and time.time() < end:
            time.sleep(0.1)
        assert _failed_since(squeues, at), "the riding status's squeue never ran"
    finally:
        t1 = time.time()
        new = dev_cluster.start_controller()
    assert new != old
    out, err = riding.communicate(timeout=120)
    assert riding.returncode == 0 and f"serving at {st['endpoint']}" in out, (out, err)
    # the runtime asked Slurm about its nodes within the outage, and was told it is gone
    polls = [ln.split(" ", 3) for ln in sinfo_calls.read_text().splitlines()]
    told = [p for p in polls if t0 < float(p[0]) and float(p[1]) < t1 and p[2] != "0"]
    assert any("Unable to contact slurm controller" in p[3] for p in told), polls
    assert during["phase"] == "serving" and not during.get("failure"), (during, outage_log)
    assert [h["phase"] for h in during["history"]] == [h["phase"] for h in st["history"]]

    r = _hpcserve(owners_hpcserve, env, "status", job.id)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert f"serving at {st['endpoint']}" in r.stdout and "RUNNING" in r.stdout, r.stdout
    assert chat(st["endpoint"], 3, key=job.key)["usage"]["completion_tokens"] == 3

    r = _hpcserve(owners_hpcserve, env, "cancel", job.id, "--wait")
    assert r.returncode == 0, (r.stdout, r.stderr)
    st = job.wait({"cancelled", "failed", "done"}, 30)
    assert st["phase"] == "cancelled" and st["reason"] == "cancelled", st
    job.squeue_gone(60)
    wait_no_job_processes(dev_cluster, 30)

