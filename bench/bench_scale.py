#!/usr/bin/env python3
"""Scale-out and scale-in of a serving deployment with `hpcserve scale`, on the local Slurm
cluster (needs root; starts and stops its own cluster):

    .venv/bin/python bench/bench_scale.py [runs]

The front job: PD, 1 prefill and 1 decode instance of one node each, simulated SGLang 0.5.23
ready at once (sim_startup_delay 0; 0.01 s per decode token), the real sglang-router in PD mode,
readiness.poll_interval 0.1 and liveness at the test settings. 4 client threads send 8-token chat
requests through its router all along. Each run (default 5):

1. `hpcserve scale FRONT --role decode --add 1`, timed as a whole process from its start (t0).
   sbatch is reached through a shim on PATH that notes when it starts and returns. The instance
   job's batch script notes its own first line (HPCSERVE_BATCH_T0, its state.json started_at);
   its job log has the runtime's phases. Watched from this host every 10 ms: the router lists
   the new decode (GET /workers), and the new engine's own log shows its first request (a POST
   line). Slurm's own record (`scontrol show job`: SubmitTime -> StartTime, 1 s resolution) is
   reported beside.
2. `hpcserve scale FRONT --role decode --remove 1 --drain-timeout 30 --wait`, timed from its
   start: the router no longer lists the decode, state.json says it is removed, the CLI returns,
   the instance job has left squeue.
Slurm's share is sbatch returned -> the batch script's first line (scheduling, the batch step's
launch); hpcserve's is the rest of t0 -> the first request on the new engine. hpcserve's
bytecode is compiled first and PYTHONDONTWRITEBYTECODE dropped, as for an installed hpcserve.
The job directories stay under /tmp/hpcserve-bench-scale/run for their logs.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from bench_job import state, wait  # bench/ is sys.path[0]; it puts the checkout on it
from bench_recovery import _DIRECT, Load, api_headers, machine

from hpcserve.devcluster.cluster import DevCluster  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BASE = Path("/tmp/hpcserve-bench-scale")
HPCSERVE = str(Path(sys.executable).parent / "hpcserve")
DEPLOY = """
name: bench-scale
site: local
model: {profile: kimi-k2-instruct, path: /models/k2, served_name: kimi-k2}
engine: {version: "0.5.23", simulate: true, sim_startup_delay: 0, sim_decode_s_per_token: 0.01}
time_limit: "01:00:00"
roles: {prefill: {nodes: 1}, decode: {nodes: 1}}
readiness: {engine_timeout: 60, router_timeout: 30, poll_interval: 0.1}
liveness: {interval: 0.5, timeout: 1, failures: 3, node_interval: 1}
"""
CLIENTS = 4
# state.json startup.phases of an instance job, in order (runtime/startup.py)
PHASES = ("job_setup", "preflight", "engine_load", "engine_warmup", "smoke_request",
          "router_registration")
# sbatch as hpcserve reaches it (PATH), with its start and return noted (date +%s.%N)
SHIM = """#!/bin/sh
echo "start $(date +%s.%N)" >> {log}
{real} "$@"
rc=$?
echo "end $(date +%s.%N)" >> {log}
exit $rc
"""


def workers(router: str, auth: dict) -> list[str] | None:
    try:
        with _DIRECT.open(urllib.request.Request(router + "/workers", headers=auth),
                          timeout=1) as r:
            return [w["url"] for w in json.load(r)["workers"]]
    except Exception:  # no answer this time: cannot tell
        return None


def first_post(job_dir: Path) -> bool:
    """Whether the instance's engine log (logs/decode-0.node0.<host>.log) shows a request."""
    for p in (job_dir / "logs").glob("decode-0.node0.*.log"):
        if '"POST ' in p.read_text(errors="replace"):
            return True
    return False


class Poll(threading.Thread):
    """Every 10 ms, from its start: when each of `conds` (name -> callable) first held; each
    only once the one before it held."""

    def __init__(self, conds: dict, timeout: float = 90):
        super().__init__(daemon=True)
        self.conds, self.at, self.timeout = conds, {}, timeout
        self.start()

    def run(self) -> None:
        names = list(self.conds)
        end = time.time() + self.timeout
        while len(self.at) < len(names) and time.time() < end:
            name = names[len(self.at)]
            if self.conds[name]():
                self.at[name] = time.time()
                continue
            time.sleep(0.01)


