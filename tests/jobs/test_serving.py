"""PD deployments reach `serving` on the real test cluster and answer through the real router."""

from __future__ import annotations

import re
import time

import pytest

from jobkit import chat, check_startup, deployment, wait_no_job_processes

pytestmark = pytest.mark.slurm

ORDER = ["starting", "engines_ready", "router_ready", "serving"]


def _phases(st: dict) -> list[str]:
    return [h["phase"] for h in st["history"]]


@pytest.mark.parametrize("p_nodes,d_nodes", [(1, 1), (2, 2), (1, 2)], ids=["1P1D", "1P2+1D2", "1P+1D2"])
def test_pd_deployment_serves_and_answers(submit, dev_cluster, p_nodes, d_nodes):
    # a simulated load time, so that the engines' phases are no mere instants
    job = submit(deployment(p_nodes, d_nodes, name=f"t-{p_nodes}p{d_nodes}d",
                            engine={"sim_startup_delay": 0.5}))
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    # written as it starts serving, then Slurm's queue wait beside it
    # (SGLang 0.5.23's lines, printed by its stand-in)
    check_startup(job.wait_until(lambda s: (s.get("startup") or {}).get("queue_wait_s")
                                 is not None, 10), job.dir, "Load weight end. ")
    # state.json told the truth at each phase, in order, with the endpoint once the router was up
    assert _phases(st) == ORDER
    assert st["engines_ready_count"] == st["engines_total"] == 2
    addrs = dev_cluster.node_addresses()
    # the router runs on the prefill head node, which is the first node of component 0
    assert st["endpoint"] == f"http://{addrs['node1']}:8000"
    # the decode instance's nodes received ranks 0..n-1 and the leader's address
    rows = job.node_rows("decode-0")
    assert [r[0] for r in rows] == [str(i) for i in range(d_nodes)]
    for r in rows:
        log = (job.dir / "logs" / f"decode-0.node{r[0]}.{r[1]}.log").read_text()
        assert f"node-rank {r[0]} on {r[1]} ({r[2]}), leader {rows[0][2]}" in log

    resp = chat(st["endpoint"], 7, key=job.key)
    assert resp["usage"]["completion_tokens"] == 7
    assert resp["choices"][0]["message"]["content"].strip()
    events = chat(st["endpoint"], 5, stream=True, key=job.key)
    pieces = [e["choices"][0]["delta"].get("content") for e in events if e.get("choices")]
    assert len([p for p in pieces if p]) == 5
    assert [e["usage"]["completion_tokens"] for e in events if e.get("usage")][-1] == 5

    t0 = time.time()
    job.scancel()
    st = job.wait({"cancelled", "failed", "done"}, 20)
    assert st["phase"] == "cancelled" and st["reason"] == "cancelled"
    gone = wait_no_job_processes(dev_cluster, 10 + 2)  # the local site's grace is 10 s
    assert time.time() - t0 < 12 + 2, gone


def test_router_api_key_given_by_name_guards_the_endpoint(submit, dev_cluster, monkeypatch):
    # The key reaches the router from the job's environment only ({from_env}); the job's own
    # smoke request must present it, and a client without it is turned away.
    import json
    import urllib.error
    import urllib.request
    monkeypatch.setenv("HS_TEST_ROUTER_KEY", "k-123-not-in-any-file")
    dep = deployment(1, 1, name="t-apikey")
    dep["router"]["args"] = {"api-key": {"from_env": "HS_TEST_ROUTER_KEY"}}
    job = submit(dep)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving" and st["smoke_tokens"] > 0, job.logs()
    # in no file of the job directory (its logs too), but for the engines' own logs: the router
    # hands its key to the engines, which ask it too, and SGLang 0.5.23 logs its server_args,
    # the key with them (sglang/srt/entrypoints/engine.py). Those logs are the owner's alone.
    import subprocess
    holders = sorted(p.name for p in job.dir.rglob("*")
                     if p.is_file() and "k-123-not-in-any-file" in p.read_text(errors="replace"))
    assert holders and all(re.fullmatch(r"(prefill|decode)-0\.node0\.[^/]+\.log", h)
                           for h in holders), holders
    for h in holders:
        (log,) = job.dir.rglob(h)
        assert log.stat().st_mode & 0o077 == 0, oct(log.stat().st_mode)
        other = subprocess.run(["runuser", "-u", "hpcserve-b", "--", "cat", str(log)],
                               capture_output=True, text=True, timeout=30)
        assert other.returncode != 0 and "Permission denied" in other.stderr, other
    # nor on any command line: `ps` as another user of the nodes (hpcserve-b, a real second
    # Unix user) sees the job's processes, none with it (the router ran under secret_argv.py,
    # and names itself sglang::router once it runs)
    ps = subprocess.run(["runuser", "-u", "hpcserve-b", "--", "ps", "-eo", "args"],
                        capture_output=True, text=True, timeout=30)
    assert ps.returncode == 0, ps
    assert [ln for ln in ps.stdout.splitlines() if str(job.dir) in ln], ps.stdout[-2000:]
    assert "k-123" not in ps.stdout
    launch = (job.dir / "launch" / "router.sh").read_text()
    assert "secret_argv.py" in launch and "export HPCSERVE_SECRET_ARGS" in launch
    body = json.dumps({"model": "kimi-k2", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(st["endpoint"] + "/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401
