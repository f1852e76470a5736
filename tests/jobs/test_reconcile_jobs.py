"""Another Unix user (hpcserve-b, scripts/setup.sh makes it) on the router's node, with the
router's worker API. sglang-router holds the deployment's API key, made at submit: they are
turned away (401) from its worker API and its endpoint, and the router lists what it listed.
vllm-router 0.1.17 asks no key of its worker API: the worker they add there (their own simulated
vLLM, answering as an engine would, so the router takes it) is taken out by the job's runtime and
named in its log; this deployment's worker that they take out is put back. The deployment
serves on through both, from its own engines."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
from pathlib import Path

import pytest

from hpcserve.runtime.workers import RouterWorkers
from jobkit import chat, deployment, until, vllm_deployment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adversary"))
from adversarykit import OTHER, shared  # noqa: E402,F401  (shared: a fixture)

pytestmark = pytest.mark.slurm

# what another user needs to run the stand-in: the job directory's copy (theirs to read, here)
SIM_FILES = ("hpcserve_sim.py", "hpcserve_simcore.py", "hpcserve_facts.py")


def _as_other(node_ns: str, *argv: str, **kw) -> subprocess.Popen:
    """`argv` run as OTHER on the router's node (in its network namespace)."""
    return subprocess.Popen(["nsenter", f"--net=/run/netns/{node_ns}", "runuser", "-u", OTHER,
                             "--", *argv], cwd="/", start_new_session=True, **kw)


def _ask_as_other(node_ns: str, method: str, url: str, body: dict | None = None) -> int:
    """One HTTP call made by OTHER: its status (0: nobody answered)."""
    code = ("import sys,urllib.request as u\n"
            "d=None if sys.argv[3]=='null' else sys.argv[3].encode()\n"
            "r=u.Request(sys.argv[2],d,{'Content-Type':'application/json'},method=sys.argv[1])\n"
            "o=u.build_opener(u.ProxyHandler({}))\n"
            "try:\n print(o.open(r,timeout=10).status)\n"
            "except u.HTTPError as e:\n print(e.code)\n"
            "except OSError:\n print(0)\n")  # nobody answers (yet)
    p = _as_other(node_ns, "/usr/bin/python3", "-I", "-c", code, method, url, json.dumps(body),
                  stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=30)
    return int(out.strip())


def _port(job, inst: str) -> int:
    return next(i["port"] for i in json.loads((job.dir / "plan.json").read_text())["instances"]
                if i["name"] == inst)


def _workers(router: str, kind: str = "queued", key: str | None = None) -> list[dict]:
    """The router's workers as it lists them (GET /workers), asked by us."""
    auth = {"Authorization": f"Bearer {key}"} if key else None
    return RouterWorkers(kind, router, headers=auth)._workers()


def _urls(router: str, kind: str = "queued", key: str | None = None) -> list[str]:
    return [w["url"] for w in _workers(router, kind, key)]


def _router_node(dev_cluster, router: str) -> tuple[str, str]:
    """The router's node's network namespace and address."""
    host = urllib.parse.urlsplit(router).hostname
    node = next(n for n, a in dev_cluster.node_addresses().items() if a == host)
    return dev_cluster.netns_names()[node], dev_cluster.node_addresses()[node]


CHAT = {"model": "kimi-k2", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def test_the_keyed_router_turns_another_user_away_from_its_workers_and_its_endpoint(
        submit, dev_cluster):
    job = submit(deployment(1, 1, name="t-keyed-router"))
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    router, key = st["endpoint"], job.key
    ns, _ = _router_node(dev_cluster, router)
    ours = sorted(_urls(router, key=key))
    assert len(ours) == 2, ours  # its prefill and its decode
    decode = f"http://{job.node_rows('decode-0')[0][2]}:{_port(job, 'decode-0')}"
    wid = next(w["id"] for w in _workers(router, key=key) if w["url"] == decode)
    assert _ask_as_other(ns, "GET", router + "/workers") == 401
    assert _ask_as_other(ns, "POST", router + "/workers",
                         {"url": "http://203.0.113.9:31999", "worker_type": "decode"}) == 401
    assert _ask_as_other(ns, "DELETE", f"{router}/workers/{urllib.parse.quote(wid)}") == 401
    assert _ask_as_other(ns, "POST", router + "/v1/chat/completions", CHAT) == 401
    # each engine asks it too, of whoever reaches its own port past the router
    for inst in ("prefill-0", "decode-0"):
        url = f"http://{job.node_rows(inst)[0][2]}:{_port(job, inst)}"
        assert _ask_as_other(ns, "POST", url + "/v1/chat/completions", CHAT) == 401, inst
        assert _ask_as_other(ns, "GET", url + "/health") == 200, inst  # probes stay open
    assert sorted(_urls(router, key=key)) == ours
    assert chat(router, 3, key=key)["usage"]["completion_tokens"] == 3
    with pytest.raises(urllib.error.HTTPError) as e:
        chat(router, 3)
    assert e.value.code == 401


def test_a_worker_another_user_adds_is_removed_and_one_they_remove_is_put_back(
        submit, dev_cluster, shared, tmp_path):
    job = submit(vllm_deployment({"worker": {"nodes": 1}}, name="t-reconcile",
                                 liveness={"interval": 1, "timeout": 5, "failures": 5}))
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    router = st["endpoint"]
    ns, ip = _router_node(dev_cluster, router)
    for f in SIM_FILES:
        shutil.copy(job.dir / f, shared / f)
        os.chmod(shared / f, 0o644)
    evil = f"http://{ip}:31999"
    engine = _as_other(ns, "/usr/bin/python3", "-I", "-S", str(shared / "hpcserve_sim.py"),
                       "serve", "/models/Kimi-K2-Instruct", "--served-model-name", "kimi-k2",
                       "--host", ip, "--port", "31999",
                       stdout=subprocess.DEVNULL, stderr=open(tmp_path / "engine.log", "w"))
    log = job.dir / "logs" / "hpcserve-job.log"
    try:
        until("the other user's engine answering", lambda: _ask_as_other(
            ns, "GET", evil + "/health") == 200, 30, poll=0.5,
            why=lambda: (tmp_path / "engine.log").read_text()[-2000:])
        # their worker, added through the API that asks no key: the router takes it (it
        # answers its checks)...
        assert _ask_as_other(ns, "POST", router + "/workers", {"url": evil}) == 200
        # ...and the job's runtime takes it out, and says so
        until("the runtime removing their worker", lambda: evil not in _urls(router, "direct")
              and f"router: removed {evil}" in log.read_text(), 30,
              why=lambda: log.read_text()[-2000:])
        # this deployment's worker, taken out by them, is put back
        ours = f"http://{job.node_rows('worker-0')[0][2]}:{_port(job, 'worker-0')}"
        assert ours in _urls(router, "direct")
        assert _ask_as_other(ns, "DELETE", f"{router}/workers/"
                                           f"{urllib.parse.quote(ours, safe='')}") == 200
        until("the runtime putting the worker back", lambda: ours in _urls(router, "direct")
              and f"worker-0 ({ours}) was no longer listed; put back" in log.read_text(), 30,
              why=lambda: log.read_text()[-2000:])
        assert job.state()["phase"] == "serving"
        assert chat(router, 3, key=job.key)["usage"]["completion_tokens"] == 3
        # vllm-router passes the client's key on: its engine turns a keyless request away
        assert _ask_as_other(ns, "POST", router + "/v1/chat/completions", CHAT) == 401
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait(10)