def cli(env: dict, *args: str) -> tuple[float, float, str]:
    """(start, end, stdout) of `hpcserve ARGS` as a whole process; exit 0 required."""
    t0 = time.time()
    r = subprocess.run([HPCSERVE, *args], env=env, capture_output=True, text=True, timeout=120)
    t1 = time.time()
    if r.returncode:
        raise SystemExit(f"hpcserve {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return t0, t1, r.stdout


def sbatch_times(log: Path) -> tuple[float, float]:
    """The last sbatch's start and return, as the shim noted them."""
    rows = dict(ln.split() for ln in log.read_text().splitlines()[-2:])
    return float(rows["start"]), float(rows["end"])


def slurm_record(env: dict, jid: str) -> float:
    """SubmitTime -> StartTime of job `jid` as Slurm recorded them (whole seconds)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", jid], env=env, check=True,
                         capture_output=True, text=True).stdout
    t = dict(re.findall(r"(SubmitTime|StartTime)=(\S+)", out))
    return (datetime.fromisoformat(t["StartTime"]) -
            datetime.fromisoformat(t["SubmitTime"])).total_seconds()


def squeue_gone(env: dict, jid: str) -> bool:
    return not subprocess.run(["squeue", "-h", "-j", jid], env=env, capture_output=True,
                              text=True).stdout.strip()


def scale_out(env: dict, front: str, router: str, auth: dict,
              shim_log: Path) -> tuple[dict, Path, str]:
    before = set(workers(router, auth) or ())
    new = {}

    def listed() -> bool:
        urls = set(workers(router, auth) or ()) - before
        new["url"] = next(iter(urls), None)
        return bool(urls)
    job = {}
    poll = Poll({"listed": listed, "request": lambda: "dir" in job and first_post(job["dir"])})
    t0, t_cli, out = cli(env, "scale", front, "--role", "decode", "--add", "1")
    m = re.search(r"submitted job (\d+).*\njob directory: (\S+)", out)
    jid, job["dir"] = m.group(1), Path(m.group(2))
    d = job["dir"]
    poll.join()
    if len(poll.at) < 2:
        raise SystemExit(f"not seen within {poll.timeout}s: {poll.at}\n{log_text(d)}")
    s0, s1 = sbatch_times(shim_log)
    st = wait(lambda: state(d) if state(d).get("phase") == "serving" else None, 30)
    if new["url"] != worker_url(d):
        raise SystemExit(f"the router listed {new['url']}, not the instance job's decode "
                         f"{worker_url(d)}")
    tb = st["started_at"]  # the batch script's first line (HPCSERVE_BATCH_T0)
    up = st["startup"]  # the job's own start-up phases, from tb to serving
    w = poll.at
    r = {"total": w["request"] - t0,
         "cli_to_sbatch": s0 - t0, "sbatch": s1 - s0, "cli_after_sbatch": t_cli - s1,
         "slurm": tb - s1, "slurm_record": slurm_record(env, jid),
         "runtime": st["runtime_at"] - tb,
         **{k: up["phases"].get(k, 0.0) for k in PHASES}, "unknown": up["unknown_s"],
         "listed": w["listed"] - (tb + up["total_s"]),
         "request": w["request"] - (tb + up["total_s"])}
    r["hpcserve"] = r["total"] - r["slurm"]
    r["job"] = w["request"] - tb
    return r, d, jid


def scale_in(env: dict, front: str, router: str, auth: dict, inst: Path, jid: str) -> dict:
    url = worker_url(inst)
    poll = Poll({"out": lambda: url not in (workers(router, auth) or [url]),
                 "removed": lambda: state(inst).get("instances", {}).get("decode-0", {})
                 .get("status") == "removed"})
    t0, t_cli, _ = cli(env, "scale", front, "--role", "decode", "--remove", "1",
                       "--drain-timeout", "30", "--wait")
    poll.join()
    wait(lambda: squeue_gone(env, jid), 60)
    t_gone = time.time()
    return {"rm_out": poll.at["out"] - t0, "rm_removed": poll.at["removed"] - t0,
            "rm_cli": t_cli - t0, "rm_gone": t_gone - t0}


def worker_url(inst: Path) -> str:
    """The instance job's decode as the router lists it (its node's address, its port)."""
    addr = (inst / "run" / "decode-0.nodes").read_text().split()[2]
    port = json.loads((inst / "plan.json").read_text())["instances"][0]["port"]
    return f"http://{addr}:{port}"


def log_text(d: Path) -> str:
    p = d / "logs" / "hpcserve-job.log"
    return p.read_text(errors="replace") if p.exists() else "(no job log)"


def start_front(env: dict, tmp: Path, deploy: str = DEPLOY) -> tuple[str, str, dict]:
    """(job id, endpoint, its API key's header) of the front job of `deploy`, once it
    serves."""
    f = tmp / "deploy.yaml"
    f.write_text(deploy)
    _, _, out = cli(env, "submit", str(f), "-o", str(tmp / "front"))
    jid = re.search(r"submitted job (\d+)", out).group(1)
    st = wait(lambda: state(tmp / "front") if state(tmp / "front").get("phase") in (
        "serving", "failed") else None, 60)
    if st["phase"] != "serving":
        raise SystemExit(f"the front job failed:\n{log_text(tmp / 'front')}")
    return jid, st["endpoint"], api_headers(tmp / "front")


def shimmed(env: dict, tmp: Path) -> Path:
    """A PATH directory whose sbatch notes its start and return in tmp/sbatch.times."""
    real = subprocess.run(["sh", "-c", "command -v sbatch"], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()
    shim_dir = tmp / "shim"
    shim_dir.mkdir()
    log = tmp / "sbatch.times"
    (shim_dir / "sbatch").write_text(SHIM.format(log=log, real=real))
    (shim_dir / "sbatch").chmod(0o755)
    env["PATH"] = f"{shim_dir}:{env['PATH']}"
    return log


def report(out: list[dict], runs: int, failed: int, sent: int) -> None:
    def row(label: str, k: str, note: str = "") -> None:
        xs = [r[k] for r in out]
        print(f"{label:66} median {statistics.median(xs):6.3f} s  min {min(xs):6.3f}  "
              f"max {max(xs):6.3f}  {note}")
    print(f"\nscale-out: `hpcserve scale --role decode --add 1`, {runs} runs:")
    row("t0 -> first request on the new engine (total)", "total")
    row("  Slurm's share: sbatch returned -> batch script's first line", "slurm")
    row("  hpcserve's share (the rest)", "hpcserve", "(target <= 2 s)")
    row("    CLI start -> sbatch called (resolve, rebuild, render, write)", "cli_to_sbatch")
    row("    sbatch (the submission to slurmctld)", "sbatch")
    row("    the job, from its batch script's first line (state.json startup):", "job")
    for k in PHASES:
        row(f"      {k}", k)
        if k == "job_setup":
            row("        of which the batch script -> the runtime's start (runtime_at)", "runtime")
    row("      (not in a phase)", "unknown")
    row("      serving -> first request in its engine's log (from here)", "request")
    row("  (the router lists it (GET /workers, from here), from serving)", "listed")
    row("  (the CLI's exit after sbatch returned: not on the path)", "cli_after_sbatch")
    row("  Slurm's record: SubmitTime -> StartTime (1 s resolution)", "slurm_record")
    print(f"\nscale-in: `hpcserve scale --role decode --remove 1 --wait`, {runs} runs:")
    row("start -> the router no longer lists it", "rm_out")
    row("start -> state.json: removed", "rm_removed")
    row("start -> the CLI returned (--wait polls every 0.5 s)", "rm_cli")
    row("start -> the instance job left squeue", "rm_gone")
    print(f"\nrequests through the router during the runs: {sent}, failed: {failed}")


def fresh(base: Path, subnet: str, prefix: str) -> tuple[DevCluster, Path]:
    """A 4-node local cluster (not started yet) under base/cluster, and an empty base/run.
    Unpinned as bench_job.py: pinned nodes would serialise the batch host's runtime, the router
    and an engine on one core and measure that instead of hpcserve."""
    cluster = DevCluster(str(base / "cluster"), nodes=4, subnet=subnet, prefix=prefix,
                         pin_cpus=False)
    cluster.down()
    subprocess.run(["rm", "-rf", str(base / "run")])
    tmp = base / "run"
    tmp.mkdir(parents=True)
    return cluster, tmp


def started(cluster: DevCluster, tmp: Path) -> dict:
    """The cluster up, and the environment the hpcserve commands run in: as installed,
    hpcserve's bytecode compiled (as pip does), and the jobs' runtime may write its own (a
    checkout run under PYTHONDONTWRITEBYTECODE compiles every module of every process again);
    this checkout's hpcserve on PATH, an index of its own under tmp/state."""
    cluster.up()
    env = cluster.client_env()
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "hpcserve")],
                   check=True)
    env["PATH"] = str(Path(sys.executable).parent) + ":" + env["PATH"]
    env["HPCSERVE_STATE_DIR"] = str(tmp / "state")
    return env


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    # SIGTERM (timeout, kill) ends through the `finally` below: the cluster comes down
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("machine:", machine())
    cluster, tmp = fresh(BASE, "10.253.10.0/24", "hsc")
    out: list[dict] = []
    try:
        env = started(cluster, tmp)
        shim_log = shimmed(env, tmp)
        front, router, auth = start_front(env, tmp)
        with Load(router, CLIENTS, auth) as load:
            time.sleep(1)  # steady load before the first run
            for i in range(runs):
                r, inst, jid = scale_out(env, front, router, auth, shim_log)
                r.update(scale_in(env, front, router, auth, inst, jid))
                out.append(r)
                print(f"run {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()),
                      flush=True)
        failed = [x for x in load.results if x[2] is not None]
        subprocess.run(["scancel", front], env=env)
        wait(lambda: squeue_gone(env, front), 60)
    finally:
        cluster.down()
    report(out, runs, len(failed), len(load.results))
    if failed:
        print("errors:", sorted({e[:100] for _, _, e in failed}))
    print(f"job directories (logs/hpcserve-job.log): {tmp}/front and {tmp}/front/scale/")
    print(f"reproduce: .venv/bin/python bench/bench_scale.py {runs}   (as root)")


if __name__ == "__main__":
    main()
