"""A deployment that runs as an unprivileged user (hpcserve-a), not root, from sbatch to
serving, on the dev cluster's real Slurm with the real sglang-router, while another user
(hpcserve-b) attacks it: they read what they can of its job directory and its processes, and on
every node they connect to every port the deployment listens on and send it hostile frames and
well-formed requests without the key. Each attempt fails, nothing of the key is revealed, and
the deployment serves on from its own engines, with the workers it had."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import urllib.parse

import pytest

from adversarykit import (OTHER, OWNER, as_other, as_owner, listening,  # noqa: F401 (fixtures)
                          shared)
from hpcserve.runtime.workers import RouterWorkers
from jobkit import Job, chat, deployment

pytestmark = pytest.mark.slurm


# Run by OTHER in a node's network namespace against HOST:PORT: bytes no protocol of the
# deployment's speaks, a request line longer than any server reads, a body longer than it says,
# then well-formed requests without the key (or with a guessed one) for what the key guards.
# Prints, for each, the answer's status line and the start of its body, the hostile frames'
# first.
HOSTILE = 3
ATTACK = r"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
frames = [b"\x00\xff" * 4096,
          b"GET /" + b"A" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
          b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{"]
chat = {"model": "kimi-k2", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
asks = [("GET", "/workers", None, None),
        ("POST", "/workers", {"url": "http://203.0.113.9:31999", "worker_type": "decode"}, None),
        ("POST", "/v1/chat/completions", chat, None),
        ("POST", "/v1/chat/completions", chat, "guess"),
        ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}, "guess")]
def send(host, port, data):
    # [status line, the start of the body]; ["error: ..."] where nobody answered
    got = b""
    try:
        with socket.create_connection((host, int(port)), timeout=3) as s:
            s.sendall(data)
            while len(got) < 65536:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
    except OSError as e:
        if not got:
            return [f"error: {e.__class__.__name__}"]
    head, _, body = got.partition(b"\r\n\r\n")
    return [head.split(b"\r\n")[0].decode(errors="replace"), body[:60].decode(errors="replace")]
def attack(target):
    host, port = target.rsplit(":", 1)
    out = [send(host, port, f) for f in frames]
    for method, path, body, key in asks:
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
        head += f"Authorization: Bearer {key}\r\n" if key else ""
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        out.append(send(host, port, head.encode() + data))
    return out
with ThreadPoolExecutor(len(sys.argv) - 1) as pool:
    out = dict(zip(sys.argv[1:], pool.map(attack, sys.argv[1:])))
print(json.dumps(out))
"""


def _attack(ns: str, targets: list[tuple[str, int]]) -> dict[str, list[list[str]]]:
    """ATTACK on every (address, port) of one node at once, as OTHER in the node's namespace."""
    argv = [f"{'127.0.0.1' if h in ('*', '0.0.0.0') else h}:{p}" for h, p in targets]
    p = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "runuser", "-u", OTHER, "--",
                        "/usr/bin/python3", "-I", "-c", ATTACK, *argv],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert p.returncode == 0, p
    return json.loads(p.stdout)


def test_another_user_reaches_nothing_of_a_deployment_that_runs_as_its_own_user(
        dev_cluster, as_owner):
    job = as_owner(deployment(1, 1, name="t-as-a-user"))
    _attack_while_serving(dev_cluster, job, pwd.getpwnam(OWNER).pw_uid)


def test_a_stage_directory_another_user_made_first_stops_the_deployment_naming_it(
        shared, as_owner):
    """OTHER made OWNER's part of the site's stage directory before OWNER's first staging (a
    name anyone can predict: <stage_dir>/<user>): the deployment stops before any engine, its
    failure naming the directory and its owner, and nothing is written in it."""
    stage_dir = shared / "stage"
    stage_dir.mkdir(mode=0o1777)
    stage_dir.chmod(0o1777)
    model = shared / "model"
    model.mkdir(mode=0o755)
    for name, size in (("config.json", 2), ("model-00001-of-00001.safetensors", 4096)):
        (model / name).write_bytes(b"{}" if size == 2 else os.urandom(size))
        (model / name).chmod(0o644)
    theirs = stage_dir / OWNER
    as_other("sh", "-c", f"umask 022; mkdir {theirs}")
    dep = deployment(name="t-as-a-stage", model={"path": str(model), "stage": True},
                     site={"base": "local", "paths": {"stage_dir": str(stage_dir),
                                                      "stage_max_gb": 1}})
    dep["roles"] = {"worker": {"nodes": 1}}
    job = as_owner(dep)
    st = job.wait({"serving", "failed", "cancelled"}, 120)
    assert st["phase"] == "failed", job.logs()
    assert (f"{theirs} is not this user's (owner {OTHER}, mode 755)"
            in st["failure"]["detail"]), st["failure"]
    assert not [p for p in (job.dir / "logs").iterdir() if p.name.startswith("worker-")]
    assert list(theirs.iterdir()) == []


