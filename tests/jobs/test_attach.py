"""An instance job that joins a running deployment (plan.json attach), on the real test cluster
with the real sglang-router: its instance is registered with the front job's router only after
its smoke request, takes requests through that router, and a drain request takes it out without
failing a request; the instance job then ends "done"."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.request

import pytest

from hpcserve.runtime.contract import SCALED_IN, drain_request_path
from jobkit import Load, deployment, requests_in, until

pytestmark = pytest.mark.slurm

FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1}
ENGINE = {"name": "sglang", "version": "0.5.23", "simulate": True,
          "sim_decode_s_per_token": 0.02}  # 8 tokens: 0.16 s in flight, so a drain waits


def _worker_dep(name: str) -> dict:
    dep = deployment(name=name, liveness=FAST, engine=ENGINE)
    dep["roles"] = {"worker": {"nodes": 1}}
    return dep


def _attach_to(front, front_st: dict, avoid: str):
    """An edit for the submit fixture: the rendered job made an instance job of `front`'s
    deployment (what `hpcserve scale --add` renders), kept off the front's node (the local site
    shares nodes: the same engine port would clash there)."""
    def edit(job_dir):
        p = job_dir / "plan.json"
        plan = json.loads(p.read_text())
        front_plan = json.loads((front.dir / "plan.json").read_text())
        plan["router"] = None
        plan["attach"] = {"router_url": front_st["endpoint"],
                          "workers_api": front_plan["router"]["workers_api"],
                          "api_key_env": None, "front_job_id": front.id,
                          "front_job_dir": str(front.dir), "deployment": front_plan["name"]}
        p.write_text(json.dumps(plan, indent=1))
        sb = job_dir / "job.sbatch"
        sb.write_text(re.sub(r"(?m)^#SBATCH --nodes=1$",
                             lambda m: f"{m.group()}\n#SBATCH --exclude={avoid}", sb.read_text()))
    return edit


def _workers(router_url: str) -> list[str]:
    with urllib.request.urlopen(router_url + "/workers", timeout=5) as r:
        return [w["url"] for w in json.load(r)["workers"]]


def test_an_instance_job_joins_after_its_smoke_request_and_a_drain_fails_no_request(submit):
    front = submit(_worker_dep("t-front"))
    fst = front.wait({"serving", "failed", "cancelled"}, 60)
    assert fst["phase"] == "serving", front.logs()
    url = fst["endpoint"]
    front_node = front.node_rows("worker-0")[0][1]
    inst = submit(_worker_dep("t-inst"), edit=_attach_to(front, fst, front_node))
    job_log = inst.dir / "logs" / "hpcserve-job.log"
    smoke_line = "worker-0 answered its smoke request"

    def listed_after_smoke():
        """Its URL once the front's router lists it; the smoke line is in its job log by then."""
        if inst.state().get("phase") in ("failed", "cancelled", "done"):
            raise AssertionError(inst.logs())
        rows = (inst.dir / "run" / "worker-0.nodes")
        if not rows.exists():
            return None
        mine = f"http://{inst.node_rows('worker-0')[0][2]}:30000"
        if mine not in _workers(url):
            return None
        assert smoke_line in job_log.read_text(), "registered before its smoke request"
        return mine

    mine = until("the instance job's worker in the front's router", listed_after_smoke, 60,
                 why=inst.logs)
    ist = inst.wait({"serving", "failed"}, 30)
    assert ist["phase"] == "serving" and ist["endpoint"] == url, ist
    assert ist["attach"]["front_job_id"] == front.id, ist
    assert inst.node_rows("worker-0")[0][1] != front_node
    lines = job_log.read_text().splitlines()
    order = [next(i for i, ln in enumerate(lines) if w in ln)
             for w in (smoke_line, f"worker-0 registered with the router at {url}",
                       f"serving at {url}")]
    assert order == sorted(order), lines
    ist = inst.wait_until(lambda s: "worker-0" in s["health"], 10)  # a liveness round
    assert "router" not in ist["health"], ist  # no router of its own to probe
    engine_log = inst.dir / ist["startup"]["instances"]["worker-0"]["log"]
    with Load(url) as load:
        # requests through the front's router reach the instance job's engine (its own log)
        until("a request served by the instance job's engine",
              lambda: requests_in(engine_log) >= 3, 30, why=inst.logs)
        drain = drain_request_path(str(inst.dir), "worker-0")
        os.makedirs(os.path.dirname(drain), exist_ok=True)
        with open(drain + ".tmp", "w") as f:  # atomically, as the CLI writes it
            json.dump({"timeout_s": 30, "requested_at": 0}, f)
        os.replace(drain + ".tmp", drain)
        ist = inst.wait({"done", "failed", "cancelled"}, 40)
        assert mine not in _workers(url)
        served_before = load.ok_between(0, float("inf"))
        # the front serves on with its own instance alone
        until("requests after the drain", lambda: load.ok_between(0, float("inf")) >=
              served_before + 4, 20)
    assert (ist["phase"], ist["reason"]) == ("done", SCALED_IN), ist
    assert ist["instances"]["worker-0"]["status"] == "removed", ist
    # leaving on request is no failure: the job never counted itself short of an instance
    assert not {"degraded", "recovering"} & {h["phase"] for h in ist["history"]}, ist
    assert not load.failures(), load.failures()[:3]
    assert os.path.exists(drain[:-len(".json")] + ".taken")
    log = job_log.read_text()
    out = log.index("worker-0 removed from the router")
    settled = re.search(r"worker-0: no request in flight [\d.]+ s after it left the router", log)
    assert settled and out < settled.start(), log
    assert log.index("worker-0 removed: drained on request") > settled.start(), log
    assert front.state()["phase"] == "serving"


def test_a_cancelled_instance_job_leaves_the_front_router_before_its_engine_stops(submit):
    front = submit(_worker_dep("t-front2"))
    fst = front.wait({"serving", "failed", "cancelled"}, 60)
    assert fst["phase"] == "serving", front.logs()
    url = fst["endpoint"]
    inst = submit(_worker_dep("t-inst2"),
                  edit=_attach_to(front, fst, front.node_rows("worker-0")[0][1]))
    ist = inst.wait({"serving", "failed"}, 60)
    assert ist["phase"] == "serving", inst.logs()
    mine = f"http://{inst.node_rows('worker-0')[0][2]}:30000"
    assert mine in _workers(url)
    # as `hpcserve cancel` stops a job: its orchestrator alone is signalled (a plain scancel
    # signals every step at once, so nothing could leave the router first)
    subprocess.run(["scancel", "--batch", "--signal=USR1", inst.id], env=inst.env, check=True)
    assert inst.wait({"cancelled", "failed", "done"}, 30)["phase"] == "cancelled", inst.logs()
    assert mine not in _workers(url)
    log = (inst.dir / "logs" / "hpcserve-job.log").read_text()
    out = log.index(f"worker-0 removed from the router ({mine})")
    assert out < log.index("SIGTERM to worker-0"), log
    assert front.state()["phase"] == "serving"
