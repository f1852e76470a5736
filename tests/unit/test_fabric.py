"""Placement that follows the NVLink fabric (site.fabric): the directive each het-job component
gets (--segment under topology/block, --switches under topology/tree), the layouts refused at
plan time, and what the plan hands the preflight. The preflight's fabric check itself is in
tests/unit/test_fabric_preflight.py; the directive on the real Slurm in tests/jobs/test_fabric_placement.py.
"""

from __future__ import annotations

import json

import pytest

from hpcserve.author import config, plan
from hpcserve.errors import ConfigError
from unitkit import EXAMPLES, render, sbatch_components, sbatch_options, write_yaml


def gb200(roles: dict, **fabric) -> dict:
    """Kimi-K2 on the bundled GB200 NVL72 site (4 GPUs a node, 18 nodes a domain)."""
    site = {"base": "gb200-nvl72"}
    if fabric:
        site["fabric"] = fabric
    return {"name": "k2-gb200", "site": site,
            "model": {"profile": "kimi-k2-instruct", "path": "/lustre/models/Kimi-K2-Instruct"},
            "engine": {"name": "sglang", "version": "0.5.23"}, "roles": roles}


PD = {"prefill": {"instances": 2, "nodes": 4}, "decode": {"instances": 1, "nodes": 12}}


def components(tmp_path, doc: dict) -> list[dict]:
    """job.sbatch's components as sbatch reads them: option -> value."""
    f = write_yaml(tmp_path / "d.yaml", doc)
    text = render(f, "/jobs/k2")["job.sbatch"][0]
    return [dict(sbatch_options(words)) for words in sbatch_components(text)]


def test_topology_block_asks_each_component_for_segments_of_one_instance(tmp_path):
    comps = components(tmp_path, gb200(PD))
    assert [(c["nodes"], c.get("segment")) for c in comps] == [("8", "4"), ("12", "12")]
    for c in comps:  # sbatch(1) --segment: the node count is a multiple of the segment size
        assert int(c["nodes"]) % int(c["segment"]) == 0 and "switches" not in c


def test_topology_tree_asks_for_one_leaf_switch_where_the_component_fits_one_domain(tmp_path):
    roles = {"prefill": {"instances": 2, "nodes": 4}, "decode": {"instances": 2, "nodes": 12}}
    doc = gb200(roles, topology="tree", slurm_version="22.05")
    comps = components(tmp_path, doc)
    assert [(c["nodes"], c.get("switches")) for c in comps] == [("8", "1"), ("24", None)]
    assert not any("segment" in c for c in comps)
    p = plan.build(config.load(write_yaml(tmp_path / "t.yaml", doc)))
    note = next(n for n in p.notes if n.startswith("decode: its 24 nodes"))
    assert "more than one NVLink domain of 18" in note and "preflight" in note


def test_topology_none_and_one_node_instances_get_no_directive(tmp_path):
    comps = components(tmp_path, gb200(PD, topology="none"))
    assert not any({"segment", "switches"} & set(c) for c in comps)
    one = {"prefill": {"instances": 2, "gpus": 2}, "decode": {"instances": 1, "nodes": 1}}
    comps = components(tmp_path, {**gb200(one), "model": {"profile": "tiny-llama",
                                                           "path": "/m"}})
    assert not any({"segment", "switches"} & set(c) for c in comps)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_no_fabric_declared_no_placement_directive_and_no_fabric_check(example):
    p = plan.build(config.load(example))
    assert not any(k in ("segment", "switches") for c in p.components for k, _ in c.directives)
    assert p.preflight["fabric"] is None


def test_the_plan_hands_the_preflight_its_domain_size_unless_the_check_is_off(tmp_path):
    p = plan.build(config.load(write_yaml(tmp_path / "d.yaml", gb200(PD))))
    assert p.preflight["fabric"] == {"domain_nodes": 18}
    p = plan.build(config.load(write_yaml(tmp_path / "d.yaml", gb200(PD, check=False))))
    assert p.preflight["fabric"] is None


def _refusal(tmp_path, doc: dict) -> ConfigError:
    f = write_yaml(tmp_path / "d.yaml", doc)
    with pytest.raises(ConfigError) as e:
        plan.build(config.load(f))
    return e.value


def test_an_instance_larger_than_a_domain_is_refused_with_the_numbers(tmp_path):
    e = _refusal(tmp_path, gb200({"prefill": {"nodes": 4}, "decode": {"nodes": 24}}))
    assert (e.field, e.message) == ("roles.decode.nodes", "an instance of 24 nodes does not fit "
                                    "one NVLink domain of 18 nodes "
                                    "(site.fabric.nvlink_domain_nodes)")
    assert e.file.endswith("d.yaml") and e.line is not None


def test_spares_that_break_the_segments_are_refused(tmp_path):
    e = _refusal(tmp_path, gb200({"prefill": {"nodes": 4, "spares": 1}, "decode": {"nodes": 4}}))
    assert e.field == "roles.prefill.spares"
    assert "segments of 4" in e.message and "its 5 nodes must be a multiple of 4" in e.message
    comps = components(tmp_path, gb200({"prefill": {"nodes": 4, "spares": 4},
                                        "decode": {"nodes": 4}}))
    assert (comps[0]["nodes"], comps[0]["segment"]) == ("8", "4")


def test_topology_block_on_a_slurm_without_segment_is_refused(tmp_path):
    e = _refusal(tmp_path, gb200(PD, slurm_version="23.11"))
    assert e.field == "site.fabric.slurm_version"
    assert "Slurm 24.05 added; this site runs 23.11" in e.message


def test_the_schema_documents_the_fabric(tmp_path):
    site = config.schemas()["site"]
    fab = site["$defs"]["Fabric"]
    assert fab["required"] == ["nvlink_domain_nodes", "topology"]
    assert fab["properties"]["topology"]["enum"] == ["block", "tree", "none"]
    assert json.dumps(site).count("--segment") >= 1
