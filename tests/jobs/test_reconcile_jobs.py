"""Another Unix user (hpcserve-b, scripts/setup.sh makes it) on the router's node, with the
router's worker API, which sglang-router serves to whoever reaches it when no key is set: the
worker they add (their own simulated SGLang decode, answering as an engine would, so the router
takes it) is taken out by the job's runtime and named in its log; this deployment's decode that
they take out is put back. The deployment serves on through both, from its own engines."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from hpcserve.runtime.workers import RouterWorkers
from jobkit import chat, deployment, until

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


def _workers(router: str) -> list[dict]:
    """The router's workers as sglang-router 0.3.2 lists them (GET /workers), asked by us."""
    return RouterWorkers("queued", router)._workers()


def _urls(router: str) -> list[str]:
    return [w["url"] for w in _workers(router)]


def test_a_worker_another_user_adds_is_removed_and_one_they_remove_is_put_back(
        submit, dev_cluster, shared, tmp_path):
    job = submit(deployment(1, 1, name="t-reconcile",
                            liveness={"interval": 1, "timeout": 5, "failures": 5}))
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    router = st["endpoint"]
    host = urllib.parse.urlsplit(router).hostname
    node = next(n for n, a in dev_cluster.node_addresses().items() if a == host)
    ns, ip = dev_cluster.netns_names()[node], dev_cluster.node_addresses()[node]
    for f in SIM_FILES:
        shutil.copy(job.dir / f, shared / f)
        os.chmod(shared / f, 0o644)
    evil = f"http://{ip}:31999"
    engine = _as_other(ns, "/usr/bin/python3", "-I", "-S", str(shared / "hpcserve_sim.py"),
                       "--model-path", "/models/Kimi-K2-Instruct", "--served-model-name",
                       "kimi-k2", "--host", ip, "--port", "31999",
                       "--disaggregation-mode", "decode",
                       stdout=subprocess.DEVNULL, stderr=open(tmp_path / "engine.log", "w"))
    log = job.dir / "logs" / "hpcserve-job.log"
    try:
        until("the other user's engine answering", lambda: _ask_as_other(
            ns, "GET", evil + "/health") == 200, 30, poll=0.5,
            why=lambda: (tmp_path / "engine.log").read_text()[-2000:])
        # their worker, added through the API: the router takes it (it answers its checks)...
        assert _ask_as_other(ns, "POST", router + "/workers",
                             {"url": evil, "worker_type": "decode"}) in (200, 202)
        until("the router listing their worker", lambda: evil in _urls(router), 30)
        # ...and the job's runtime takes it out, and says so
        until("the runtime removing their worker", lambda: evil not in _urls(router)
              and f"router: removed {evil}" in log.read_text(), 30,
              why=lambda: log.read_text()[-2000:])
        # this deployment's decode, taken out by them, is put back
        decode = f"http://{job.node_rows('decode-0')[0][2]}:{_port(job, 'decode-0')}"
        wid = next(w["id"] for w in _workers(router) if w["url"] == decode)
        assert _ask_as_other(ns, "DELETE", f"{router}/workers/{urllib.parse.quote(wid)}") in (
            200, 202, 204)
        until("the runtime putting the decode back", lambda: decode in _urls(router) and
              f"decode-0 ({decode}) was no longer listed; put back" in log.read_text(), 30,
              why=lambda: log.read_text()[-2000:])
        assert job.state()["phase"] == "serving"
        assert chat(router, 3)["usage"]["completion_tokens"] == 3
    finally:
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait(10)
