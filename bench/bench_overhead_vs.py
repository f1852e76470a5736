#!/usr/bin/env python3
"""The orchestration overhead, this checkout against another revision, in one run (needs root;
starts and stops its own local Slurm cluster):

    .venv/bin/python bench/bench_overhead_vs.py REV [RUNS]

The overhead is bench_job.py's: the batch script's first line -> state `serving` (1P1D,
simulated engines ready at once, the real sglang-router, a smoke request), as state.json's
`serving_after_s` says. Each side renders the same deployment with its own hpcserve (the
revision checked out into a temporary git worktree, first on PYTHONPATH) and submits it to the
same cluster, alternating job by job so that the machine's load falls on both alike. Prints each
side's median and where the time goes (medians of the job's own phases), and the ratio.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path

from revision import ROOT, checkout, hpcserve

sys.path.insert(0, str(ROOT))

from bench_job import DEPLOY, job_pids, state, wait  # noqa: E402
from hpcserve.devcluster.cluster import DevCluster  # noqa: E402

# (label, how to find its time in seconds after the batch script's first line from state.json,
# the job's log and its directory)
PHASES = (("runtime started", lambda st, log, d: _phase(st, "starting")),
          ("nodes found, engines started", lambda st, log, d: _logged(log, "started ")),
          ("engines ready", lambda st, log, d: _phase(st, "engines_ready")),
          ("router's script started (its log made)",
           lambda st, log, d: _born(st, d / "logs" / "router.log")),
          ("router listens (its port verdict)",
           lambda st, log, d: _born(st, d / "run" / "ports" / "router")),
          ("router ready", lambda st, log, d: _phase(st, "router_ready")),
          ("serving", lambda st, log, d: st["serving_after_s"]))


def _phase(st: dict, name: str) -> float:
    return next(h["at"] for h in st["history"] if h["phase"] == name) - st["started_at"]


def _born(st: dict, path: Path) -> float:
    """When the file was made (its birth time), seconds after the first line."""
    out = subprocess.run(["stat", "-c", "%.3W", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return float(out) - st["started_at"]


def _logged(log: str, text: str) -> float:
    return float(re.search(r"\+\s*([\d.]+)s\] " + re.escape(text), log).group(1))


def run_once(root: Path, cluster: DevCluster, env: dict, d: Path) -> dict:
    """One job rendered by the hpcserve at `root`: its phases, seconds after the first line."""
    f = d.with_suffix(".yaml")
    f.write_text(DEPLOY % 1)
    hpcserve(root, "render", str(f), "--out", str(d), stdout=subprocess.DEVNULL)
    jid = subprocess.run(["sbatch", "--parsable", str(d / "job.sbatch")], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    st = wait(lambda: state(d) if state(d).get("phase") == "serving" else None, 60)
    log = (d / "logs" / "hpcserve-job.log").read_text()
    subprocess.run(["scancel", jid], env=env, check=True)
    wait(lambda: not job_pids(cluster), 30)
    wait(lambda: not subprocess.run(["squeue", "-h", "-j", jid], env=env, capture_output=True,
                                    text=True).stdout.strip(), 30)
    return {label: at(st, log, d) for label, at in PHASES}


def main() -> None:
    rev, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
    cluster = DevCluster("/tmp/hpcserve-bench/cluster-vs", nodes=4, subnet="10.253.6.0/24",
                         prefix="hsv", pin_cpus=False)  # as bench_job.py, which says why
    cluster.down()
    cluster.up()
    env = cluster.client_env()
    env["PATH"] = str(Path(sys.executable).parent) + ":" + env["PATH"]
    n = iter(range(10_000))
    results: dict[str, list[dict]] = {rev: [], "this checkout": []}
    try:
        with checkout(rev) as (base, tmp):
            for _ in range(runs):
                for side, root in ((rev, base), ("this checkout", ROOT)):
                    results[side].append(run_once(root, cluster, env, tmp / f"job{next(n)}"))
    finally:
        cluster.down()
    print(f"{'seconds after the first line (median)':40}" + "".join(f"{s:>16}" for s in results))
    for label, _ in PHASES:
        print(f"{label:40}" + "".join(f"{statistics.median(r[label] for r in rs):16.3f}"
                                      for rs in results.values()))
    med = {s: statistics.median(r["serving"] for r in rs) for s, rs in results.items()}
    print(f"serving: {rev} {sorted(r['serving'] for r in results[rev])}\n"
          f"         this checkout {sorted(r['serving'] for r in results['this checkout'])}\n"
          f"ratio (this checkout / {rev}): {med['this checkout'] / med[rev]:.2f}  "
          f"(bound kept by issue 36: this checkout well under 1.5 s)\n"
          f"reproduce: .venv/bin/python bench/bench_overhead_vs.py {rev} {runs}")


if __name__ == "__main__":
    main()
