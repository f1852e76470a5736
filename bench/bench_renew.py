#!/usr/bin/env python3
"""Failed requests across renewals (`renew:`) of a serving deployment's instance job, on the local
Slurm cluster (needs root; starts and stops its own cluster):

    .venv/bin/python bench/bench_renew.py [renewals]

The front job as bench_scale.py's (PD, 1 prefill and 1 decode instance, simulated SGLang 0.5.23
ready at once, the real sglang-router in PD mode), its deployment with
`renew: {margin: 40s, time_limit: "00:01:00"}`. `hpcserve scale FRONT --role decode --add 1`
submits a renewing decode instance job; 4 client threads send 8-token chat requests through the
front's router all along, while the instance job renews `renewals` times (default 4): each job
submits its twin (40 s before its one-minute limit, or at Slurm's warning signal, which may come
up to 60 s early), the twin serves, the old job drains its decode and ends. Per renewal, from
the jobs' own state.json: what triggered it, the successor's submission -> its serving, its
serving -> the old job's end (the handover: out of the router, in-flight finished, stopped), and
how long before its time limit the old job ended (Slurm's StartTime + TimeLimit). At the end,
the requests sent and those that failed (target 0).
"""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from bench_job import state, wait  # bench/ is sys.path[0]; it puts the checkout on it
from bench_recovery import Load, machine
from bench_scale import DEPLOY, cli, fresh, log_text, squeue_gone, start_front, started

BASE = Path("/tmp/hpcserve-bench-renew")
RENEW = 'renew: {margin: 40s, time_limit: "00:01:00"}\n'
CLIENTS = 4


def slurm_record(env: dict, jid: str) -> dict:
    out = subprocess.run(["scontrol", "-o", "show", "job", jid], env=env, check=True,
                         capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def served_at(st: dict) -> float:
    """When the job's state.json first said serving (this try of its directory: the last)."""
    return [h["at"] for h in st["history"] if h["phase"] == "serving"][-1]


def ended(job_dir: Path, jid: str) -> dict | None:
    """The directory's state.json once job `jid` ended in it."""
    s = state(job_dir)
    return s if s.get("job_id") == jid and s.get("phase") in ("done", "failed", "cancelled") \
        else None


def has_served(job_dir: Path, jid: str) -> dict | None:
    """The directory's state.json once job `jid` served in it."""
    s = state(job_dir)
    return s if s.get("job_id") == jid and "serving" in {h["phase"] for h in s["history"]} \
        else None


def slurm_ended(env: dict, jid: str) -> dict | None:
    rec = slurm_record(env, jid)
    return None if rec["JobState"] in ("RUNNING", "COMPLETING") else rec


def renewal(env: dict, job_dir: Path, jid: str) -> tuple[dict, Path, str]:
    """Waits for the job in `job_dir` (job `jid`) to end for its successor; that renewal's
    figures, and the successor's directory and job id."""
    st = wait(lambda: ended(job_dir, jid), 120)
    if not (st["reason"] or "").startswith("renewed by job"):
        raise SystemExit(f"job {jid} ended {st['phase']} ({st['reason']})\n{log_text(job_dir)}")
    rn = st["renew"]
    nxt, njid = Path(rn["twin_dir"]), rn["successor_job_id"]
    succ = wait(lambda: has_served(nxt, njid), 60)
    rec = wait(lambda: slurm_ended(env, jid), 30)
    start = datetime.fromisoformat(rec["StartTime"]).timestamp()
    limit = sum(int(x) * m for x, m in zip(rec["TimeLimit"].split(":"), (3600, 60, 1)))
    return {"trigger": rn["trigger"], "state": rec["JobState"],
            "to_serving": served_at(succ) - rn["submitted_at"],
            "handover": st["finished_at"] - served_at(succ),
            "before_limit": start + limit - st["finished_at"]}, nxt, njid


def report(out: list[dict], sent: int, failed: int) -> None:
    def row(label: str, k: str) -> None:
        xs = [r[k] for r in out]
        print(f"{label:60} median {statistics.median(xs):6.2f} s  min {min(xs):6.2f}  "
              f"max {max(xs):6.2f}")
    print(f"\n{len(out)} renewals of a one-minute decode instance job (margin 40 s):")
    row("successor submitted -> it serves", "to_serving")
    row("successor serves -> the old job ended (its drain)", "handover")
    row("the old job's end -> its time limit", "before_limit")
    print("triggers:", ", ".join(r["trigger"] for r in out))
    print("old jobs' Slurm states:", ", ".join(r["state"] for r in out))
    print(f"\nrequests through the router during the renewals: {sent}, failed: {failed}")


def main() -> None:
    renewals = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("machine:", machine())
    cluster, tmp = fresh(BASE, "10.253.11.0/24", "hrn")
    out: list[dict] = []
    ids: list[str] = []
    try:
        env = started(cluster, tmp)
        front, router, auth = start_front(
            env, tmp, DEPLOY.replace("name: bench-scale", "name: bench-renew") + RENEW)
        with Load(router, CLIENTS, auth) as load:
            _, _, said = cli(env, "scale", front, "--role", "decode", "--add", "1")
            m = re.search(r"submitted job (\d+).*\njob directory: (\S+)", said)
            jid, d = m.group(1), Path(m.group(2))
            ids.append(jid)
            for i in range(renewals):
                r, d, jid = renewal(env, d, jid)
                ids.append(jid)
                out.append(r)
                print(f"renewal {i + 1}: " + ", ".join(
                    f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in r.items()), flush=True)
            time.sleep(1)  # requests on the last successor alone
        failed = [x for x in load.results if x[2] is not None]
        cli(env, "cancel", front, "--wait")
        for j in ids + [front]:
            wait(lambda: squeue_gone(env, j), 60)
    finally:
        cluster.down()
    report(out, len(load.results), len(failed))
    if failed:
        print("errors:", sorted({e[:100] for _, _, e in failed}))
    print(f"job directories (logs/hpcserve-job.log): {tmp}/front/scale/")
    print(f"reproduce: .venv/bin/python bench/bench_renew.py {renewals}   (as root)")


if __name__ == "__main__":
    main()
