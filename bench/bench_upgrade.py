#!/usr/bin/env python3
"""Rolling upgrades of a serving deployment with `hpcserve upgrade`, under steady load, on the
local Slurm cluster (needs root; starts and stops its own cluster):

    .venv/bin/python bench/bench_upgrade.py [upgrades]

The front job: a plain deployment of 2 worker instances of one node each, simulated SGLang
0.5.22 ready at once (sim_startup_delay 0; 0.01 s per decode token), the real sglang-router,
readiness.poll_interval 0.1 and liveness at the test settings. 4 client threads send 8-token
chat requests through its router all along. Each upgrade (default 4) moves every serving
instance to the other release (0.5.22 -> 0.5.23 -> 0.5.22 ...): the first replaces the front's
own instances, the later ones the instance jobs the one before started. Each upgrade is timed
as a whole `hpcserve upgrade` process; the requests that failed while it ran are counted, and
after it every worker the router lists must report the new release (GET /get_server_info).
The job directories stay under /tmp/hpcserve-bench-upgrade/run for their logs.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench_job import wait  # bench/ is sys.path[0]; it puts the checkout on it
from bench_recovery import _DIRECT, Load, machine
from bench_scale import DEPLOY, cli, fresh, squeue_gone, start_front, started, workers

BASE = Path("/tmp/hpcserve-bench-upgrade")
RELEASES = ("0.5.22", "0.5.23")
WORKERS = 2
CLIENTS = 4


def deployment() -> str:
    """bench_scale's deployment, as WORKERS plain instances at the first release."""
    d = DEPLOY.replace("name: bench-scale", "name: bench-upgrade")
    d = d.replace('version: "0.5.23"', f'version: "{RELEASES[0]}"')
    return d.replace("roles: {prefill: {nodes: 1}, decode: {nodes: 1}}",
                     f"roles: {{worker: {{nodes: 1, instances: {WORKERS}}}}}")


def release_of(url: str, auth: dict) -> str:
    """The engine's release, asked of the engine itself (it wants the deployment's key too)."""
    with _DIRECT.open(urllib.request.Request(url + "/get_server_info", headers=auth),
                      timeout=5) as r:
        return json.load(r)["version"]


def one(env: dict, front: str, router: str, auth: dict, to: str, load: Load) -> dict:
    n0 = len(load.results)
    t0, t1, out = cli(env, "upgrade", front, "--set", f"engine.version={to}",
                      "--drain-timeout", "30", "--start-timeout", "60")
    during = [r for r in load.results[n0:] if r[0] <= t1]
    listed = workers(router, auth) or []
    got = {u: release_of(u, auth) for u in listed}
    if len(got) != WORKERS or set(got.values()) != {to}:
        raise SystemExit(f"after the upgrade to {to} the router lists {got}\n{out}")
    return {"total": t1 - t0, "per_instance": (t1 - t0) / WORKERS, "sent": len(during),
            "failed": sum(1 for r in during if r[2] is not None)}


def main() -> None:
    upgrades = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print("machine:", machine())
    cluster, tmp = fresh(BASE, "10.253.11.0/24", "hsu")
    out: list[dict] = []
    try:
        env = started(cluster, tmp)
        front, router, auth = start_front(env, tmp, deployment())
        with Load(router, CLIENTS, auth) as load:
            time.sleep(1)  # steady load before the first upgrade
            for i in range(upgrades):
                r = one(env, front, router, auth, RELEASES[(i + 1) % 2], load)
                out.append(r)
                print(f"upgrade {i + 1} to {RELEASES[(i + 1) % 2]}: " +
                      ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
        failed = [x for x in load.results if x[2] is not None]
        subprocess.run(["hpcserve", "cancel", front, "--wait"], env=env, capture_output=True)
        wait(lambda: squeue_gone(env, front), 60)
    finally:
        cluster.down()
    tot = [r["total"] for r in out]
    print(f"\n`hpcserve upgrade` of {WORKERS} instances, {upgrades} upgrades: median "
          f"{statistics.median(tot):.2f} s (min {min(tot):.2f}, max {max(tot):.2f}), "
          f"{statistics.median(r['per_instance'] for r in out):.2f} s per instance")
    print(f"requests through the router during the upgrades: {sum(r['sent'] for r in out)}, "
          f"failed: {sum(r['failed'] for r in out)} (all along: {len(load.results)}, failed "
          f"{len(failed)})")
    if failed:
        print("errors:", sorted({e[:100] for _, _, e in failed}))
    print(f"reproduce: .venv/bin/python bench/bench_upgrade.py {upgrades}   (as root)")


if __name__ == "__main__":
    main()
