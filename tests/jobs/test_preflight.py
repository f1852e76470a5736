"""The preflight on the real test cluster: every node checks itself in the discovery step, before
any engine starts, and the job ends in seconds naming node and check.

Nodes of the test cluster share one file system; a node with files of its own (a node-local disk
that differs) is made by restarting its slurmd in a private mount namespace with a bind mount
(DevCluster.restart_node(binds=...)): the job's tasks on that node, and only there, see it.
"""

from __future__ import annotations

import json
import pwd
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from jobkit import (OWNER, deployment, hand_over, owners_env, owners_jobs,
                    wait_no_job_processes)

pytestmark = pytest.mark.slurm

FOUR_NODES = {"worker": {"nodes": 2, "instances": 2}}   # worker-0: node1-2, worker-1: node3-4


def workers(name: str, roles: dict, **over) -> dict:
    d = deployment(name=name, **over)
    d["roles"] = roles
    return d


@contextmanager
def node_sees(cluster, node: str, binds: dict[str, str]) -> Iterator[None]:
    """`node` sees each target path as its source (target -> source) while inside."""
    cluster.crash_node(node)  # only its slurmd runs there between tests
    try:
        cluster.restart_node(node, binds=binds)
        yield
    finally:
        cluster.crash_node(node)
        cluster.restart_node(node)


@pytest.fixture
def model_dirs(dev_cluster) -> Iterator[tuple[Path, Path]]:
    """A model directory on the shared file system and a copy that lacks one shard."""
    root = Path(dev_cluster.state_dir).parent / "preflight-models" / str(time.time_ns())
    full, partial = root / "full", root / "partial"
    for d in (full, partial):
        d.mkdir(parents=True)
        (d / "config.json").write_text('{"model_type": "kimi_k2"}')
        (d / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 4096)
    (full / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 4096)
    yield full, partial
    shutil.rmtree(root)


def _model_job(submit, full: Path, **over):
    return submit(workers("t-preflight-model", FOUR_NODES, model={"path": str(full)}, **over))


def _ended_in_seconds(st: dict) -> float:
    took = st["finished_at"] - st["started_at"]
    assert took < 15, f"the job took {took:.1f} s to end"
    return took


def _no_engine_started(job) -> None:
    logs = {p.name for p in (job.dir / "logs").iterdir()}
    assert not [n for n in logs if n.startswith(("worker-", "router"))], sorted(logs)


def test_a_node_missing_a_model_file_stops_the_job_before_engines_start(
        submit, dev_cluster, model_dirs):
    full, partial = model_dirs
    with node_sees(dev_cluster, "node3", {str(full): str(partial)}):
        job = _model_job(submit, full)
        st = job.wait({"failed", "serving", "cancelled"}, 60)
        job.squeue_gone()  # before node3's slurmd is restarted: never mid-job
    f = st["failure"]
    assert st["phase"] == "failed" and f["reason"] == "preflight failed", st
    assert (f["check"], f["node"], f["role"], f["instance"]) == ("model", "node3", "worker", 1)
    assert "missing model-00002-of-00002.safetensors" in f["detail"]
    assert "3 other node(s)" in f["detail"]
    table = st["preflight"]["nodes"]
    assert table["node3"]["model"][0] == "fail"
    assert {n: table[n]["model"][0] for n in ("node1", "node2", "node4")} == dict.fromkeys(
        ("node1", "node2", "node4"), "ok")
    assert table["node1"]["model"][1] == "3 files, 0.0 GB"
    _ended_in_seconds(st)
    _no_engine_started(job)
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    assert "node3 model (FAIL): missing model-00002-of-00002.safetensors" in log
    wait_no_job_processes(dev_cluster, 30)


