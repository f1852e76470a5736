"""`hpcserve upgrade` on the real test cluster with the real sglang-router: a plain (worker)
deployment of ONE simulated SGLang instance, upgraded twice under steady load through the front's
router (0.5.21 -> 0.5.22 replaces the front's own instance by an instance job, 0.5.22 -> 0.5.23
replaces that instance job's): no failed request, which with a lone instance proves that each
surge served before its old instance was drained; the router lists only the new instance, which
reports the new release (its own /get_server_info); every old one was drained (the instance job
ended "done" by it), and the front's deployment.yaml names the new release."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from hpcserve.author import config
from hpcserve.runtime.contract import SCALED_IN
from jobkit import Job, Load, deployment, until
from test_attach import FAST, _listed, _worker_url, cli  # noqa: F401  (cli: a fixture on this module's front)

pytestmark = pytest.mark.slurm

# three releases the SGLang adapter knows: the front's own instance moves from V0 to OLD, then
# the instance job that replaced it from OLD to NEW
V0, OLD, NEW = "0.5.21", "0.5.22", "0.5.23"


@pytest.fixture
def front(submit):
    """A serving front job: one simulated SGLang 0.5.21 worker instance, sglang-router. One
    instance only: an upgrade that drained it before its replacement served would leave the
    router with no worker, and the load's requests would fail."""
    d = deployment(name="t-upgrade", liveness=FAST,
                   engine={"name": "sglang", "version": V0, "simulate": True,
                           "sim_decode_s_per_token": 0.02})
    d["roles"] = {"worker": {"nodes": 1}}
    job = submit(d)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    return job


def _release(worker_url: str, key: str) -> str:
    """The release an engine says it runs (SGLang's /get_server_info, which asks the key)."""
    req = urllib.request.Request(worker_url + "/get_server_info",
                                 headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)["version"]


def _upgrade(front: Job, cli, to: str) -> tuple[list[str], Job]:
    """`hpcserve upgrade` of the deployment to SGLang `to`: its lines and its one surge job
    (cancelled at the end as the fixture's are)."""
    out = cli("upgrade", front.id, "--set", f"engine.version={to}", "--drain-timeout", "30",
              "--start-timeout", "60")
    surges = [Job(front.cluster, Path(d), j, front.env)
              for j, d in re.findall(r"surge job (\d+) at .* \((\S+)\)$", out, re.M)]
    cli.jobs.extend(surges)
    assert len(surges) == 1, out
    said = out.splitlines()
    assert f"upgraded 1 instance(s) of t-upgrade to SGLang {to}" in said[-1], out
    return said, surges[0]


def _runs_only(url: str, surge: Job, release: str) -> None:
    """The router lists the surge job's instance alone, which says it runs `release` and whose
    own log shows it started as that release."""
    listed = _listed(url, surge.key)
    assert list(listed) == [_worker_url(surge, "worker-0")], listed
    assert _release(next(iter(listed)), surge.key) == release
    st = surge.state()
    assert st["phase"] == "serving" and st["instances"]["worker-0"]["status"] == "serving"
    log = (surge.dir / st["startup"]["instances"]["worker-0"]["log"]).read_text()
    assert re.search(rf"hpcserve simulated SGLang {re.escape(release)} ", log), log[:500]


def test_a_rolling_upgrade_of_a_lone_instance_under_load_fails_no_request(front, cli):
    """Twice, under one steady load: the front's own instance replaced by an instance job,
    then that instance job's replaced by another. With one instance at a time, a drain before
    the surge served fails requests: "no failed request" proves the order."""
    url = front.state()["endpoint"]
    assert [_release(w, front.key) for w in _listed(url, front.key)] == [V0]
    with Load(url, key=front.key) as load:
        said, first = _upgrade(front, cli, OLD)
        assert said[0].startswith(f"[1/1] worker-0 of job {front.id}: surge job {first.id} at "
                                  f"SGLang {OLD}"), said
        assert f"[1/1] job {first.id} serves: draining worker-0 of job {front.id}" in said
        _runs_only(url, first, OLD)
        said, second = _upgrade(front, cli, NEW)
        assert f"[1/1] job {second.id} serves: draining worker-0 of job {first.id}" in said
        done_at = time.time()
        # the router serves on once the upgrade returned, from the new instance alone
        until("requests after the upgrades", lambda: load.ok_between(done_at, 1e12) >= 4, 20)
    assert not load.failures(), (load.failures()[:3], said)
    assert load.ok_between(0, done_at) >= 10, len(load.results)  # the load ran throughout
    _runs_only(url, second, NEW)
    # the old ones left by their drain: the front's own removed, the instance job ended "done"
    fst = front.state()
    assert fst["phase"] == "serving" and fst["instances"]["worker-0"]["status"] == "removed"
    assert "worker-0 removed: drained on request" in (front.dir / "logs" /
                                                      "hpcserve-job.log").read_text()
    st = first.wait({"done", "failed", "cancelled"}, 30)
    assert (st["phase"], st["reason"]) == ("done", SCALED_IN), st
    # later `scale --add` starts the new release: the front's deployment file says it
    assert config.load(front.dir / config.SOURCE_FILE).deployment.engine.version == NEW
