"""plan.json is the declared run-time spec: every rendered one validates against it, the runtime
knows the same version, and a job directory of another spec version is refused before anything
starts."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from hpcserve.author import plan_json
from hpcserve.runtime import contract
from hpcserve.runtime.contract import SPEC_VERSION
from hpcserve.author.render import write_job
from unitkit import EXAMPLES, ROOT, install_stubs, read_stub_log, render


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_rendered_plan_json_is_a_valid_spec(example):
    plan = json.loads(render(example, "/jobs/x")["plan.json"][0])
    jsonschema.Draft202012Validator(plan_json.SCHEMA).validate(plan)
    assert (plan["spec"], plan["spec_version"]) == (contract.SPEC, contract.SPEC_VERSION)


@pytest.mark.parametrize("variant", ["fabric", "in_allocation"])
def test_plan_json_of_a_fabric_site_and_of_an_allocation_is_a_valid_spec(variant):
    """The optional parts no example reaches: a site with NVLink domains (its preflight block
    names the domain) and a job run inside an allocation the user holds."""
    from hpcserve.author import config, plan as planner
    from hpcserve.author.render import render_files
    # GB200: 4 GPUs a node, so half the tensor-parallel size of the 8-GPU example
    sets = ("site=gb200-nvl72", "roles.prefill.tp=16", "roles.prefill.attn_dp=16",
            "roles.decode.tp=48", "roles.decode.attn_dp=48") if variant == "fabric" else ()
    p = planner.build(config.load(ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml", sets))
    if variant == "in_allocation":
        p = planner.in_allocation(p)
    plan = json.loads(render_files(p, "/jobs/x")["plan.json"][0])
    jsonschema.Draft202012Validator(plan_json.SCHEMA).validate(plan)
    if variant == "fabric":
        assert plan["preflight"]["fabric"] == {"domain_nodes": 18}
    else:
        assert plan["in_allocation"] is True and plan["requeue"] == 0


def test_the_runtime_understands_the_spec_the_renderer_writes():
    # The job directory carries its own copy of the contract (the nodes have no hpcserve):
    # what it declares is what the renderer wrote into plan.json.
    files = render(ROOT / "examples" / "demo.yaml", "/jobs/x")
    declared: dict = {}
    exec(files["hpcserve_runtime/contract.py"][0], declared)
    plan = json.loads(files["plan.json"][0])
    assert (declared["SPEC"], declared["SPEC_VERSION"]) == (plan["spec"], plan["spec_version"])


def _job_dir(tmp_path: Path, edit) -> Path:
    jd = tmp_path / "job"
    for rel, (text, _mode) in render(ROOT / "examples" / "demo.yaml", str(jd)).items():
        (jd / rel).parent.mkdir(parents=True, exist_ok=True)
        (jd / rel).write_text(text)
    (jd / "logs").mkdir()
    (jd / "run").mkdir()
    plan = json.loads((jd / "plan.json").read_text())
    edit(plan)
    (jd / "plan.json").write_text(json.dumps(plan))
    return jd


@pytest.mark.parametrize("edit,says", [
    (lambda p: p.update(spec_version=SPEC_VERSION - 1), f"is run-time spec {SPEC_VERSION - 1}"),
    (lambda p: p.update(spec_version=SPEC_VERSION + 1, hpcserve_version="9.9"),
     "rendered by hpcserve 9.9"),
    (lambda p: p.pop("spec"), "is run-time spec"),
], ids=["older", "newer", "undeclared"])
def test_a_job_directory_of_another_spec_is_refused_before_anything_runs(tmp_path, edit, says):
    jd = _job_dir(tmp_path, edit)
    bindir = install_stubs(tmp_path / "bin")
    log = tmp_path / "calls.jsonl"
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HPCSERVE_STUB_LOG": str(log),
           "SLURM_JOB_ID": "4242"}
    r = subprocess.run([sys.executable, "-m", "hpcserve_runtime", "run", str(jd)], env=env,
                       capture_output=True, text=True, timeout=30, cwd=jd)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and f"understands spec {SPEC_VERSION} only" in r.stderr
    state = json.loads((jd / "state.json").read_text())
    assert state["phase"] == "failed" and says in state["reason"]
    assert state["failure"] == {"reason": "incompatible job directory"}
    assert read_stub_log(log) == []  # no srun, squeue or scancel: nothing was started


def test_a_batch_host_python_too_old_for_the_runtime_fails_at_once_saying_so(tmp_path):
    # RHEL 8's python3 is 3.6: job.sbatch must not start the runtime with it.
    old = tmp_path / "python3.6"
    old.write_text("#!/bin/sh\n[ \"$1\" = -V ] && echo 'Python 3.6.8' && exit 0\nexit 1\n")
    old.chmod(0o755)
    jd = tmp_path / "job"
    files = render(ROOT / "examples" / "demo.yaml", str(jd), (f"site.paths.python={old}",))
    write_job(files, jd)  # its API key too, which job.sbatch reads before the python check
    r = subprocess.run(["bash", str(jd / "job.sbatch")], capture_output=True, text=True,
                       timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 1
    assert "is Python 3.6.8; hpcserve_runtime needs Python 3.7 or later" in r.stderr
    state = json.loads((jd / "state.json").read_text())
    assert state["phase"] == "failed" and state["failure"] == {
        "reason": "preflight failed", "check": "python", "node": socket.gethostname()}
    assert state["reason"].startswith(f"preflight: python failed on {socket.gethostname()}")
