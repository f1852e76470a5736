"""Job ids repeat: two test clusters brought up one after the other both start at job 1. The
deployment index keys each submission by its cluster (Slurm's ClusterName) and submit time, so
`hpcserve status 1` is refused with both deployments listed, each is reached by its job
directory's name, and the first one's record never borrows the second one's Slurm state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpcserve.devcluster.cluster import DevCluster

pytestmark = pytest.mark.slurm
HPCSERVE = str(Path(sys.executable).parent / "hpcserve")


def _deployment(jobs: Path) -> dict:
    return {"name": "ids", "site": "local", "jobs_dir": str(jobs),
            "model": {"profile": "kimi-k2-instruct", "path": "/models/Kimi-K2-Instruct",
                      "served_name": "kimi-k2"},
            "engine": {"name": "sglang", "version": "0.5.23", "simulate": True},
            "time_limit": "00:10:00", "roles": {"worker": {"nodes": 1}},
            "router": {"port": 8000},
            "readiness": {"engine_timeout": 60, "router_timeout": 30, "poll_interval": 0.1}}


def test_a_job_id_two_clusters_gave_out_names_neither_alone(devcluster_slot, devcluster_subnet,
                                                             tmp_path):
    k = devcluster_slot
    dep = tmp_path / "ids.yaml"
    dep.write_text(yaml.safe_dump(_deployment(tmp_path / "jobs")))
    submitted = []
    for name, octet in (("a", 253), ("b", 254)):
        cluster = DevCluster(f"/tmp/hpcserve-pytest-{k}/ids-{name}", nodes=2,
                             subnet=devcluster_subnet(octet), prefix=f"hi{name}{k}")
        cluster.down()  # an earlier, killed session's
        env = {**cluster.client_env(), "HPCSERVE_STATE_DIR": str(tmp_path / "state"),
               "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]}

        def hs(*args, env=env):
            return subprocess.run([HPCSERVE, *args], env=env, capture_output=True, text=True,
                                  timeout=180)

        cluster.up()
        try:
            out = hs("submit", str(dep), "--wait")
            assert out.returncode == 0, out.stdout + out.stderr
            job = out.stdout.split("submitted job ")[1].split(":")[0]
            job_dir = out.stdout.split("job directory: ")[1].split()[0]
            submitted.append((job, Path(job_dir).name))
            if name == "a":
                assert hs("cancel", job, "--wait").returncode == 0
                continue
            # cluster b: the same job id as a's, which is gone with its cluster
            assert submitted[0][0] == job, submitted
            refused = hs("status", job)
            assert refused.returncode == 2, refused.stdout + refused.stderr
            line = refused.stderr.strip()
            assert line.startswith(f"hpcserve: error: job {job} names 2 deployments: ")
            assert "\n" not in line
            for (_, handle), c in zip(submitted, ("a", "b")):
                assert f"{handle} (cluster devhi{c}{k}br0 from this host" in line, line
            views = {v["job_dir"].rsplit("/", 1)[1]: v for v in
                     json.loads(hs("status", "--json").stdout)}
            first, second = views[submitted[0][1]], views[submitted[1][1]]
            assert (first["phase"], first.get("slurm_state")) == ("cancelled", None), first
            assert (second["phase"], second["slurm_state"]) == ("serving", "RUNNING"), second
            one = hs("status", submitted[1][1], "--json")
            assert json.loads(one.stdout)[0]["phase"] == "serving", one.stdout + one.stderr
            done = hs("cancel", submitted[1][1], "--wait")
            assert done.returncode == 0 and done.stdout.strip().endswith("cancelled"), done.stdout
        finally:
            cluster.down()
