"""The Prometheus file-SD file a job keeps while it serves: its targets and labels from a rendered
plan.json and the instances' state, written atomically and readable by another user, and the
site setting that names its directory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from types import SimpleNamespace

from hpcserve.author import plan_json
from hpcserve.runtime.file_sd import FileSD, file_name, target_groups
from hpcserve.runtime.spec import Spec
from unitkit import ROOT, load_plan, small_pd, write_yaml

PD = {"prefill-0": {"address": "10.0.0.1", "nodes": ["n1"], "attempt": 0},
      "decode-0": {"address": "10.0.0.2", "nodes": ["n2", "n3"], "attempt": 0}}
ROUTER = {"node": "n1", "address": "10.0.0.1"}
IDS = {"slurm_job_id": "4242", "slurm_cluster": "c1"}


def _spec(tmp_path, **site_over) -> dict:
    dep = small_pd()
    dep["site"].update(site_over)
    return plan_json.job_spec(load_plan(write_yaml(tmp_path / "d.yaml", dep)), "/jobs/x")


def _by_instance(groups: list[dict]) -> dict:
    return {g["labels"]["instance"]: g for g in groups}


def test_every_engine_leader_and_the_router_is_a_target_labelled_with_where_it_runs(tmp_path):
    spec = _spec(tmp_path)
    got = _by_instance(target_groups(Spec(spec), PD, ROUTER, IDS))
    assert set(got) == {"prefill-0", "decode-0", "router"}
    assert got["decode-0"] == {"targets": [f"10.0.0.2:{spec['instances'][1]['port']}"], "labels": {
        "deployment": "t", "engine": "sglang", "slurm_job_id": "4242", "slurm_cluster": "c1",
        "role": "decode", "instance": "decode-0", "node": "n2", "nodes": "n2,n3",
        "attempt": "0"}}
    r = spec["router"]
    assert got["router"]["targets"] == [f"10.0.0.1:{r['prometheus_port']}"]
    assert (got["router"]["labels"]["role"], got["router"]["labels"]["node"]) == ("router", "n1")
    # /metrics is Prometheus's default path: not repeated as a label
    assert not any("__metrics_path__" in g["labels"] for g in got.values())
    # Prometheus takes only strings as label values
    assert all(isinstance(v, str) for g in got.values() for v in g["labels"].values())


def test_an_instance_out_of_the_router_is_left_out_and_its_replacement_named(tmp_path):
    spec = _spec(tmp_path)
    out = target_groups(Spec(spec), {"prefill-0": PD["prefill-0"]}, ROUTER, IDS)
    assert "decode-0" not in _by_instance(out)
    moved = {**PD, "decode-0": {"address": "10.0.0.9", "nodes": ["n2", "spare1"], "attempt": 1}}
    d0 = _by_instance(target_groups(Spec(spec), moved, ROUTER, IDS))["decode-0"]
    assert d0["targets"][0].startswith("10.0.0.9:")
    assert (d0["labels"]["nodes"], d0["labels"]["attempt"]) == ("n2,spare1", "1")


def test_a_path_other_than_metrics_an_ipv6_leader_and_no_router_yet(tmp_path):
    spec = _spec(tmp_path)
    spec["instances"][0]["metrics"] = {**spec["instances"][0]["metrics"], "path": "/m"}
    v6 = {"prefill-0": {"address": "fd00::1", "nodes": ["n1"], "attempt": 0}}
    (g,) = target_groups(Spec(spec), v6, None, {"slurm_job_id": "7", "slurm_cluster": ""})
    assert g["targets"] == [f"[fd00::1]:{spec['instances'][0]['port']}"]
    assert g["labels"]["__metrics_path__"] == "/m" and "slurm_cluster" not in g["labels"]


def test_an_engine_and_router_without_prometheus_text_have_no_target():
    # trtllm-serve's /metrics answers JSON iteration statistics, and its disaggregated front
    # server has no metrics port
    spec = plan_json.job_spec(load_plan(ROOT / "examples" / "trtllm-kimi-k2-disagg.yaml"), "/x")
    assert spec["router"]["metrics_path"] is None
    where = {i["name"]: {"address": "10.0.0.1", "nodes": ["n1"], "attempt": 0}
             for i in spec["instances"]}
    assert target_groups(Spec(spec), where, ROUTER, IDS) == []


def test_the_file_names_deployment_cluster_and_job():
    assert file_name("kimi", "c1", "4242") == "hpcserve-kimi-c1-4242.json"
    assert file_name("kimi", "", "4242") == "hpcserve-kimi-4242.json"


def _job(spec: dict, job_id: str, status: str = "serving") -> SimpleNamespace:
    """What FileSD reads of the job: the plan, the instances' leaders and the instance table."""
    logged: list[str] = []
    recs = {n: SimpleNamespace(status=status if n == "decode-0" else "serving",
                               nodes=w["nodes"], attempt=w["attempt"]) for n, w in PD.items()}
    return SimpleNamespace(
        plan=Spec(spec), job_id=job_id, log=logged.append, logged=logged,
        instances=SimpleNamespace(heads={n: w["address"] for n, w in PD.items()},
                                  router_node="n1", router_addr="10.0.0.1"),
        table=SimpleNamespace(recs=recs))


def test_written_atomically_world_readable_rewritten_on_change_and_removed(tmp_path,
                                                                          monkeypatch):
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    spec = {**_spec(tmp_path), "file_sd_dir": str(sd_dir)}
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c1")
    job = _job(spec, "4242")
    sd = FileSD(job)
    old = os.umask(0o077)  # a user's strict umask: the Prometheus server's user must read it
    try:
        sd.update()
    finally:
        os.umask(old)
    path = sd_dir / "hpcserve-t-c1-4242.json"
    assert os.listdir(sd_dir) == [path.name]  # no temporary file left behind
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert set(_by_instance(json.loads(path.read_text()))) == {"prefill-0", "decode-0", "router"}
    sd.update()  # nothing changed: not written again
    assert len([m for m in job.logged if "target(s)" in m]) == 1, job.logged
    job.table.recs["decode-0"].status = "out"
    sd.update()
    assert set(_by_instance(json.loads(path.read_text()))) == {"prefill-0", "router"}
    sd.remove()
    assert not path.exists() and f"Prometheus file SD removed: {path}" in job.logged


def test_a_directory_that_cannot_be_written_is_logged_once_and_serving_goes_on(tmp_path):
    spec = {**_spec(tmp_path), "file_sd_dir": str(tmp_path / "missing")}
    job = _job(spec, "1")
    sd = FileSD(job)
    sd.update()
    job.table.recs["decode-0"].status = "out"
    sd.update()
    sd.remove()
    assert len([m for m in job.logged if "not written" in m]) == 1, job.logged
    assert "missing" in job.logged[0]


def test_the_site_names_the_directory_and_plan_json_carries_it(tmp_path):
    assert _spec(tmp_path)["file_sd_dir"] is None
    spec = _spec(tmp_path, metrics={"file_sd_dir": "/shared/prometheus/hpcserve"})
    assert spec["file_sd_dir"] == "/shared/prometheus/hpcserve"


def test_a_relative_directory_is_refused_in_one_line(tmp_path):
    dep = small_pd()
    dep["site"]["metrics"] = {"file_sd_dir": "prometheus/sd"}
    f = write_yaml(tmp_path / "d.yaml", dep)
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "hpcserve"), "plan", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "site.metrics.file_sd_dir" in r.stderr and "an absolute path" in r.stderr, r.stderr
