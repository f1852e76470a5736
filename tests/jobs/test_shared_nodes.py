"""Two deployments on the same non-exclusive nodes (the local site shares nodes): the second
must never pass its readiness or smoke request against the first's engines or router. With the
same ports it fails with the clash named (port, node, and the process that holds it, of the
first job), and the first keeps serving untouched."""

from __future__ import annotations

import re

import pytest

from jobkit import chat, deployment

pytestmark = pytest.mark.slurm


def _pin(nodes: list[str]):
    """An edit for the submit fixture: component k of the het job on nodes[k]."""
    def edit(job_dir):
        p = job_dir / "job.sbatch"
        text, k = p.read_text(), iter(nodes)
        p.write_text(re.sub(r"(?m)^#SBATCH --nodes=1$",
                            lambda m: f"{m.group()}\n#SBATCH --nodelist={next(k)}", text))
    return edit


def _nodes(job, inst: str) -> list[str]:
    return [ln.split()[1] for ln in (job.dir / "run" / f"{inst}.nodes").read_text().splitlines()]


def test_a_second_deployment_on_the_same_nodes_never_answers_from_the_first(submit):
    first = submit(deployment(1, 1, name="t-share-a"))
    st = first.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", first.logs()
    a_nodes = [_nodes(first, "prefill-0")[0], _nodes(first, "decode-0")[0]]
    second = submit(deployment(1, 1, name="t-share-b"), edit=_pin(a_nodes))
    st2 = second.wait({"serving", "failed", "cancelled"}, 60)
    assert [_nodes(second, "prefill-0")[0], _nodes(second, "decode-0")[0]] == a_nodes
    f = st2["failure"]
    assert st2["phase"] == "failed" and f["reason"] == "port taken", st2
    inst = f"{f['role']}-{f['instance']}"
    node = a_nodes[0] if f["role"] in ("prefill", "router") else a_nodes[1]
    assert f["node"] == node and f["port"] in (30000, 8998, 5757, 8000, 29000), f
    # the holder is the first deployment's process, named with its job
    assert f"of Slurm job {first.id}" in f["holder"], f
    assert st2["reason"].startswith(f"port {f['port']} on node {node} is taken by "), st2["reason"]
    assert inst in st2["reason"]
    assert "engines_ready" not in [h["phase"] for h in st2["history"]]
    # the first deployment lost nothing: still serving, through its own router and engines
    assert first.state()["phase"] == "serving"
    out = chat(first.state()["endpoint"], 3)
    assert out["usage"]["completion_tokens"] == 3
