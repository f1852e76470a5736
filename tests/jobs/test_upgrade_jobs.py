"""`hpcserve upgrade` on the real test cluster with the real sglang-router: a plain (worker)
deployment of simulated SGLang 0.5.22, the front's own instance and an instance job's, moved to
0.5.23 one instance at a time under steady load through the front's router: no failed request,
every instance the router lists at the end reports 0.5.23 (its own /get_server_info), every old
one was drained (the instance job ended "done" by it), and the front's deployment.yaml names the
new release."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest

from hpcserve import config
from hpcserve.runtime.contract import SCALED_IN
from jobkit import Job, Load, deployment, until
from test_attach import FAST, _listed, cli  # noqa: F401  (cli: a fixture on this module's front)

pytestmark = pytest.mark.slurm

OLD, NEW = "0.5.22", "0.5.23"   # two releases the SGLang adapter knows


@pytest.fixture
def front(submit):
    """A serving front job: one simulated SGLang 0.5.22 worker instance, sglang-router."""
    d = deployment(name="t-upgrade", liveness=FAST,
                   engine={"name": "sglang", "version": OLD, "simulate": True,
                           "sim_decode_s_per_token": 0.02})
    d["roles"] = {"worker": {"nodes": 1}}
    job = submit(d)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    return job


def _release(worker_url: str) -> str:
    """The release an engine says it runs (SGLang's /get_server_info)."""
    with urllib.request.urlopen(worker_url + "/get_server_info", timeout=5) as r:
        return json.load(r)["version"]


def test_a_rolling_upgrade_under_load_fails_no_request_and_ends_on_the_new_release(front, cli):
    url = front.state()["endpoint"]
    cli("scale", front.id, "--role", "worker", "--add", "1")
    (scaled,) = cli.jobs
    assert scaled.wait({"serving", "failed"}, 60)["phase"] == "serving", scaled.logs()
    before = set(_listed(url))
    assert len(before) == 2 and {_release(w) for w in before} == {OLD}, before
    with Load(url) as load:
        out = cli("upgrade", front.id, "--set", f"engine.version={NEW}", "--drain-timeout", "30",
                  "--start-timeout", "60")
        # one surge job per old instance (cancelled at the end as the fixture's are)
        surges = [Job(front.cluster, Path(d), j, front.env)
                  for j, d in re.findall(r"surge job (\d+) at .* \((\S+)\)$", out, re.M)]
        cli.jobs.extend(surges)
        done_at = time.time()
        # the router serves on once the upgrade returned, from the new instances alone
        until("requests after the upgrade", lambda: load.ok_between(done_at, 1e12) >= 4, 20)
    assert not load.failures(), (load.failures()[:3], out)
    assert len(surges) == 2, out
    said = out.splitlines()
    assert said[0].startswith(f"[1/2] worker-0 of job {front.id}: surge job {surges[0].id} at "
                              f"SGLang {NEW}"), out
    assert f"[2/2] job {surges[1].id} serves: draining worker-0 of job {scaled.id}" in said, out
    # every instance the router lists now is a new one, and says it runs the new release
    after = _listed(url)
    assert len(after) == 2 and not set(after) & before, (after, before)
    assert {w: _release(w) for w in after} == dict.fromkeys(after, NEW)
    for s in surges:
        st = s.state()
        assert st["phase"] == "serving" and st["instances"]["worker-0"]["status"] == "serving"
        log = (s.dir / st["startup"]["instances"]["worker-0"]["log"]).read_text()
        assert re.search(rf"hpcserve simulated SGLang {re.escape(NEW)} ", log), log[:500]
    # the old ones left by their drain: the instance job ended "done", the front's own removed
    st = scaled.wait({"done", "failed", "cancelled"}, 30)
    assert (st["phase"], st["reason"]) == ("done", SCALED_IN), st
    fst = front.state()
    assert fst["phase"] == "serving" and fst["instances"]["worker-0"]["status"] == "removed"
    assert "worker-0 removed: drained on request" in (front.dir / "logs" /
                                                      "hpcserve-job.log").read_text()
    # later `scale --add` starts the new release: the front's deployment file says it
    assert config.load(front.dir / config.SOURCE_FILE).deployment.engine.version == NEW
    assert f"upgraded 2 instance(s) of t-upgrade to SGLang {NEW}" in said[-1], out