def _attack_while_serving(dev_cluster, job: Job, uid: int) -> None:
    st = job.wait({"serving", "failed", "cancelled"}, 120)
    assert st["phase"] == "serving", job.logs()
    q = subprocess.run(["squeue", "-h", "-j", job.id, "-o", "%u"], env=job.env,
                       capture_output=True, text=True, timeout=30)
    assert q.stdout.split()[0] == OWNER, q       # Slurm's record: the job is hpcserve-a's
    router, key = st["endpoint"], job.key
    auth = {"Authorization": f"Bearer {key}"}
    workers = sorted(w["url"] for w in RouterWorkers("queued", router, headers=auth)._workers())
    assert len(workers) == 2, workers            # its prefill and its decode

    # every file of the job directory, its key and logs among them: OTHER reads none, nor
    # lists the directory
    files = [str(p) for p in job.dir.rglob("*") if p.is_file()]
    assert any(f.endswith("secret/api-key") for f in files) and any("/logs/" in f for f in files)
    assert as_other("ls", str(job.dir), check=False).returncode != 0
    for f in files:
        assert as_other("cat", f, check=False).returncode != 0, f
    # the processes of the job, on every node (one process table): OTHER sees no key in them
    ps = as_other("ps", "-ww", "-eo", "user:20,args").stdout
    theirs = [ln for ln in ps.splitlines() if ln.startswith(OWNER)]
    assert any("sglang::router" in ln for ln in theirs), ps  # its process title (setproctitle)
    assert any("hpcserve_sim.py" in ln for ln in theirs), ps
    assert key not in ps
    named = [ln for ln in ps.splitlines() if str(job.dir) in ln]
    assert named and all(ln.startswith(OWNER) for ln in named), named  # not one of them root's
    # nor in their environments, which hold it (HPCSERVE_API_KEY)
    for pid in subprocess.run(["pgrep", "-u", OWNER], capture_output=True,
                              text=True).stdout.split():
        assert as_other("cat", f"/proc/{pid}/environ", check=False).returncode != 0, pid

    # every port the deployment listens on, on every node: hostile frames, then requests
    # without the key (or with a guessed one) for what it guards
    ports = {ns: listening(ns, uid) for ns in dev_cluster.netns_names().values()}
    url = urllib.parse.urlsplit(router)
    assert any((url.hostname, url.port) in lst for lst in ports.values()), (router, ports)
    assert sum(len(lst) for lst in ports.values()) >= 3, ports  # router, prefill, decode, ...
    seen: set[str] = set()
    for ns, targets in ports.items():
        for target, got in (_attack(ns, targets) if targets else {}).items():
            # what answers without the key is a refusal, or Prometheus' text on a metrics port
            # (open by design), never a completion or the worker list
            for answer in got[HOSTILE:]:
                if answer[0].startswith("HTTP/1.1 2"):
                    assert answer[1].startswith("# "), (ns, target, got)
            seen.update(a[0].split(" ")[1] for a in got if a[0].startswith("HTTP/1.1 "))
    assert {"400", "401", "413", "414"} <= seen, seen  # the frames and requests were read

    # Slurm's own separation: OTHER may not cancel, signal or requeue the job
    for argv in (["scancel", job.id], ["scancel", "--signal=TERM", job.id],
                 ["scontrol", "requeue", job.id]):
        r = as_other("env", *(f"{k}={v}" for k, v in job.env.items() if k.startswith("SLURM_")),
                     *argv, check=False)
        assert r.returncode != 0 and ("denied" in r.stderr or "not permitted" in r.stderr), r

    # and it serves on, from its own engines, with the workers it had, as hpcserve-a's job
    assert chat(router, 3, key=key)["usage"]["completion_tokens"] == 3
    assert sorted(w["url"] for w in RouterWorkers("queued", router, headers=auth)._workers()) \
        == workers
    after = job.state()
    assert after["phase"] == "serving" and after.get("restarts", 0) == 0, after
    assert key not in as_other("ps", "-ww", "-eo", "args").stdout
