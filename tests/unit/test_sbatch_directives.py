"""job.sbatch read back the way sbatch reads it: per het-job component, the options it asks for.

sbatch takes `#SBATCH` lines only up to the first line that is neither blank nor a comment,
`#SBATCH hetjob` separates components, and each line is split into words by sbatch's own
quote rules (unitkit.sbatch_components is a port of src/sbatch/opt.c get_argument()).
"""

from __future__ import annotations


import pytest

from unitkit import (EXAMPLES, SbatchParseError, load_plan, render, sbatch_components,
                     sbatch_options, small_pd, write_yaml)


def _components(text: str) -> list[dict[str, list]]:
    out = []
    for words in sbatch_components(text):
        opts: dict[str, list] = {}
        for k, v in sbatch_options(words):
            opts.setdefault(k, []).append(v)
        out.append(opts)
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_components_ask_for_the_configured_resources(example):
    from hpcserve.author import config
    cfg = config.load(example)
    slurm, dep = cfg.site.slurm, cfg.deployment
    plan = load_plan(example)
    job_dir = f"/jobs/{example.stem}"
    text = render(example, job_dir)["job.sbatch"][0]
    comps = _components(text)
    assert len(comps) == len(plan.components) >= 1
    # a role at instances: 0 (its autoscale slots hold it all) has no component in the front
    roles = [r for r in ("prefill", "decode", "worker")
             if r in dep.roles and dep.roles[r].instances]
    for i, opts in enumerate(comps):
        for k, vs in opts.items():
            assert len(vs) == 1, f"component {i}: --{k} given {len(vs)} times"
        if i < len(roles):
            r = dep.roles[roles[i]]
            want_nodes = r.instances * r.nodes if r.gpus is None else \
                -(-r.instances // (cfg.site.node.gpus // r.gpus))
            assert opts["nodes"] == [str(want_nodes)], f"component {i} ({roles[i]})"
        assert opts.get("partition") == ([slurm.partition] if slurm.partition else None)
        assert opts["time"] == [dep.time_limit]
        # one task per node; one per GPU for an engine of MPI ranks (TensorRT-LLM)
        mpi = [inst for inst in plan.instances_of(i) if inst.mpi]
        assert opts["ntasks-per-node"] == [str(mpi[0].tasks_per_node if mpi else 1)]
        assert ("exclusive" in opts) == slurm.exclusive
        if slurm.request_gpus and not slurm.gres:
            assert opts["gpus-per-node"] == [str(cfg.site.node.gpus)]
        else:
            assert "gpus-per-node" not in opts
        first_only = {"job-name", "output", "signal"}
        if i == 0:
            assert opts["job-name"] == [dep.name]
            assert opts["output"] == [f"{job_dir}/logs/batch-%j.out"]
            assert opts["signal"] == [f"B:TERM@{slurm.signal_grace}"]
        else:
            assert not first_only & set(opts), f"component {i} repeats {first_only & set(opts)}"


def test_4p12d_is_a_4_plus_12_node_het_job():
    ex = next(e for e in EXAMPLES if e.stem == "kimi-k2-instruct-4p12d")
    comps = _components(render(ex, "/jobs/x")["job.sbatch"][0])
    assert [c["nodes"] for c in comps] == [["4"], ["12"]]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_no_directive_after_the_first_command(example):
    """sbatch silently ignores #SBATCH lines after the first command: there must be none."""
    lines = render(example, "/jobs/x")["job.sbatch"][0].splitlines()
    first_cmd = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#"))
    late = [ln for ln in lines[first_cmd:] if ln.startswith(("#SBATCH", "#SLURM"))]
    assert not late
    assert sum(ln.startswith("#SBATCH") for ln in lines[:first_cmd]) >= 5


def test_hostile_directive_values_survive_sbatch_quoting(tmp_path):
    """Each value sbatch reads back is exactly the configured one (quotes, spaces, #, $, \\)."""
    values = {
        "partition": "p a'r\"t #1",
        "account": "acc\\ount\\",
        "qos": "$(touch PWNED) `x` ; && |",
        "constraint": "a|b&c*",
        "reservation": "ünïcødé ✓",
        "mem": "-leading",
    }
    doc = small_pd()
    doc["site"]["slurm"].update(values)
    doc["site"]["slurm"]["extra_directives"] = {"comment": "it's a \"comment\" \\ # here",
                                                 "overcommit": True, "hold": False}
    f = write_yaml(tmp_path / "d.yaml", doc)
    comps = _components(render(f, "/jobs/x")["job.sbatch"][0])
    assert len(comps) == 2
    for opts in comps:
        for k, v in values.items():
            assert opts[k] == [v], k
        assert opts["comment"] == ["it's a \"comment\" \\ # here"]
        assert opts["overcommit"] == [None]  # true: a bare flag
        assert "hold" not in opts          # false: left out


# ------------------------------------------------- the parser port itself (so the above can fail)

def test_parser_port_follows_sbatch_rules():
    text = "\n".join([
        "#!/bin/bash",
        "#SBATCH --a='x y' --b=\"q\\\"q\"",
        "#SBATCH --c='back\\slash'  # a comment",
        "# an ordinary comment",
        "",
        "#SBATCH hetjob",
        "#SBATCH --d=1#not-a-comment-inside? --e",
        "echo hi",
        "#SBATCH --ignored=1",
    ])
    comps = sbatch_components(text)
    # A backslash escapes even inside single quotes: sbatch drops it (unlike a shell).
    assert comps == [["--a=x y", '--b=q"q', "--c=backslash"], ["--d=1"]]
    with pytest.raises(SbatchParseError):
        sbatch_components("#SBATCH --x='unterminated\n")
