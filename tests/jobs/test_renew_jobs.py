"""Renewal (`renew:`) on the real test cluster with the real sglang-router: an instance job of a
one-minute time limit submits its twin ahead of the limit, and once the twin's instance serves,
drains its own and ends "done" before Slurm's limit; the twin renews back into the first
directory in turn. A decode and a prefill instance job renew side by side (no longer a test):
the router lists each prefill successor with its own bootstrap port, and its own log shows the
PD requests the router sends it. Under steady load through the front's router, no request
fails; `status` finds the successors that no index holds, and `cancel` of the front stops
them."""

from __future__ import annotations

import json
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from jobkit import Job, Load, deployment, requests_in, until
from test_attach import _listed, _worker_url

pytestmark = pytest.mark.slurm

FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1, "hung_after": 1}
ENGINE = {"name": "sglang", "version": "0.5.23", "simulate": True,
          "sim_decode_s_per_token": 0.02}  # 8 tokens: 0.16 s in flight, so a drain waits
# A one-minute instance job renews 40 s before its limit (or at Slurm's warning signal, which
# may come up to 60 s early): two renewals well within 90 s
RENEW = {"margin": "40s", "time_limit": "00:01:00"}


def _hpcserve(cli: list[str], env: dict, *args: str) -> str:
    """`hpcserve ARGS` as the jobs' user runs it (`cli`: owners_hpcserve)."""
    r = subprocess.run([*cli, *args], env=env, capture_output=True, text=True, timeout=120,
                       cwd="/")
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


def _renewed(job: Job, env: dict, inst: str) -> Job:
    """Once `job` ended "done" for its successor: that successor (in its twin directory),
    after checking the old job drained its instance `inst` before Slurm's time limit would have
    ended it."""
    st = job.wait({"done", "failed", "cancelled"}, 75)
    succ = (st.get("renew") or {}).get("successor_job_id")
    assert (st["phase"], st["reason"]) == ("done", f"renewed by job {succ}"), job.logs()
    assert st["instances"][inst]["status"] == "removed", st
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    assert log.index(f"{inst} removed from the router") < \
        log.index(f"{inst} removed: drained on request") < log.index("final state: done"), log
    # its batch script exits just after the final state: Slurm's word once it has
    rec = until(f"job {job.id} ended in Slurm", lambda: _ended(env, job.id), 30)
    assert rec["JobState"] == "COMPLETED", rec  # not TIMEOUT: it ended by its drain
    start = datetime.fromisoformat(rec["StartTime"]).timestamp()
    assert rec["TimeLimit"] == "00:01:00", rec
    assert st["finished_at"] < start + 60, (st["finished_at"], rec)  # before its limit
    twin = Path(st["renew"]["twin_dir"])
    return Job(job.cluster, twin, succ, job.env)


def _add(cli: list[str], env: dict, front: Job, role: str) -> Job:
    """`hpcserve scale --add 1` of `role`: its instance job, serving, its twin not yet run."""
    out = _hpcserve(cli, env, "scale", front.id, "--role", role, "--add", "1")
    m = re.search(r"submitted job (\d+).*\njob directory: (\S+)", out)
    job = Job(front.cluster, Path(m.group(2)), m.group(1), env)
    twin_dir = Path(str(job.dir) + "b")
    assert (twin_dir / "job.sbatch").exists() and not (twin_dir / "state.json").exists()
    sbatch = (twin_dir / "job.sbatch").read_text()
    assert "#SBATCH --signal=B:23@40" in sbatch and "#SBATCH --time=00:01:00" in sbatch
    return job


def _bootstrap_listed(url: str, job: Job) -> None:
    """The router lists the prefill instance that `job` runs with `job`'s own bootstrap port,
    the one its decode peers fetch KV caches from (the twins' ports differ)."""
    port = json.loads((job.dir / "plan.json").read_text())["instances"][0]["ports"]["bootstrap"]
    got = _listed(url, job.key).get(_worker_url(job, "prefill-0"))
    assert got and (got["worker_type"], got["bootstrap_port"]) == ("prefill", port), \
        (job.id, port, _listed(url, job.key))


def _takes_requests(job: Job, inst: str) -> None:
    """The instance's own log shows requests (the router's round robin sends it its share)."""
    log = job.dir / job.state()["startup"]["instances"][inst]["log"]
    until(f"requests in {inst}'s log of job {job.id}", lambda: requests_in(log) >= 2, 15)


def test_instance_jobs_renew_twice_under_load_without_a_failed_request(submit, tmp_path,
                                                                       owners_hpcserve):
    """A decode and a prefill instance job, side by side, each renewed twice."""
    front = submit(deployment(name="t-renew", liveness=FAST, engine=ENGINE, renew=RENEW))
    fst = front.wait({"serving", "failed", "cancelled"}, 60)
    assert fst["phase"] == "serving", front.logs()
    url = fst["endpoint"]
    env = {**front.env, "HPCSERVE_STATE_DIR": str(tmp_path / "state")}
    firsts = {"decode-0": _add(owners_hpcserve, env, front, "decode"),
              "prefill-0": _add(owners_hpcserve, env, front, "prefill")}
    jobs = list(firsts.values())
    try:
        for first in firsts.values():
            assert first.wait({"serving", "failed", "done"}, 30)["phase"] == "serving", \
                first.logs()
        _bootstrap_listed(url, firsts["prefill-0"])
        with Load(url, key=front.key) as load:
            cur = dict(firsts)
            for turn in range(2):    # both renew meanwhile: wait on each in turn
                for inst, job in cur.items():
                    cur[inst] = nxt = _renewed(job, env, inst)
                    jobs.append(nxt)
                    # a renews into b, and b back into a, in place
                    assert nxt.dir == (Path(str(firsts[inst].dir) + "b") if turn == 0
                                       else firsts[inst].dir)
                    if inst == "prefill-0":  # the router learnt the successor's bootstrap port
                        assert nxt.wait({"serving", "failed", "done"}, 30)["phase"] in \
                            ("serving", "done")
                        _bootstrap_listed(url, nxt)
                        assert _worker_url(job, inst) not in _listed(url, job.key)
                        _takes_requests(nxt, inst)
            served = load.ok_between(0, float("inf"))
            until("requests after two renewals",
                  lambda: load.ok_between(0, float("inf")) >= served + 4, 20)
        assert not load.failures(), load.failures()[:3]
        # status finds the running successors (no index holds them); cancel of the front stops
        # them
        now = [j for j in cur.values() if j.state().get("phase") == "serving"]
        for j in now:
            assert re.search(rf"^  {j.id} ", _hpcserve(owners_hpcserve, env, "status",
                                                       front.id), re.M)
        _hpcserve(owners_hpcserve, env, "cancel", front.id, "--wait")
        for j in now:
            until(f"successor job {j.id} ended", lambda: j.state().get("phase") in
                  ("cancelled", "done"), 30, why=j.logs)
    finally:  # every job that ran either directory, or was submitted into one
        dirs = [d for f in firsts.values() for d in (f.dir, Path(str(f.dir) + "b"))]
        ids = {j.id for j in jobs} | {str(v) for d in dirs for v in
                                      _job_ids(Job(front.cluster, d, "", env).state())}
        for i in ids:
            subprocess.run(["scancel", i], env=env, capture_output=True)
        for i in ids:
            Job(front.cluster, dirs[0], i, env).squeue_gone(60)


def _job_ids(st: dict) -> list:
    return [v for v in (st.get("job_id"), (st.get("renew") or {}).get("successor_job_id")) if v]
