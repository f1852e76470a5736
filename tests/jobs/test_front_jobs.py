"""A front job that holds only the router and the orchestrator (`instances: 0` of every role, its
autoscale slots serving them), on the real test cluster with the real sglang-router in PD mode
and simulated SGLang: the router starts with no worker and publishes its address at
router_ready, the front submits `min` slot jobs of each role at once, serves only once a slot of
each role serves and the smoke request through its router answered; requests reach the slots'
engines; `hpcserve cancel` of the front stops every slot job too."""

from __future__ import annotations

import json
import subprocess

import pytest

from jobkit import Job, Load, deployment, requests_in, until

pytestmark = pytest.mark.slurm

FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1, "hung_after": 1}
ENGINE = {"name": "sglang", "version": "0.5.23", "simulate": True,
          "sim_decode_s_per_token": 0.01}
# one slot each (max 1); a long cool-down: no load decision while the test runs
SCALE = {"min": 1, "max": 1, "signal": "queued", "target": 4, "cool_down": "10m",
         "interval": 0.5}


def _at(st: dict, phase: str) -> float:
    return next(h["at"] for h in st["history"] if h["phase"] == phase)


def test_a_front_of_router_alone_serves_through_its_slot_jobs_and_cancel_stops_them(
        submit, tmp_path, owners_hpcserve):
    dep = deployment(name="t-front-only", liveness=FAST, engine=ENGINE)
    dep["roles"] = {r: {"instances": 0, "nodes": 1, "autoscale": SCALE}
                    for r in ("prefill", "decode")}
    front = submit(dep)
    spec = json.loads((front.dir / "plan.json").read_text())
    # no engine in the front: its one component is the router's
    assert spec["instances"] == [] and spec["router"]["readiness"]["workers"] == 0, spec
    st = front.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", front.logs()
    url = st["endpoint"]
    # the router's address was published before the front served (the slots joined it then)
    assert st["router_url"] == url and _at(st, "router_ready") < _at(st, "serving"), st
    slots = {}
    for role in ("prefill", "decode"):
        (d,) = st["autoscale"][role]["decisions"]
        assert (d["action"], d["slot"]) == ("add", f"{role}-s1") and d["job_id"], d
        slot = Job(front.cluster, front.dir / "scale" / f"{role}-s1", d["job_id"], front.env)
        sst = slot.state()
        assert sst["phase"] == "serving" and sst["job_id"] == d["job_id"], slot.logs()
        assert sst["endpoint"] == url and sst["attach"]["front_job_id"] == front.id, sst
        # the slot served before the front did: the front waited for it
        assert _at(sst, "serving") <= _at(st, "serving"), (sst["history"], st["history"])
        slots[role] = slot
    log = (front.dir / "logs" / "hpcserve-job.log").read_text()
    assert "router ready with 0 worker(s)" in log and "smoke request returned" in log, log
    with Load(url, clients=2, key=front.key) as load:
        for role, slot in slots.items():
            engine_log = slot.dir / slot.state()["startup"]["instances"][f"{role}-0"]["log"]
            until(f"requests served by the {role} slot's engine",
                  lambda: requests_in(engine_log) >= 3, 30, why=slot.logs)
    assert load.results and not load.failures(), load.failures()[:3]
    env = {**front.env, "HPCSERVE_STATE_DIR": str(tmp_path / "state")}
    # `hpcserve logs` of the front: the deployment's, its slot jobs' engine logs included
    r = subprocess.run([*owners_hpcserve, "logs", front.id, "--role", "decode"], env=env,
                       capture_output=True, text=True, timeout=60, cwd=tmp_path)
    engine_log = slots["decode"].dir / slots["decode"].state()["startup"]["instances"][
        "decode-0"]["log"]
    assert r.returncode == 0 and f"==> {engine_log} <==" in r.stdout, (r.stdout[-2000:], r.stderr)
    # `hpcserve cancel` of the front: the router first, then every slot job it submitted
    r = subprocess.run([*owners_hpcserve, "cancel", front.id, "--wait"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert front.wait({"cancelled", "failed", "done"}, 30)["phase"] == "cancelled", front.logs()
    for role, slot in slots.items():
        assert slot.wait({"cancelled", "failed", "done"}, 30)["phase"] == "cancelled", \
            slot.logs()
        slot.squeue_gone(30)
    front.squeue_gone(30)
