"""Scaling on load (roles.<role>.autoscale), on the real test cluster with the real
sglang-router and simulated SGLang workers: a load step makes the front job submit its slot (a
new Slurm job whose instance then takes requests through the front's router), the end of the
load drains it after the cool-down, never past min or max, without a failed request."""

from __future__ import annotations

import json

import pytest

from hpcserve.runtime.contract import SCALED_IN
from jobkit import Job, Load, deployment, requests_in, until

pytestmark = pytest.mark.slurm

FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1, "hung_after": 1}
# 8 tokens at 0.05 s: a request runs 0.4 s, so six clients hold about six running requests
ENGINE = {"name": "sglang", "version": "0.5.23", "simulate": True,
          "sim_decode_s_per_token": 0.05}
SCALE = {"min": 1, "max": 2, "signal": "running", "target": 2, "cool_down": "4s",
         "interval": 0.5, "drain_timeout": 20}


def test_a_load_step_adds_a_slot_job_and_its_end_drains_it_after_the_cool_down(submit):
    dep = deployment(name="t-autoscale", liveness=FAST, engine=ENGINE)
    dep["roles"] = {"worker": {"nodes": 1, "autoscale": SCALE}}
    front = submit(dep)
    st = front.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", front.logs()
    url = st["endpoint"]
    spec = json.loads((front.dir / "plan.json").read_text())["autoscale"]["worker"]
    (slot_dir,) = spec["slots"]  # max 2 - the front's own 1
    # read where every DP rank reports (SGLang's /v1/loads), not node rank 0's /metrics
    assert spec["signal"] == {"kind": "running", "metrics": ["sglang_num_running_reqs"]}, spec
    slot_log = front.dir / "scale" / "worker-s1" / "logs" / "hpcserve-job.log"

    def decisions() -> list[dict]:
        return (front.state().get("autoscale") or {}).get("worker", {}).get("decisions", [])

    # no load: one instance is min, and nothing is below target with none fewer
    assert decisions() == [], front.state().get("autoscale")
    with Load(url, clients=6, key=front.key) as load:
        added = until("an autoscale add under load", lambda: decisions(), 30,
                      why=front.logs)[0]
        assert (added["action"], added["slot"]) == ("add", "worker-s1"), added
        assert added["value"] > SCALE["target"], added
        slot_id = until("the slot's job id", lambda: decisions()[0]["job_id"], 15,
                        why=front.logs)
        slot = Job(front.cluster, front.dir / "scale" / "worker-s1", slot_id, front.env)
        assert slot_id != front.id and str(slot.dir) == slot_dir
        sst = slot.wait({"serving", "failed", "cancelled", "done"}, 60)
        assert sst["phase"] == "serving", slot.logs()
        # a new Slurm job of its own that joined the front's router (read from its state.json)
        assert sst["job_id"] == slot_id and sst["endpoint"] == url, sst
        assert sst["attach"]["front_job_id"] == front.id, sst["attach"]
        engine_log = slot.dir / sst["startup"]["instances"]["worker-0"]["log"]
        until("requests served by the slot's engine", lambda: requests_in(engine_log) >= 3, 30,
              why=slot.logs)
        assert "joined t-autoscale" in slot_log.read_text()
    # the load ended: one instance fewer reads below target, once the cool-down has passed
    removed = until("an autoscale remove", lambda: decisions()[1:], 30, why=front.logs)[0]
    assert (removed["action"], removed["slot"], removed["job_id"]) == \
        ("remove", "worker-s1", slot_id), removed
    assert removed["at"] - added["at"] >= 4, (added, removed)
    sst = slot.wait({"done", "failed", "cancelled"}, 40)
    assert (sst["phase"], sst["reason"]) == ("done", SCALED_IN), slot.logs()
    assert not load.failures(), load.failures()[:3]
    # never past min or max: one add, one remove; the front serves on with its own instance
    st = front.wait_until(lambda s: s["autoscale"]["worker"]["slots"]["worker-s1"]["status"]
                          == "free", 10)
    assert [d["action"] for d in decisions()] == ["add", "remove"], decisions()
    assert all(1 <= d["capacity"] <= 2 for d in decisions()), decisions()
    assert st["phase"] == "serving", st
    log = (front.dir / "logs" / "hpcserve-job.log").read_text()
    assert "autoscale worker: add worker-s1: running" in log, log
    assert f"autoscale worker: worker-s1 submitted as job {slot_id}" in log, log
    assert f"autoscale worker: remove worker-s1 (job {slot_id})" in log, log
