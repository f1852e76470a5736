"""roles.<role>.autoscale on the render side: bad bounds, signals and routers refused in one
line naming file, line and field (exit 2, nothing rendered); the slots rendered under the front's
scale/ with ports clear of the front's and of each other; plan.json's autoscale and the slots'
attach as the runtime reads them; status and cancel finding slot jobs in the front's
state.json."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from hpcserve.operate import deployment_jobs, deployments
from hpcserve.author import ports
from hpcserve.cli import main
from hpcserve.author.plan_json import SCHEMA
from hpcserve.runtime.contract import STATE_SCHEMA
from unitkit import load_plan

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.yaml"
OK = '{"min": 1, "max": 3, "signal": "queued", "target": 2, "cool_down": "5s"}'


def _scale(spec: str) -> str:
    return f"roles.decode.autoscale={spec}"


@pytest.mark.parametrize("cool_down, seconds", [(30, 30), ("1.5m", 90), ("00:02:00", 120)])
def test_cool_down_is_seconds_a_duration_or_a_slurm_time(cool_down, seconds, tmp_path):
    spec = json.dumps({"min": 1, "max": 2, "cool_down": cool_down})
    p = load_plan(DEMO, [_scale(spec)])
    assert p.autoscale["decode"].cool_down_s == seconds


@pytest.mark.parametrize("spec, words", [
    ('{"min": 2, "max": 3}', "roles.decode.autoscale.min: must be at most "
                             "roles.decode.instances (1), got 2"),
    ('{"min": 0, "max": 3, "foo": 1}', "roles.decode.autoscale.foo: unknown key 'foo'"),
    ('{"min": 3, "max": 2}', "roles.decode.autoscale.min: must be at most max (2), got 3"),
    ('{"min": 0, "max": 2, "signal": "gpu"}', "roles.decode.autoscale.signal: expected one of "
                                              "queued, running, kv_usage"),
    ('{"min": 0, "max": 2, "cool_down": "5 min"}', "roles.decode.autoscale.cool_down: expected "
                                                   "seconds, or a duration"),
    ('{"min": 0, "max": 2, "target": 0}', "roles.decode.autoscale.target: must be above 0"),
])
def test_bad_autoscale_is_one_line_exit_2_and_nothing_rendered(spec, words, tmp_path):
    out = tmp_path / "job"
    r = CliRunner().invoke(main, ["submit", str(DEMO), "--set", _scale(spec), "--dry-run",
                                  "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert words in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not out.exists()


def test_a_signal_the_engine_does_not_expose_is_refused_at_its_line(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(DEMO.read_text().replace("  decode:\n", "  decode:\n    autoscale: "
                                          "{min: 1, max: 2, signal: kv_usage}\n")
                 .replace("name: sglang", "name: trtllm").replace('"0.5.23"', "1.3.0rc3"))
    r = CliRunner().invoke(main, ["plan", str(f)])
    line = next(i for i, ln in enumerate(f.read_text().splitlines(), 1) if "autoscale" in ln)
    assert r.exit_code == 2, r.output
    assert f"d.yaml:{line}: roles.decode.autoscale.signal: TensorRT-LLM exposes no kv_usage " \
           "metric" in r.output, r.output


def test_slots_are_rendered_under_scale_with_ports_clear_of_the_front_and_each_other():
    p = load_plan(DEMO, [_scale(OK)])
    a = p.autoscale["decode"]
    assert [n for n, _ in a.slots] == ["decode-s1", "decode-s2"]  # max 3 - the front's 1
    seen = ports.plan_ports(p)
    for _, slot in a.slots:
        assert [i.role for i in slot.instances] == ["decode"] and slot.router is None
        mine = ports.plan_ports(slot)
        assert not mine & seen, (mine, seen)
        seen |= mine
    from hpcserve.author.render import render_files
    files = render_files(p, "/jobs/demo")
    spec = json.loads(files["plan.json"][0])
    jsonschema.validate(spec, SCHEMA)
    assert spec["autoscale"]["decode"]["slots"] == ["/jobs/demo/scale/decode-s1",
                                                    "/jobs/demo/scale/decode-s2"]
    assert spec["autoscale"]["decode"]["signal"]["metrics"][0] == "sglang_num_waiting_reqs"
    s1 = json.loads(files["scale/decode-s1/plan.json"][0])
    jsonschema.validate(s1, SCHEMA)
    assert (s1["job_dir"], s1["router"]) == ("/jobs/demo/scale/decode-s1", None)
    assert s1["attach"] == {"router_url": None, "workers_api": "queued",
                            "api_key_env": "HPCSERVE_API_KEY", "front_job_id": None,
                            "front_job_dir": "/jobs/demo", "deployment": "demo-kimi-k2"}
    # a slot's engines take the deployment's key, from the front's file: it has none of its own
    assert s1["api_key"] == {"env": "HPCSERVE_API_KEY", "file": "/jobs/demo/secret/api-key"}
    assert "key=/jobs/demo/secret/api-key\n" in files["scale/decode-s1/job.sbatch"][0]
    assert s1["autoscale"] is None  # a slot scales nothing itself
    sbatch = files["scale/decode-s1/job.sbatch"][0]
    assert "--output=/jobs/demo/scale/decode-s1/logs/batch-%j.out" in sbatch


def test_status_and_cancel_find_the_slot_jobs_in_the_front_s_state(tmp_path):
    front = deployments.new_entry("7", "demo", str(tmp_path), None)
    st = {"phase": "serving", "history": [], "updated_at": 1.0, "autoscale": {"decode": {
        "value": 0.5, "capacity": 2, "decisions": [],
        "slots": {"decode-s1": {"dir": f"{tmp_path}/scale/decode-s1", "job_id": "9",
                                "status": "serving"},
                  "decode-s2": {"dir": f"{tmp_path}/scale/decode-s2", "job_id": "8",
                                "status": "free"}}}}}
    jsonschema.validate(st, STATE_SCHEMA)
    (tmp_path / "state.json").write_text(json.dumps(st))
    from hpcserve.slurm.runner import LocalRunner
    got = [j.entry for j in deployment_jobs.jobs_of(front, LocalRunner()).slots]
    assert [(e.job_id, e.job_dir, e.front) for e in got] == \
        [("9", f"{tmp_path}/scale/decode-s1", str(tmp_path))]  # an ended slot is not listed


@pytest.mark.parametrize("sets, words", [
    (["roles.decode.instances=0"], "roles.decode.instances: 0 instances in the front job needs "
                                   "roles.decode.autoscale with min at least 1"),
    (["roles.decode.instances=0", _scale('{"min": 0, "max": 2}')],
     "roles.decode.instances: 0 instances in the front job needs roles.decode.autoscale with "
     "min at least 1"),
    (["roles.decode.instances=-1"], "roles.decode.instances: must be at least 0, got -1"),
])
def test_a_role_left_to_slots_needs_autoscale_with_min_1(sets, words, tmp_path):
    args = [a for s in sets for a in ("--set", s)]
    r = CliRunner().invoke(main, ["submit", str(DEMO), *args, "--dry-run", "--out",
                                  str(tmp_path / "job")])
    assert r.exit_code == 2, r.output
    assert words in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "job").exists()


def test_a_front_without_prefill_engines_puts_its_router_on_a_component_of_its_own():
    # demo.yaml: router.placement prefill; with no prefill engine in the front that component
    # is gone, so the router gets one of its own, after the decode engines'
    p = load_plan(DEMO, ["roles.prefill.instances=0",
                         'roles.prefill.autoscale={"min": 1, "max": 2}'])
    assert [c.name for c in p.components] == ["decode", "router"], p.components
    assert [i.name for i in p.instances] == ["decode-0"] and p.router.component == 1
    assert [n for n, _ in p.autoscale["prefill"].slots] == ["prefill-s1", "prefill-s2"]
    (slot,) = {s.instances[0].role for _, s in p.autoscale["prefill"].slots}
    assert slot == "prefill" and p.router.pd


def test_with_renew_each_slot_is_rendered_as_a_pair_that_names_its_twin():
    p = load_plan(DEMO, [_scale(OK), 'renew={"margin": "40s", "time_limit": "00:02:00"}'])
    a = p.autoscale["decode"]
    assert [n for n, _ in a.slots] == ["decode-s1", "decode-s2"]
    assert [n for n, _ in a.twins] == ["decode-s1b", "decode-s2b"]
    seen = ports.plan_ports(p)
    for _, slot in a.slots + a.twins:  # four port blocks: each clear of the front and the rest
        mine = ports.plan_ports(slot)
        assert not mine & seen, (mine, seen)
        seen |= mine
    from hpcserve.author.render import render_files
    files = render_files(p, "/jobs/demo")
    spec = json.loads(files["plan.json"][0])
    assert spec["autoscale"]["decode"]["slots"] == ["/jobs/demo/scale/decode-s1",
                                                    "/jobs/demo/scale/decode-s2"]  # the pairs
    for name, twin in (("decode-s1", "decode-s1b"), ("decode-s1b", "decode-s1")):
        s = json.loads(files[f"scale/{name}/plan.json"][0])
        jsonschema.validate(s, SCHEMA)
        assert s["renew"] == {"twin_dir": f"/jobs/demo/scale/{twin}", "margin_s": 40}, s
        assert (s["name"], s["attach"]["front_job_dir"]) == ("demo-kimi-k2-decode-s1",
                                                             "/jobs/demo")
        sbatch = files[f"scale/{name}/job.sbatch"][0]
        assert "#SBATCH --signal=B:23@40" in sbatch and "#SBATCH --time=00:02:00" in sbatch


def test_status_and_cancel_find_a_renewing_slot_s_successor_the_front_has_not_recorded(tmp_path):
    front = deployments.new_entry("7", "demo", str(tmp_path), None)
    a, b = tmp_path / "scale" / "decode-s1", tmp_path / "scale" / "decode-s1b"
    for d, twin in ((a, b), (b, a)):
        d.mkdir(parents=True)
        (d / "plan.json").write_text(json.dumps({"renew": {"twin_dir": str(twin),
                                                           "margin_s": 40}}))
    (tmp_path / "state.json").write_text(json.dumps({"autoscale": {"decode": {"slots": {
        "decode-s1": {"dir": str(a), "job_id": "9", "status": "serving"}}}}}))
    # job 9 submitted its successor 12 into the twin since the front last wrote its state
    (a / "state.json").write_text(json.dumps({"job_id": "9", "phase": "serving", "renew": {
        "twin_dir": str(b), "successor_job_id": "12"}}))
    from hpcserve.slurm.runner import LocalRunner
    got = deployment_jobs.jobs_of(front, LocalRunner()).slots
    assert [(j.entry.job_id, j.entry.job_dir, j.successor_of) for j in got] == \
        [("9", str(a), None), ("12", str(b), "9")]
