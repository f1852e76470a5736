"""Instance jobs that join a running deployment (`hpcserve scale`, plan.json attach), on the real
test cluster with the real sglang-router: an instance is registered with the front job's router
only after its smoke request, takes requests through that router, and `--remove` drains it
without failing a request (the instance job then ends "done"); a cancelled instance job leaves
the router before its engine is signalled."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from hpcserve.runtime.contract import SCALED_IN
from jobkit import Job, Load, deployment, requests_in, until

pytestmark = pytest.mark.slurm

FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1, "hung_after": 1}
ENGINE = {"name": "sglang", "version": "0.5.23", "simulate": True,
          "sim_decode_s_per_token": 0.02}  # 8 tokens: 0.16 s in flight, so a drain waits


@pytest.fixture
def front(submit):
    """A serving front job: simulated SGLang, one prefill and one decode instance, the real
    sglang-router in PD mode."""
    job = submit(deployment(name="t-front", liveness=FAST, engine=ENGINE))
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    return job


@pytest.fixture
def cli(front, tmp_path, owners_hpcserve):
    """`hpcserve ARGS...` as the front's user runs it (the cluster's Slurm, an index of this
    test's own); the instance jobs it submitted are cancelled at the end."""
    env = {**front.env, "HPCSERVE_STATE_DIR": str(tmp_path / "state")}
    made: list[Job] = []

    def run(*args: str) -> str:
        r = subprocess.run([*owners_hpcserve, *args], env=env, capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        m = re.search(r"submitted job (\d+).*\njob directory: (\S+)", r.stdout)
        if m:
            made.append(Job(front.cluster, Path(m.group(2)), m.group(1), env))
        return r.stdout

    run.jobs = made
    yield run
    for j in made:
        subprocess.run(["scancel", j.id], env=env, capture_output=True)
    for j in made:
        j.squeue_gone(60)


def _listed(router_url: str, key: str) -> dict[str, dict]:
    """The router's workers by URL (GET /workers: worker_type, bootstrap_port, ...), asked
    with the deployment's API key, which sglang-router asks of its worker API."""
    req = urllib.request.Request(router_url + "/workers",
                                 headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return {w["url"]: w for w in json.load(r)["workers"]}


def _workers(router_url: str, key: str) -> list[str]:
    return list(_listed(router_url, key))


def _worker_url(job: Job, inst: str = "decode-0") -> str:
    port = json.loads((job.dir / "plan.json").read_text())["instances"][0]["port"]
    return f"http://{job.node_rows(inst)[0][2]}:{port}"


def test_scale_add_decode_joins_after_the_smoke_request_and_remove_fails_no_request(front, cli):
    url = front.state()["endpoint"]
    cli("scale", str(front.id), "--role", "decode", "--add", "1")
    inst = cli.jobs[0]
    assert inst.dir.parent.parent == front.dir  # <front job dir>/scale/decode-<seq>/
    job_log = inst.dir / "logs" / "hpcserve-job.log"
    smoke_line = "decode-0 answered its smoke request"

    def listed_after_smoke():
        """Its URL once the front's router lists it; the smoke line is in its job log by then."""
        if inst.state().get("phase") in ("failed", "cancelled", "done"):
            raise AssertionError(inst.logs())
        if not (inst.dir / "run" / "decode-0.nodes").exists():
            return None
        mine = _worker_url(inst)
        if mine not in _workers(url, front.key):
            return None
        assert smoke_line in job_log.read_text(), "registered before its smoke request"
        return mine

    mine = until("the instance job's decode in the front's router", listed_after_smoke, 60,
                 why=inst.logs)
    listed = _listed(url, front.key)
    assert listed[mine]["worker_type"] == "decode", listed  # its role, told
    ist = inst.wait({"serving", "failed"}, 30)
    assert ist["phase"] == "serving" and ist["endpoint"] == url, ist
    assert ist["attach"]["front_job_id"] == front.id, ist
    lines = job_log.read_text().splitlines()
    order = [next(i for i, ln in enumerate(lines) if w in ln)
             for w in (smoke_line, f"decode-0 registered with the router at {url}",
                       f"serving at {url}")]
    assert order == sorted(order), lines
    ist = inst.wait_until(lambda s: "decode-0" in s["health"], 10)  # a liveness round
    assert "router" not in ist["health"], ist  # no router of its own to probe
    engine_log = inst.dir / ist["startup"]["instances"]["decode-0"]["log"]
    with Load(url, key=front.key) as load:
        # requests through the front's router reach the instance job's engine (its own log)
        until("a request served by the instance job's engine",
              lambda: requests_in(engine_log) >= 3, 30, why=inst.logs)
        # the newest instance job's instance is the one drained
        out = cli("scale", str(front.id), "--role", "decode", "--remove", "1",
                  "--drain-timeout", "30", "--wait")
        assert f"draining decode-0 of job {inst.id}" in out, out
        ist = inst.wait({"done", "failed", "cancelled"}, 40)
        assert mine not in _workers(url, front.key)
        served_before = load.ok_between(0, float("inf"))
        # the front serves on with its own decode alone
        until("requests after the drain", lambda: load.ok_between(0, float("inf")) >=
              served_before + 4, 20)
    assert (ist["phase"], ist["reason"]) == ("done", SCALED_IN), ist
    assert ist["instances"]["decode-0"]["status"] == "removed", ist
    # leaving on request is no failure: the job never counted itself short of an instance
    assert not {"degraded", "recovering"} & {h["phase"] for h in ist["history"]}, ist
    assert not load.failures(), load.failures()[:3]
    assert (inst.dir / "run" / "control" / "drain-decode-0.taken").exists()
    log = job_log.read_text()
    left = log.index("decode-0 removed from the router")
    settled = re.search(r"decode-0: no request in flight [\d.]+ s after it left the router", log)
    assert settled and left < settled.start(), log
    assert log.index("decode-0 removed: drained on request") > settled.start(), log
    assert front.state()["phase"] == "serving"


def test_a_cancelled_prefill_instance_job_leaves_the_front_router_before_its_engine_stops(
        front, cli):
    url = front.state()["endpoint"]
    cli("scale", str(front.id), "--role", "prefill", "--add", "1")
    inst = cli.jobs[0]
    ist = inst.wait({"serving", "failed"}, 60)
    assert ist["phase"] == "serving", inst.logs()
    mine = _worker_url(inst, "prefill-0")
    # a prefill joins as one, with its own bootstrap port (shifted with the job's port block)
    spec = json.loads((inst.dir / "plan.json").read_text())["instances"][0]
    got = _listed(url, front.key)[mine]
    assert (got["worker_type"], got["bootstrap_port"]) == ("prefill", spec["ports"]["bootstrap"])
    front_spec = json.loads((front.dir / "plan.json").read_text())["instances"][0]
    assert spec["ports"]["bootstrap"] != front_spec["ports"]["bootstrap"], (spec, front_spec)
    cli("cancel", inst.id, "--wait")  # an instance job named stops alone
    assert inst.wait({"cancelled", "failed", "done"}, 30)["phase"] == "cancelled", inst.logs()
    assert mine not in _workers(url, front.key)
    log = (inst.dir / "logs" / "hpcserve-job.log").read_text()
    assert log.index(f"prefill-0 removed from the router ({mine})") < \
        log.index("SIGTERM to prefill-0"), log
    assert front.state()["phase"] == "serving"
