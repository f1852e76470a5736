"""Placement that follows the fabric, on the real test cluster (Slurm 22.05): --switches per het
component under topology/tree, recorded by slurmctld and acted on, and the preflight refusing an
instance whose nodes report two NVLink fabrics (the nvidia-smi stand-in, configured per node).

Slurm 22.05 has neither topology/block nor --segment (added in 24.05): tests/unit/test_fabric.py
checks that directive against sbatch(1)'s documented syntax instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from jobkit import deployment, until, wait_no_job_processes

pytestmark = pytest.mark.slurm

RACKS = {"rack1": "node[1-2]", "rack2": "node[3-4]"}
STAND_IN = Path(__file__).resolve().parents[1] / "fakes" / "nvidia_smi.py"
UUID_A = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
UUID_B = "dc6e40c4-d722-4357-9ba6-5291dd461278"


def fabric_site(topology: str, check: bool = False) -> dict:
    return {"base": "local", "fabric": {"nvlink_domain_nodes": 2, "topology": topology,
                                        "slurm_version": "22.05", "check": check}}


def workers(name: str, roles: dict, **over) -> dict:
    d = deployment(name=name, **over)
    d["roles"] = roles
    return d


@pytest.fixture
def tree_topology(dev_cluster) -> Iterator[None]:
    """topology/tree over two leaf switches of two nodes (an NVLink domain each, as a site
    without topology/block describes its racks), taken away again after the test."""
    dev_cluster.set_topology(RACKS)
    try:
        yield
    finally:
        dev_cluster.set_topology(None)


def show_job(env: dict, job_id: str) -> list[dict]:
    """`scontrol show job`'s records (one per het component) as key -> value."""
    out = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True,
                         text=True, timeout=30).stdout
    return [dict(re.findall(r"(\w+)=(\S*)", rec)) for rec in out.split("\n\n") if "JobId=" in rec]


def test_switches_is_asked_per_het_component_and_slurm_records_it(
        submit, dev_cluster, tree_topology):
    dep = deployment(name="t-fabric-tree", prefill_nodes=2, decode_nodes=2,
                     site=fabric_site("tree"))
    job = submit(dep)
    comps = (job.dir / "job.sbatch").read_text().split("#SBATCH hetjob")
    assert len(comps) == 2 and all(c.count("#SBATCH --switches=1\n") == 1 for c in comps)
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    recs = {r["HetJobOffset"]: r for r in show_job(job.env, job.id)}
    assert sorted(recs) == ["0", "1"], recs
    for r in recs.values():  # the wait is max_switch_wait's default (300 s)
        assert r["Switches"].startswith("1@"), r
    assert sorted(recs[o]["NodeList"] for o in "01") == ["node[1-2]", "node[3-4]"]
    job.scancel()
    job.wait({"cancelled", "failed", "done"}, 60)
    job.squeue_gone()
    wait_no_job_processes(dev_cluster, 30)


def _drain(env: dict, nodes: str, state: str, check: bool = True) -> None:
    extra = ["Reason=hpcserve fabric test"] if state == "DRAIN" else []
    subprocess.run(["scontrol", "update", f"NodeName={nodes}", f"State={state}", *extra],
                   env=env, check=check, capture_output=True, timeout=30)


