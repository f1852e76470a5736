"""Two deployments on the same non-exclusive nodes (the local site shares nodes): the second
must never pass its readiness or smoke request against the first's engines or router. With the
same ports its preflight (or, with that check waived, its engines' own port check) stops it
with the clash named (port, node, and the process that holds it, of the first job), and the
first keeps serving untouched."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from hpcserve.runtime.contract import API_KEY_FILE
from jobkit import Job, chat, deployment, hand_over, owners_env, owners_jobs

pytestmark = pytest.mark.slurm


def _pin(nodes: list[str]):
    """An edit for the submit fixture: component k of the het job on nodes[k]."""
    def edit(job_dir):
        p = job_dir / "job.sbatch"
        text, k = p.read_text(), iter(nodes)
        p.write_text(re.sub(r"(?m)^#SBATCH --nodes=1$",
                            lambda m: f"{m.group()}\n#SBATCH --nodelist={next(k)}", text))
    return edit


def test_a_second_deployment_on_the_same_nodes_never_answers_from_the_first(submit):
    first = submit(deployment(1, 1, name="t-share-a"))
    st = first.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", first.logs()
    a_nodes = [first.node_rows("prefill-0")[0][1], first.node_rows("decode-0")[0][1]]
    # Its preflight finds the first's ports taken, before any engine of its own starts.
    second = submit(deployment(1, 1, name="t-share-b"), edit=_pin(a_nodes))
    st2 = second.wait({"serving", "failed", "cancelled"}, 60)
    f = st2["failure"]
    assert st2["phase"] == "failed" and (f["reason"], f["check"]) == ("preflight failed",
                                                                      "ports"), st2
    assert sorted(st2["preflight"]["nodes"]) == sorted(a_nodes)
    assert f["node"] in a_nodes and "in use" in f["detail"], f
    assert f"of Slurm job {first.id}" in f["detail"], f  # the holder, named with its job
    # With that check waived (or a port taken between the preflight and the engine's bind), the
    # engines' own port check stops it, with the holder named the same way.
    third = submit(deployment(1, 1, name="t-share-c", preflight={"waive": ["ports"]}),
                   edit=_pin(a_nodes))
    st3 = third.wait({"serving", "failed", "cancelled"}, 60)
    assert [third.node_rows("prefill-0")[0][1], third.node_rows("decode-0")[0][1]] == a_nodes
    f = st3["failure"]
    assert st3["phase"] == "failed" and f["reason"] == "port taken", st3
    inst = f"{f['role']}-{f['instance']}"
    node = a_nodes[0] if f["role"] in ("prefill", "router") else a_nodes[1]
    assert f["node"] == node and f["port"] in (30000, 8998, 5757, 8000, 29000), f
    assert f"of Slurm job {first.id}" in f["holder"], f
    assert st3["reason"].startswith(f"port {f['port']} on node {node} is taken by "), st3["reason"]
    assert inst in st3["reason"]
    assert "engines_ready" not in [h["phase"] for h in st3["history"]]
    # the first deployment lost nothing: still serving, through its own router and engines
    assert first.state()["phase"] == "serving"
    out = chat(first.state()["endpoint"], 3, key=first.key)
    assert out["usage"]["completion_tokens"] == 3


def _key(job_dir: Path) -> str:
    return (job_dir / API_KEY_FILE).read_text().strip()


def _requests(job_dir: Path) -> int:
    """Chat requests the job's own engine logged."""
    return sum(p.read_text(errors="replace").count('"POST /v1/chat/completions"')
               for p in (job_dir / "logs").glob("worker-0.node*.log"))


def test_two_of_my_deployments_on_one_shared_node_both_serve_each_from_its_own_engine(
        dev_cluster, tmp_path, owners_hpcserve, site_python):
    """The same file submitted twice by its user (`hpcserve submit`, run by the jobs' user)."""
    env = owners_env(dev_cluster, tmp_path, site_python)
    jobs_dir = owners_jobs(dev_cluster) / f"shared-{time.time_ns()}"
    dep = deployment(name="t-share", jobs_dir=str(jobs_dir),
                     site={"base": "local", "paths": {"python": f"{site_python}/bin/python3"},
                           "slurm": {"extra_directives": {"nodelist": "node3"}}})
    dep["roles"] = {"worker": {"nodes": 1}}
    del dep["router"]  # no router port in the file: hpcserve may choose it
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(dep))
    hand_over(tmp_path)
    warned: list[str] = []
    subs: list[Job] = []
    try:
        for _ in range(2):
            r = subprocess.run([*owners_hpcserve, "submit", str(f)], env=env, cwd="/",
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (r.stdout, r.stderr)
            m = re.search(r"submitted job (\d+).*\njob directory: (\S+)", r.stdout)
            subs.append(Job(dev_cluster, Path(m.group(2)), m.group(1), env))
            warned += re.findall(r"(?m)^hpcserve: warning: (.*)$", r.stderr)
            st = subs[-1].wait({"serving", "failed", "cancelled"}, 60)
            assert st["phase"] == "serving", subs[-1].logs()
        a, b = (s.state() for s in subs)
        # the second moved clear of the first: its own engine and router ports on node3
        # (both also hear that Kimi-K2 TP8 is a tight fit: fewer KV tokens than its context)
        assert [w for w in warned if "tight fit" not in w] == [
            "ports moved by +20 (those the file does not set), clear of your other deployments "
            "on these shared nodes"]
        assert a["endpoint"].endswith(":8000") and b["endpoint"].endswith(":8020")
        assert a["health_urls"]["worker-0"].endswith(":30000/health")
        assert b["health_urls"]["worker-0"].endswith(":30020/health")
        # a request through each endpoint reaches that job's engine and no other
        da, db = subs[0].dir, subs[1].dir
        before = (_requests(da), _requests(db))
        assert chat(b["endpoint"], 2, key=_key(db))["usage"]["completion_tokens"] == 2
        assert (_requests(da), _requests(db)) == (before[0], before[1] + 1)
        assert chat(a["endpoint"], 2, key=_key(da))["usage"]["completion_tokens"] == 2
        assert (_requests(da), _requests(db)) == (before[0] + 1, before[1] + 1)
    finally:
        for s in subs:
            subprocess.run(["scancel", s.id], env=env)
        for s in subs:
            s.squeue_gone(60)
