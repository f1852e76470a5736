"""Renewal (`renew:`) on the real test cluster with the real sglang-router: an instance job of a
one-minute time limit submits its twin ahead of the limit, and once the twin's instance serves,
drains its own and ends "done" before Slurm's limit; the twin renews back into the first
directory in turn. Under steady load through the front's router, no request fails; `status`
finds the successor that no index holds, and `cancel` of the front stops it."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from jobkit import Job, Load, deployment, until

pytestmark = pytest.mark.slurm

HPCSERVE = str(Path(sys.executable).parent / "hpcserve")
FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1}
ENGINE = {"name": "sglang", "version": "0.5.23", "simulate": True,
          "sim_decode_s_per_token": 0.02}  # 8 tokens: 0.16 s in flight, so a drain waits
# A one-minute instance job renews 40 s before its limit (or at Slurm's warning signal, which
# may come up to 60 s early): two renewals well within 90 s
RENEW = {"margin": "40s", "time_limit": "00:01:00"}


def _hpcserve(env: dict, *args: str) -> str:
    r = subprocess.run([HPCSERVE, *args], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def _slurm_record(env: dict, job_id: str) -> dict:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env,
                         capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _ended(env: dict, job_id: str) -> dict | None:
    """Slurm's record of the job once it no longer runs."""
    rec = _slurm_record(env, job_id)
    return None if rec["JobState"] in ("RUNNING", "COMPLETING") else rec


def _renewed(job: Job, env: dict) -> Job:
    """Once `job` ended "done" for its successor: that successor (in its twin directory),
    after checking the old job drained before Slurm's time limit would have ended it."""
    st = job.wait({"done", "failed", "cancelled"}, 75)
    succ = (st.get("renew") or {}).get("successor_job_id")
    assert (st["phase"], st["reason"]) == ("done", f"renewed by job {succ}"), job.logs()
    assert st["instances"]["decode-0"]["status"] == "removed", st
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    assert log.index("decode-0 removed from the router") < \
        log.index("decode-0 removed: drained on request") < log.index("final state: done"), log
    # its batch script exits just after the final state: Slurm's word once it has
    rec = until(f"job {job.id} ended in Slurm", lambda: _ended(env, job.id), 30)
    assert rec["JobState"] == "COMPLETED", rec  # not TIMEOUT: it ended by its drain
    start = datetime.fromisoformat(rec["StartTime"]).timestamp()
    assert rec["TimeLimit"] == "00:01:00", rec
    assert st["finished_at"] < start + 60, (st["finished_at"], rec)  # before its limit
    twin = Path(st["renew"]["twin_dir"])
    return Job(job.cluster, twin, succ, job.env)


def test_an_instance_job_renews_twice_under_load_without_a_failed_request(submit, tmp_path):
    front = submit(deployment(name="t-renew", liveness=FAST, engine=ENGINE, renew=RENEW))
    fst = front.wait({"serving", "failed", "cancelled"}, 60)
    assert fst["phase"] == "serving", front.logs()
    url = fst["endpoint"]
    env = {**front.env, "HPCSERVE_STATE_DIR": str(tmp_path / "state")}
    out = _hpcserve(env, "scale", front.id, "--role", "decode", "--add", "1")
    m = re.search(r"submitted job (\d+).*\njob directory: (\S+)", out)
    first = Job(front.cluster, Path(m.group(2)), m.group(1), env)
    twin_dir = Path(str(first.dir) + "b")
    assert (twin_dir / "job.sbatch").exists() and not (twin_dir / "state.json").exists()
    sbatch = (twin_dir / "job.sbatch").read_text()
    assert "#SBATCH --signal=B:USR2@40" in sbatch and "#SBATCH --time=00:01:00" in sbatch
    assert first.wait({"serving", "failed", "done"}, 30)["phase"] == "serving", first.logs()
    jobs = [first]
    try:
        with Load(url) as load:
            second = _renewed(first, env)
            assert second.dir == twin_dir
            jobs.append(second)
            third = _renewed(second, env)
            assert third.dir == first.dir  # b renews back into a, in place
            jobs.append(third)
            assert third.wait({"serving", "failed", "done"}, 30)["phase"] in ("serving", "done")
            served = load.ok_between(0, float("inf"))
            until("requests after two renewals",
                  lambda: load.ok_between(0, float("inf")) >= served + 4, 20)
        assert not load.failures(), load.failures()[:3]
        # status finds the running successor (no index holds it); cancel of the front stops it
        now = next(j for j in reversed(jobs) if j.state().get("phase") == "serving")
        assert re.search(rf"^  {now.id} ", _hpcserve(env, "status", front.id), re.M)
        _hpcserve(env, "cancel", front.id, "--wait")
        until(f"successor job {now.id} ended", lambda: now.state().get("phase") in
              ("cancelled", "done"), 30, why=now.logs)
    finally:  # every job that ran either directory, or was submitted into one
        ids = {j.id for j in jobs} | {str(v) for d in (first.dir, twin_dir) for v in
                                      _job_ids(Job(front.cluster, d, "", env).state())}
        for i in ids:
            subprocess.run(["scancel", i], env=env, capture_output=True)
        for i in ids:
            Job(front.cluster, first.dir, i, env).squeue_gone(60)


def _job_ids(st: dict) -> list:
    return [v for v in (st.get("job_id"), (st.get("renew") or {}).get("successor_job_id")) if v]
