"""Weight staging (model.stage) on the real test cluster, 4 nodes.

Nodes of the test cluster share one file system; each node gets a node-local stage directory of
its own by restarting its slurmd in a private mount namespace with a bind mount (as
test_preflight.py does). Nodes 2-4 also see a decoy at the model's shared path (same names and
sizes, other bytes): a node other than the reader that read the shared path itself would write
the decoy's bytes and fail the manifest, so every node's copy matching the model proves the
shared path was read by node1 alone; node1's count of the bytes it read says it read each once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jobkit import (OWNER, chown_tree, deployment, hand_over, owners_env, owners_jobs,
                    until, wait_no_job_processes)

pytestmark = pytest.mark.slurm

FILES = {"config.json": b'{"model_type": "kimi_k2"}',
         "model-00001-of-00002.safetensors": os.urandom(3 << 20),
         "model-00002-of-00002.safetensors": os.urandom(2 << 20) + b"tail",
         "tokenizer/tokenizer.json": b'{"v": 1}'}


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def layout(dev_cluster):
    """(model dir, the stage_dir path, {node: where that node's stage dir really is})."""
    root = Path(dev_cluster.state_dir).parent / "stage-test" / str(time.time_ns())
    model, decoy, stage_dir = root / "model", root / "decoy", root / "stage-dir"
    for d, zero in ((model, False), (decoy, True)):
        for rel, data in FILES.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_bytes(b"\0" * len(data) if zero else data)
        chown_tree(d)   # the user's own model (its manifest is written beside it)
    stage_dir.mkdir()
    local = {"node1": stage_dir}
    for n in ("node2", "node3", "node4"):
        local[n] = root / "local" / n
        local[n].mkdir(parents=True)
    for d in local.values():
        d.chmod(0o1777)   # a site's stage directory, where every user makes their own part
    for n in ("node2", "node3", "node4"):
        dev_cluster.crash_node(n)
        dev_cluster.restart_node(n, binds={str(stage_dir): str(local[n]), str(model): str(decoy)})
    try:
        yield model, stage_dir, local
    finally:
        for n in ("node2", "node3", "node4"):
            dev_cluster.crash_node(n)
            dev_cluster.restart_node(n)
        shutil.rmtree(root)


def _dep(name: str, model: Path, stage_dir: Path, roles: dict, **over) -> dict:
    site = over.pop("site", {})
    paths = {"stage_dir": str(stage_dir), "stage_max_gb": 1, **site.pop("paths", {})}
    d = deployment(name=name, model={"path": str(model), "stage": True},
                   site={"base": "local", "paths": paths, **site}, **over)
    d["roles"] = roles
    return d


def _copy_matches(copy: Path) -> None:
    for rel, data in FILES.items():
        assert _sha(copy / rel) == hashlib.sha256(data).hexdigest(), (copy, rel)


def test_staging_reads_the_shared_path_once_checks_every_copy_and_skips_warm_nodes(
        submit, dev_cluster, layout, tmp_path, owners_hpcserve, site_python):
    model, stage_dir, local = layout
    dep = _dep("t-stage", model, stage_dir, {"worker": {"nodes": 2, "instances": 2}})
    job = submit(dep)
    st = job.wait({"serving", "failed"}, timeout=90)
    assert st["phase"] == "serving", job.logs()
    rec = st["stage"]
    staged = Path(rec["path"])
    total = sum(len(d) for d in FILES.values())
    # one reader, every file read once by it; every node's copy is the model's, not the decoy's
    assert rec["reader"] == "node1" and rec["shared_bytes_read"] == total == rec["model_bytes"]
    assert {n: r["outcome"] for n, r in rec["nodes"].items()} == {
        n: "copied" for n in ("node1", "node2", "node3", "node4")}
    assert [r["read_shared"] for r in rec["nodes"].values()] == [total, 0, 0, 0]
    manifest = json.loads((model / ".hpcserve-manifest.json").read_text())
    assert {f[0]: f[2] for f in manifest["files"]} == {
        rel: hashlib.sha256(d).hexdigest() for rel, d in FILES.items()}
    # in the user's own part of each node's stage directory
    assert staged.parent == stage_dir / OWNER, staged
    for n, d in local.items():
        _copy_matches(d / staged.relative_to(stage_dir))
    # the engines were given the staged path; the job log times the step
    assert f"--model-path {staged} " in (job.dir / "launch" / "worker-0.sh").read_text()
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    assert "stage: start" in log and "stage: end" in log
    # the start-up counts the staging as a phase of its own, between the preflight and the engines
    # (written just after the phase turns serving)
    startup = job.wait_until(lambda s: s.get("startup"), timeout=10)["startup"]
    phases = list(startup["phases"])
    assert phases.index("preflight") < phases.index("staging") < phases.index("engine_load"), phases
    assert startup["phases"]["staging"] > 0
    job.scancel()
    job.wait({"cancelled", "done"}, timeout=60)

    # A corrupted file on the shared path, node1's copy gone: node1 reads (and refuses) it, the
    # other nodes are warm and skip; no engine starts.
    shard = "model-00001-of-00002.safetensors"
    data = bytearray(FILES[shard])
    data[100] ^= 0xFF
    (model / shard).write_bytes(bytes(data))
    shutil.rmtree(staged)
    (staged.parent / (staged.name + ".done")).unlink()
    job = submit(dep)
    st = job.wait({"failed", "serving"}, timeout=90)
    f = st["failure"]
    assert st["phase"] == "failed" and f["node"] == "node1" and f["file"] == shard, st
    assert "differs from the manifest" in f["detail"] and "shared path" in f["detail"]
    assert {n: r["outcome"] for n, r in st["stage"]["nodes"].items()} == {
        "node1": "failed", "node2": "warm", "node3": "warm", "node4": "warm"}
    assert not [p for p in (job.dir / "logs").iterdir() if p.name.startswith("worker-")]
    assert not staged.exists()
    (model / shard).write_bytes(FILES[shard])

    # Two `hpcserve stage` jobs staging to node1 at once: while this test holds node1's lock,
    # both say they are busy; once it is free, one copies and the other takes its copy.
    env = owners_env(dev_cluster, tmp_path, site_python)
    jobs_dir = owners_jobs(dev_cluster) / f"stage-{time.time_ns()}"
    procs = {}
    try:
        _two_jobs_at_once(procs, owners_hpcserve, env, jobs_dir, model, stage_dir, staged,
                          tmp_path, site_python)
    finally:  # jobs the CLI submitted are not the submit fixture's to cancel
        for name in procs:
            subprocess.run(["scancel", "--name", name], env=env, capture_output=True)
    wait_no_job_processes(dev_cluster, 30)


def _two_jobs_at_once(procs, hs, env, jobs_dir, model, stage_dir, staged, tmp_path,
                      site_python):
    with open(staged.parent / (staged.name + ".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        for name in ("t-stage-a", "t-stage-b"):
            d = _dep(name, model, stage_dir, {"worker": {"nodes": 1}}, jobs_dir=str(jobs_dir),
                     site={"slurm": {"extra_directives": {"nodelist": "node1"}},
                           "paths": {"python": f"{site_python}/bin/python3"}})
            f = tmp_path / f"{name}.yaml"
            f.write_text(json.dumps(d))
            hand_over(tmp_path)
            json_out = ["--json"] if name == "t-stage-a" else []   # b prints its table
            procs[name] = subprocess.Popen([*hs, "stage", str(f), *json_out], env=env, cwd="/",
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)

        def busy():
            return [p for p in jobs_dir.glob("*-stage-*/run/stage/status/node1")
                    if p.read_text().split() == ["busy"]]
        until("both jobs waiting on node1's stage lock", lambda: len(busy()) == 2, 60,
              why=lambda: "\n".join(str(p) for p in jobs_dir.glob("*/logs/*")))
    outs = {n: p.communicate(timeout=90) for n, p in procs.items()}
    assert all(p.returncode == 0 for p in procs.values()), outs
    head, row = outs["t-stage-b"][0].splitlines()   # the table: a header and node1's row
    assert head.split()[:2] == ["node", "outcome"] and row.split()[0] == "node1", outs
    got = sorted([json.loads(outs["t-stage-a"][0])["nodes"]["node1"]["outcome"], row.split()[1]])
    assert got == ["copied", "waited"], outs
    _copy_matches(staged)
