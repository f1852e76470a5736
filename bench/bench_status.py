#!/usr/bin/env python3
"""`hpcserve status` with 200 deployments in the queue (needs root; starts its own cluster):

    .venv/bin/python bench/bench_status.py

200 held het jobs are submitted to the local Slurm cluster and recorded in a private deployment
index, each with a job directory and state.json. Reported: the median wall time of a whole
`hpcserve status` process over 7 runs, how many times it ran squeue (counted by a wrapper on
PATH), and the start-up time of `hpcserve status` with an empty index.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from hpcserve.devcluster.cluster import DevCluster  # noqa: E402

HPCSERVE = str(Path(sys.executable).parent / "hpcserve")
N = 200


def timed(argv, env, runs=7):
    xs = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        xs.append(time.perf_counter() - t0)
    return xs


def main() -> None:
    cluster = DevCluster("/tmp/hpcserve-bench/cluster", nodes=4, subnet="10.253.7.0/24",
                         prefix="hsb")
    cluster.down()
    cluster.up()
    try:
        with tempfile.TemporaryDirectory(dir="/tmp/hpcserve-bench") as t:
            tmp = Path(t)
            env = cluster.client_env()
            env["HPCSERVE_STATE_DIR"] = str(tmp / "state")
            (tmp / "bin").mkdir()
            calls = tmp / "squeue-calls"
            real = subprocess.run(["which", "squeue"], capture_output=True, text=True).stdout.strip()
            (tmp / "bin" / "squeue").write_text(f"#!/bin/sh\necho x >> {calls}\nexec {real} \"$@\"\n")
            os.chmod(tmp / "bin" / "squeue", 0o755)
            env["PATH"] = f"{tmp / 'bin'}:{env['PATH']}"
            script = tmp / "job.sbatch"
            script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH hetjob\n#SBATCH --nodes=1\nsleep 600\n")
            index = []
            for i in range(N):
                jid = subprocess.run(["sbatch", "--parsable", "--hold", "-J", f"dep{i}", str(script)],
                                     env=env, check=True, capture_output=True, text=True).stdout.strip()
                d = tmp / "jobs" / f"dep{i}"
                d.mkdir(parents=True)
                (d / "state.json").write_text(json.dumps({"phase": "pending", "history": []}))
                index.append({"job_id": jid, "name": f"dep{i}", "job_dir": str(d), "remote": None,
                              "submitted_at": time.time()})
            (tmp / "state").mkdir()
            empty = dict(env, HPCSERVE_STATE_DIR=str(tmp / "empty"))
            startup = timed([HPCSERVE, "status"], empty)
            (tmp / "state" / "deployments.jsonl").write_text(
                "".join(json.dumps(e) + "\n" for e in index))
            calls.write_text("")
            full = timed([HPCSERVE, "status"], env)
            n_calls = len(calls.read_text().split()) / len(full)
            lines = subprocess.run([HPCSERVE, "status"], env=env, capture_output=True,
                                   text=True).stdout.count("\n")
            subprocess.run(["scancel", *[e["job_id"] for e in index]], env=env)
    finally:
        cluster.down()
    print(f"{'hpcserve status, 200 deployments in the queue':58} median "
          f"{statistics.median(full):6.3f} s  min {min(full):.3f}  max {max(full):.3f}  n={len(full)}"
          f"  squeue calls per run: {n_calls:g}  rows: {lines - 1}  (target < 0.5 s, 1 call)")
    print(f"{'hpcserve status, start-up (empty index)':58} median "
          f"{statistics.median(startup):6.3f} s  min {min(startup):.3f}  max {max(startup):.3f}"
          f"  n={len(startup)}  (target < 0.3 s)")


if __name__ == "__main__":
    main()
