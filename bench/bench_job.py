#!/usr/bin/env python3
"""Run-time benchmarks on the local Slurm cluster (needs root; starts and stops its own cluster):

    .venv/bin/python bench/bench_job.py [runs]

- orchestration overhead: the batch script's first line -> state `serving` (1P1D, simulated
  engines ready at once, the real sglang-router, a smoke request);
- scancel -> the job's last process gone on every node (engines exit on TERM);
- an engine's death (SIGKILL of a decode rank) -> the job's state terminal, and -> squeue empty;
- a hung decode leader (SIGSTOP) -> `failed` (hung), and a crashed node (SIGKILL of every
  process in its namespace, slurmd and slurmstepd included) -> `failed` (node lost), at the test
  settings liveness {interval: 0.5, timeout: 1, failures: 3}.
Medians of `runs` (default 5) jobs each.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpcserve.author import config, plan  # noqa: E402
from hpcserve.devcluster.cluster import DevCluster  # noqa: E402
from hpcserve.author.render import render_files, write_job  # noqa: E402

# decode's failures end the deployment (what the death, hang and crash figures measure):
# recovery, on by default, would start the instance again instead (bench_recovery.py measures that)
DEPLOY = """
name: bench-1p1d
site: local
model: {profile: kimi-k2-instruct, path: /models/k2, served_name: kimi-k2}
engine: {version: "0.5.23", simulate: true}
roles: {prefill: {nodes: 1}, decode: {nodes: %d, recovery: {restart: false}}}
readiness: {engine_timeout: 60, poll_interval: 0.05}
liveness: {interval: 0.5, timeout: 1, failures: 3, node_interval: 1}
"""


def job_pids(cluster: DevCluster) -> list[int]:
    daemons = set(cluster.recorded_pids().values())
    out = []
    for ns in cluster.netns_names().values():
        for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                text=True).stdout.split():
            pid = int(p)
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                zombie = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                continue
            if pid not in daemons and comm != "slurmd" and not zombie:
                out.append(pid)
    return out


def state(d: Path) -> dict:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def wait(pred, timeout: float, step: float = 0.01):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise SystemExit(f"timed out after {timeout}s")


def submit(cluster: DevCluster, env: dict, tmp: Path, decode_nodes: int, n: int) -> tuple[Path, str]:
    f = tmp / f"d{n}.yaml"
    f.write_text(DEPLOY % decode_nodes)
    p = plan.build(config.load(f))
    d = tmp / f"job{n}"
    write_job(render_files(p, str(d)), d)
    out = subprocess.run(["sbatch", "--parsable", str(d / "job.sbatch")], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    return d, out


def sim_pid(cluster: DevCluster, node: str) -> int:
    ns = cluster.netns_names()[node]
    return next(int(p) for p in subprocess.run(
        ["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        if b"hpcserve_sim.py" in Path(f"/proc/{p}/cmdline").read_bytes())


def decode_nodes(d: Path) -> list[str]:
    return [ln.split()[1] for ln in (d / "run" / "decode-0.nodes").read_text().splitlines()]


def terminal(d: Path) -> bool:
    return state(d).get("phase") in ("failed", "cancelled", "done")


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    # Simulated engines need no core of their own; pinned nodes would serialise the batch
    # host's orchestrator, router and engine on one core and measure that instead of hpcserve.
    cluster = DevCluster("/tmp/hpcserve-bench/cluster", nodes=4, subnet="10.253.7.0/24",
                         prefix="hsb", pin_cpus=False)
    cluster.down()
    cluster.up()
    env = cluster.client_env()
    env["PATH"] = str(Path(sys.executable).parent) + ":" + env["PATH"]
    overhead, cancel, death_state, death_gone, hang, crash = [], [], [], [], [], []
    try:
        with tempfile.TemporaryDirectory(dir="/tmp/hpcserve-bench") as t:
            tmp = Path(t)
            for i in range(runs):
                d, jid = submit(cluster, env, tmp, 1, 2 * i)
                st = wait(lambda: state(d) if state(d).get("phase") == "serving" else None, 60)
                overhead.append(st["serving_after_s"])
                t0 = time.time()
                subprocess.run(["scancel", jid], env=env, check=True)
                wait(lambda: not job_pids(cluster), 30)
                cancel.append(time.time() - t0)
                wait(lambda: not subprocess.run(["squeue", "-h", "-j", jid], env=env,
                                                capture_output=True, text=True).stdout.strip(), 30)

                d, jid = submit(cluster, env, tmp, 2, 2 * i + 1)
                wait(lambda: state(d).get("phase") == "serving", 60)
                pid = sim_pid(cluster, decode_nodes(d)[1])
                t0 = time.time()
                os.kill(pid, signal.SIGKILL)
                wait(lambda: terminal(d), 30)
                death_state.append(time.time() - t0)
                wait(lambda: not subprocess.run(["squeue", "-h", "-j", jid], env=env,
                                                capture_output=True, text=True).stdout.strip(), 30)
                death_gone.append(time.time() - t0)

                d, jid = submit(cluster, env, tmp, 2, 100 + i)
                wait(lambda: state(d).get("phase") == "serving", 60)
                t0 = time.time()
                os.kill(sim_pid(cluster, decode_nodes(d)[0]), signal.SIGSTOP)
                wait(lambda: terminal(d), 60)
                assert state(d)["failure"]["reason"] == "hung", state(d)
                hang.append(state(d)["history"][-1]["at"] - t0)
                wait(lambda: not job_pids(cluster), 60)

                d, jid = submit(cluster, env, tmp, 2, 200 + i)
                wait(lambda: state(d).get("phase") == "serving", 60)
                victim = decode_nodes(d)[1]
                t0 = time.time()
                cluster.crash_node(victim)
                try:
                    wait(lambda: terminal(d), 60)
                    assert state(d)["failure"]["reason"] == "node lost", state(d)
                    crash.append(state(d)["history"][-1]["at"] - t0)
                finally:
                    cluster.restart_node(victim)
    finally:
        cluster.down()

    def rep(label: str, xs: list[float], target: str) -> None:
        print(f"{label:62} median {statistics.median(xs):6.2f} s  min {min(xs):.2f}  "
              f"max {max(xs):.2f}  n={len(xs)}  (target {target})")
    rep("batch script first line -> serving (1P1D, orchestration)", overhead, "< 1.5 s")
    rep("scancel -> last job process gone on every node", cancel, "< 2 s")
    rep("decode engine SIGKILL -> state.json terminal", death_state, "< 5 s")
    rep("decode engine SIGKILL -> job gone from squeue", death_gone, "-")
    rep("decode leader SIGSTOP -> state.json failed (hung)", hang, "< 10 s")
    rep("decode node crash -> state.json failed (node lost)", crash, "< 10 s")


if __name__ == "__main__":
    main()
