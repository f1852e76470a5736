"""A deployment inside an allocation the user holds: the node mapping (components on disjoint runs
of the allocation's nodes, in plan order), the fit check's numbers, what Slurm's record says the
allocation holds, and the step scripts rendered for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcserve import config, plan as planner
from hpcserve.plan_json import job_spec
from hpcserve.render import render_files
from hpcserve.runtime.allocation import Held, gpus_asked, held, misfit, node_map

ROOT = Path(__file__).resolve().parents[2]


def _spec(nodes: dict, gpus: int | None = None) -> dict:
    extra = [["gpus-per-node", str(gpus)]] if gpus else []
    return {"components": [{"index": i, "name": n, "nodes": k,
                            "directives": [["nodes", str(k)], *extra]}
                           for i, (n, k) in enumerate(nodes.items())]}


def test_components_take_disjoint_runs_in_plan_order():
    hosts = [f"n{i}" for i in range(1, 9)]
    got = node_map(_spec({"prefill": 2, "decode": 3, "router": 1}), hosts)
    assert got == {0: ["n1", "n2"], 1: ["n3", "n4", "n5"], 2: ["n6"]}
    every = [h for v in got.values() for h in v]
    assert len(every) == len(set(every))  # no node twice


def test_more_nodes_than_the_allocation_holds_cannot_be_mapped():
    with pytest.raises(ValueError, match="3 node"):
        node_map(_spec({"worker": 3}), ["n1", "n2"])


def test_too_few_nodes_named_with_the_numbers_per_role():
    why = misfit(_spec({"prefill": 1, "decode": 2}), Held("77", "RUNNING", ["a", "b"], None))
    assert why == "the deployment needs 3 node(s) (prefill 1, decode 2) and allocation 77 " \
                  "holds 2 (a,b)"


def test_too_few_gpus_per_node_named():
    spec = _spec({"prefill": 1, "decode": 1}, gpus=8)
    assert misfit(spec, Held("9", "RUNNING", ["a", "b"], 4)) == \
        "the deployment needs 8 GPU(s) per node (prefill 8, decode 8) and allocation 9 holds 4 " \
        "per node"
    assert misfit(spec, Held("9", "RUNNING", ["a", "b"], None)).endswith("holds 0 per node")
    assert misfit(spec, Held("9", "RUNNING", ["a", "b", "c"], 8)) is None


def test_gpus_asked_from_the_directives():
    assert gpus_asked({"directives": [["gres", "gpu:h100:4"]]}) == 4
    assert gpus_asked({"directives": [["gres", "nvme:1,gpu:2"]]}) == 2
    assert gpus_asked({"directives": [["gpus-per-node", "8"]]}) == 8
    assert gpus_asked({"directives": [["nodes", "2"]]}) == 0


def test_held_reads_nodes_and_gpus_from_slurm():
    record = ("JobId=41 JobName=held JobState=RUNNING NodeList=gpu[07-08] NumNodes=2 "
              "TRES=cpu=64,mem=500G,node=2,billing=64,gres/gpu=16")
    asked = []

    def ask(argv):
        asked.append(argv)
        return record if argv[1] == "-o" else "gpu07\ngpu08\n"

    assert held("41", ask) == Held("41", "RUNNING", ["gpu07", "gpu08"], 8)
    assert asked[1] == ["scontrol", "show", "hostnames", "gpu[07-08]"]


def test_a_het_allocation_is_refused():
    two = "JobId=5 NodeList=a NumNodes=1\nJobId=6 NodeList=b NumNodes=1\n"
    with pytest.raises(ValueError, match="heterogeneous"):
        held("5", lambda argv: two)


def test_steps_name_their_nodes_in_the_allocation_not_a_het_group():
    p = planner.in_allocation(planner.build(config.load(ROOT / "examples" / "demo.yaml")))
    files = render_files(p, "/jobs/demo")
    for name in ("discover-0", "discover-1", "prefill-0", "decode-0", "router"):
        text = files[f"steps/{name}.sh"][0]
        assert '--jobid="${SLURM_JOB_ID}"' in text and '--nodelist="${NODELIST}"' in text, name
        assert "--het-group" not in text, name
    sbatch = files["job.sbatch"][0]
    assert "#SBATCH" not in sbatch and "prefill 2, decode 2" in sbatch
    spec = job_spec(p, "/jobs/demo")
    assert spec["in_allocation"] is True and spec["requeue"] == 0