def test_switches_holds_a_role_off_two_switches_until_one_switch_has_room(
        submit, dev_cluster, tree_topology):
    """node2 and node4 drained: node1 and node3 are free but under two leaf switches. A role of
    two nodes without the fabric runs on them; with it, it waits, and runs on node3 and node4
    once node4 is back."""
    env = dev_cluster.client_env()
    _drain(env, "node2,node4", "DRAIN")
    try:
        plain = submit(workers("t-fabric-plain", {"worker": {"nodes": 2}}))
        rec = until("the plain job running", lambda: next(
            (r for r in show_job(env, plain.id) if r["JobState"] == "RUNNING"), None), 60)
        assert rec["NodeList"] == "node[1,3]", rec
        plain.scancel()
        plain.squeue_gone(60)
        job = submit(workers("t-fabric-held", {"worker": {"nodes": 2}},
                             site=fabric_site("tree")))
        rec = until("the scheduler's verdict on the fabric job", lambda: next(
            (r for r in show_job(env, job.id) if r["Reason"] != "None"), None), 60)
        assert rec["JobState"] == "PENDING" and rec["Switches"].startswith("1@"), rec
        idle = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], env=env,
                              capture_output=True, text=True, timeout=30).stdout.split()
        assert {"node1", "node3"} <= set(idle), idle  # free, and not taken: the directive
        _drain(env, "node4", "RESUME")  # rack2 whole again; rack1 still has node2 drained
        rec = until("the fabric job running", lambda: next(
            (r for r in show_job(env, job.id) if r["JobState"] == "RUNNING"), None), 60)
        assert rec["NodeList"] == "node[3-4]", rec
    finally:
        for node in ("node2", "node4"):
            _drain(env, node, "RESUME", check=False)  # node4 may be resumed already
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    job.scancel()
    job.wait({"cancelled", "failed", "done"}, 60)
    job.squeue_gone()
    wait_no_job_processes(dev_cluster, 30)


def test_an_instance_over_two_nvlink_fabrics_is_refused_by_the_preflight_naming_the_node(
        submit, dev_cluster, tmp_path, site_python):
    """worker-0 on node1-2 and worker-1 on node3-4; node4's GPUs report another ClusterUUID."""
    conf = tmp_path / "nvidia-smi.json"
    conf.write_text(json.dumps({"gpus": 4, "nodes": {
        "node1": {"cluster_uuid": UUID_A}, "node2": {"cluster_uuid": UUID_A},
        "node3": {"cluster_uuid": UUID_A}, "node4": {"cluster_uuid": UUID_B}}}))
    bindir = tmp_path / "bin"  # nvidia-smi alone: tests/fakes/bin also has a stand-in srun
    bindir.mkdir()
    # a copy of the stand-in, on the site's python: the job's user may reach neither the
    # checkout nor the venv's python
    shutil.copy(STAND_IN, bindir / "nvidia_smi.py")
    (bindir / "nvidia-smi").write_text(f'#!/bin/sh\nexec {site_python}/bin/python3 '
                                       f'{bindir}/nvidia_smi.py "$@"\n')
    (bindir / "nvidia-smi").chmod(0o755)
    dep = workers("t-fabric-mixed", {"worker": {"nodes": 2, "instances": 2}},
                  site=fabric_site("none", check=True))
    path = f"{bindir}:{site_python}/bin:{os.environ['PATH']}"
    job = submit(dep, extra_env={"PATH": path, "HPCSERVE_FAKE_NVIDIA_SMI": str(conf)})
    st = job.wait({"failed", "serving", "cancelled"}, 60)
    f = st["failure"]
    assert st["phase"] == "failed" and f["reason"] == "preflight failed", st
    assert (f["check"], f["node"], f["role"], f["instance"]) == ("fabric", "node4", "worker", 1)
    assert f["detail"] == (f"worker-1 spans two NVLink domains: node4 is in ClusterUUID {UUID_B} "
                           f"CliqueId 1, its leader node3 in ClusterUUID {UUID_A} CliqueId 1")
    table = st["preflight"]["nodes"]
    assert [table[n]["fabric"] for n in ("node1", "node2", "node3")] == [
        ["ok", f"4 GPUs in ClusterUUID {UUID_A} CliqueId 1"]] * 3
    assert "fabric" in st["preflight"]["checks"]
    logs = {p.name for p in (job.dir / "logs").iterdir()}
    assert not [n for n in logs if n.startswith(("worker-", "router"))], sorted(logs)
    wait_no_job_processes(dev_cluster, 30)