def test_a_waived_check_is_reported_and_the_job_goes_on(submit, dev_cluster, model_dirs):
    full, partial = model_dirs
    with node_sees(dev_cluster, "node3", {str(full): str(partial)}):
        job = _model_job(submit, full, preflight={"waive": ["model"]})
        st = job.wait({"failed", "serving", "cancelled"}, 60)
        try:
            assert st["phase"] == "serving", job.logs()
            model = {n: v["model"][0] for n, v in st["preflight"]["nodes"].items()}
            assert model == {"node1": "ok", "node2": "ok", "node3": "waived", "node4": "ok"}
            assert st["preflight"]["passed"] and st["preflight"]["waived"] == ["model"]
        finally:
            job.scancel()
            job.wait({"cancelled", "failed", "done"}, 60)
            job.squeue_gone()
    wait_no_job_processes(dev_cluster, 30)


@contextmanager
def listener_on(cluster, node: str, port: int, user: str = "root") -> Iterator[int]:
    """A process of `user`'s listening on `port` in `node`'s network namespace (ended by its
    PID: nsenter sets the user and execs, so the listener is the process it started)."""
    ns = cluster.netns_names()[node]
    pw = pwd.getpwnam(user)
    # SO_REUSEADDR, as the engines bind: an earlier test's engine on this port leaves
    # connections in TIME_WAIT, which fail a plain bind() but are not a listener
    code = ("import socket, sys, time\ns = socket.socket()\n"
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('0.0.0.0', int(sys.argv[1])))"
            "\ns.listen()\nprint('listening', flush=True)\ntime.sleep(600)")
    p = subprocess.Popen(["nsenter", f"--net=/run/netns/{ns}", f"--setuid={pw.pw_uid}",
                          f"--setgid={pw.pw_gid}", "/usr/bin/python3", "-c", code, str(port)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
    try:
        line = p.stdout.readline().strip()
        assert line == "listening", f"no listener on {node}:{port}: {p.stderr.read()[-500:]}"
        yield p.pid
    finally:
        p.kill()
        p.wait(10)


@pytest.mark.parametrize("holder", [OWNER, "hpcserve-b"])
def test_a_port_taken_on_one_node_stops_the_job_naming_node_and_port(submit, dev_cluster,
                                                                     holder):
    """Held by a process of the job's own user (named, from /proc) or of another user (whose
    processes /proc does not show it: named as such)."""
    dep = workers("t-preflight-port", {"worker": {"nodes": 2}})
    with listener_on(dev_cluster, "node2", 30000, holder) as pid:
        job = submit(dep)
        st = job.wait({"failed", "serving", "cancelled"}, 60)
    f = st["failure"]
    assert st["phase"] == "failed" and (f["check"], f["node"]) == ("ports", "node2"), st
    assert "30000 (worker-0 http)" in f["detail"] and "in use" in f["detail"]
    who = f"process {pid} (" if holder == OWNER else "another user's process"
    assert f"in use by {who}" in f["detail"], f
    assert st["preflight"]["nodes"]["node1"]["ports"][0] == "ok"
    _ended_in_seconds(st)
    _no_engine_started(job)
    wait_no_job_processes(dev_cluster, 30)


def test_an_absent_container_image_stops_the_job_on_every_node(submit, dev_cluster, tmp_path):
    image = tmp_path / "absent" / "sglang-0.5.23.sif"
    # the test cluster has no apptainer: that check is waived to show the image's
    dep = workers("t-preflight-image", {"worker": {"nodes": 2}},
                  site={"base": "local", "container": {"runtime": "apptainer",
                                                       "image": str(image)}},
                  preflight={"waive": ["tools"]})
    job = submit(dep)
    st = job.wait({"failed", "serving", "cancelled"}, 60)
    f = st["failure"]
    assert st["phase"] == "failed" and f["check"] == "image", st
    assert f["detail"] == f"image {image} is not there on this node"
    table = st["preflight"]["nodes"]
    assert sorted(table) == ["node1", "node2"]
    assert all(v["image"][0] == "fail" for v in table.values())
    assert all(v["tools"] == ["waived", "not found on this node: apptainer"]
               for v in table.values())
    assert [c for _n, c, _d in f["failed"]] == ["image", "image"]
    _ended_in_seconds(st)
    _no_engine_started(job)


def test_a_too_old_python_on_one_node_is_named_before_engines_start(submit, dev_cluster,
                                                                     site_python):
    root = Path(dev_cluster.state_dir).parent / "preflight-python" / str(time.time_ns())
    root.mkdir(parents=True)
    py = root / "python3"
    py.write_text(f'#!/bin/sh\nexec {site_python}/bin/python3 "$@"\n')
    # RHEL 8's /usr/bin/python3 as the runtime sees it: 3.6 answers -V and fails the rest
    old = root / "python3.6"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && echo 'Python 3.6.8' && exit 0\nexit 1\n")
    for p in (py, old):
        p.chmod(0o755)
    dep = workers("t-preflight-python", {"worker": {"nodes": 2}},
                  site={"base": "local", "paths": {"python": str(py)}})
    try:
        with node_sees(dev_cluster, "node2", {str(py): str(old)}):
            job = submit(dep)
            st = job.wait({"failed", "serving", "cancelled"}, 60)
            job.squeue_gone()
    finally:
        shutil.rmtree(root)
    f = st["failure"]
    assert st["phase"] == "failed" and (f["check"], f["node"]) == ("python", "node2"), st
    assert f["detail"].startswith("Python 3.6.8: hpcserve_runtime needs Python 3.7 or later")
    assert st["preflight"]["nodes"]["node1"]["python"][0] == "ok"
    _ended_in_seconds(st)
    _no_engine_started(job)
    wait_no_job_processes(dev_cluster, 30)


def test_hpcserve_preflight_runs_the_checks_as_a_job_of_their_own(dev_cluster, tmp_path,
                                                                   owners_hpcserve, site_python):
    """`hpcserve preflight`, run by the jobs' user, submits the checks as a job of theirs."""
    env = owners_env(dev_cluster, tmp_path, site_python)
    dep = workers("t-preflight-cli", {"worker": {"nodes": 3}},
                  jobs_dir=str(owners_jobs(dev_cluster)),
                  site={"base": "local", "paths": {"python": f"{site_python}/bin/python3"}})
    f = tmp_path / "dep.yaml"
    f.write_text(json.dumps(dep))
    hand_over(tmp_path)
    with listener_on(dev_cluster, "node3", 8000):  # the router's port, on a node it does not use
        p = subprocess.run([*owners_hpcserve, "preflight", str(f)], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, (p.stdout, p.stderr)
    rows = [ln.split() for ln in p.stdout.splitlines()]
    assert rows[0][:3] == ["node", "python", "tools"]
    assert [r[0] for r in rows[1:]] == ["node1", "node2", "node3"]
    assert all(r[1] == "ok" for r in rows[1:])
    assert "done: preflight passed on 3 node(s)" in p.stderr
    job_dir = Path(p.stderr.split("submitted preflight job ")[1].split(": ")[1].split()[0])
    st = json.loads((job_dir / "state.json").read_text())
    assert st["phase"] == "done" and st["preflight"]["passed"]
    assert "#SBATCH --time=00:10:00" in (job_dir / "job.sbatch").read_text()
    assert not (job_dir / "logs" / "worker-0.srun.log").exists()  # no engine ran
    # the same deployment with the router's port taken where the router runs: exit 1
    with listener_on(dev_cluster, "node1", 8000):
        p = subprocess.run([*owners_hpcserve, "preflight", str(f), "--json"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, (p.stdout, p.stderr)
    result = json.loads(p.stdout)
    assert result["failed"][0][:2] == ["node1", "ports"]
    assert "8000 (router)" in result["failed"][0][2]
    wait_no_job_processes(dev_cluster, 30)
