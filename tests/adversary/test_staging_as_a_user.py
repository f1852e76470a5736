"""Another user (hpcserve-b) at the staging chain of a deployment of hpcserve-a's, while it
stages: the port a cold node listens on for its upstream is open to anyone on the network, and
ss(8) shows every user which port is whose. hpcserve-b connects to it first, before the chain's
own upstream, and sends what the chain's protocol would take from a peer that lacks the job's
key: a hello, a file list whose path leaves the copy, a frame longer than any, bytes of no
protocol. Each is refused in one line naming the connection's address, and the model is staged
intact from the chain's own reader.

The window is made certain, not left to chance: until hpcserve-b has been refused, the TCP
connections that hpcserve-a's processes on node1 (the chain's reader) open to node2's ephemeral
ports are held back (an iptables rule in node1's network namespace drops their SYNs; TCP sends
the SYN again once the rule is gone, so the reader connects a few seconds late, as over a slow
network). Nothing else of the job opens such a connection while it stages.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import re
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from adversarykit import OTHER, OWNER, as_owner, listening, shared  # noqa: F401 (fixtures)
from jobkit import chat, deployment, until

pytestmark = pytest.mark.slurm

FILES = {"config.json": b'{"model_type": "kimi_k2"}',
         "model-00001-of-00001.safetensors": os.urandom(1 << 20)}

# Run by OTHER in a node's network namespace against HOST PORT, one connection per frame: each
# connection reads the 16-byte nonce the receiver sends first, sends its frame and reads until
# the receiver closes (a reset where it left bytes unread). The frames are those of the chain
# (">cQ": kind, length), tagged with 32 zero bytes for want of the key. Prints, per frame,
# [bytes received, closed by the receiver].
FRAMES = r"""
import json, socket, struct, sys
FRAME = struct.Struct(">cQ")
files = json.dumps({"files": [["../../.bashrc", 5, None]]}).encode()
frames = [FRAME.pack(b"O", 5) + b"node1" + bytes(32),
          FRAME.pack(b"H", len(files)) + files + bytes(32),
          FRAME.pack(b"D", 1 << 40),
          b"\x00\xff" * 64]
out = []
for data in frames:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30) as s:
        got = s.recv(16)
        s.sendall(data)
        try:
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        except ConnectionResetError:  # closed with bytes of ours unread: a reset, not a FIN
            pass
        out.append([len(got), True])
print(json.dumps(out))
"""
CAUSES = ["a frame of kind b'O' whose tag does not check: not from this job's chain",
          "a frame of kind b'H' whose tag does not check: not from this job's chain",
          f"a frame of kind b'D' and {1 << 40} bytes",
          "a frame of unknown kind b'\\x00'"]


@pytest.fixture
def node2_own_stage_dir(dev_cluster, shared):
    """(model, stage_dir, where node2's stage_dir really is): the nodes share one file system,
    so node2 gets a stage directory of its own (its slurmd restarted in a mount namespace with
    a bind mount, as tests/jobs/test_stage.py does); both are sticky and open to all, as a
    site's node-local scratch is."""
    model, stage_dir, local = shared / "model", shared / "stage", shared / "node2-stage"
    model.mkdir(mode=0o755)
    for rel, data in FILES.items():
        (model / rel).write_bytes(data)
        (model / rel).chmod(0o644)
    for d in (stage_dir, local):
        d.mkdir()
        d.chmod(0o1777)
    dev_cluster.crash_node("node2")
    dev_cluster.restart_node("node2", binds={str(stage_dir): str(local)})
    try:
        yield model, stage_dir, local
    finally:
        dev_cluster.crash_node("node2")
        dev_cluster.restart_node("node2")


@contextlib.contextmanager
def connections_held(dev_cluster, uid: int, src: str, dst: str) -> Iterator[None]:
    """While inside: `uid`'s TCP connections from node `src` to the ephemeral ports of node
    `dst` dropped at their SYN (src's OUTPUT, matched by the socket's owner), so a connect()
    waits and retries. Slurm's own connections for the job's steps (slurmstepd to srun, on the
    batch node `src`) go the other way or stay on `src`."""
    lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    rule = ["OUTPUT", "-p", "tcp", "--syn", "-m", "owner", "--uid-owner", str(uid),
            "-d", dev_cluster.node_addresses()[dst], "--dport", f"{lo}:{hi}",
            "-m", "comment", "--comment", "hpcserve-test-hold", "-j", "DROP"]
    ns = dev_cluster.netns_names()[src]
    subprocess.run(["ip", "netns", "exec", ns, "iptables", "-I", *rule], check=True,
                   capture_output=True, timeout=30)
    try:
        yield
    finally:
        subprocess.run(["ip", "netns", "exec", ns, "iptables", "-D", *rule], check=True,
                       capture_output=True, timeout=30)


def test_another_user_at_the_chains_port_is_refused_and_the_model_staged_intact(
        dev_cluster, node2_own_stage_dir, as_owner):
    model, stage_dir, node2_local = node2_own_stage_dir
    uid = pwd.getpwnam(OWNER).pw_uid
    nets, addrs = dev_cluster.netns_names(), dev_cluster.node_addresses()
    dep = deployment(name="t-as-a-staging", model={"path": str(model), "stage": True},
                     site={"base": "local", "paths": {"stage_dir": str(stage_dir),
                                                      "stage_max_gb": 1},
                           "slurm": {"extra_directives": {"nodelist": "node[1-2]"}}})
    dep["roles"] = {"worker": {"nodes": 2}}
    with connections_held(dev_cluster, uid, "node1", "node2"):   # the reader's, to node2
        job = as_owner(dep)
        chain = job.dir / "run" / "stage" / "chain"
        until("the stage chain", chain.exists, 120, why=job.logs)
        assert [ln.split()[0] for ln in chain.read_text().splitlines()] == ["node1", "node2"]
        # what OTHER sees of the node: a listener of OWNER's, the chain's port (its status
        # says so to the job, in a directory OTHER cannot read)
        port = int(until("node2's chain port", lambda: _cold_port(job.dir / "run" / "stage"),
                         60, why=job.logs))
        seen = subprocess.run(["nsenter", f"--net=/run/netns/{nets['node2']}", "runuser", "-u",
                               OTHER, "--", "ss", "-ltnHe"], capture_output=True, text=True,
                              timeout=30, cwd="/").stdout
        assert re.search(rf"{re.escape(addrs['node2'])}:{port}\s.*\buid:{uid}\b", seen), seen
        assert (addrs["node2"], port) in listening(nets["node2"], uid)
        # OTHER, from node3, first at the port: every frame refused, nothing but the nonce sent
        got = subprocess.run(["nsenter", f"--net=/run/netns/{nets['node3']}", "runuser", "-u",
                              OTHER, "--", "/usr/bin/python3", "-I", "-c", FRAMES,
                              addrs["node2"], str(port)], capture_output=True, text=True,
                             timeout=120, cwd="/")
        assert got.returncode == 0, got
        assert got.stdout.strip() == "[[16, true], [16, true], [16, true], [16, true]]", got
        log = job.dir / "logs" / "stage-0.log"
        refused = until("node2's four refusals", lambda: _refusals(log, addrs["node3"]), 60,
                        why=lambda: log.read_text(errors="replace"))
    assert refused == CAUSES, refused     # one line each, naming node3's address and why

    st = job.wait({"serving", "failed", "cancelled"}, 180)
    assert st["phase"] == "serving", job.logs()
    stage = st["stage"]
    assert stage["reader"] == "node1" and stage["shared_bytes_read"] == stage["model_bytes"], \
        stage
    assert {n: r["outcome"] for n, r in stage["nodes"].items()} == \
        {"node1": "copied", "node2": "copied"}, stage
    # node2's copy is the model's own bytes, received over the chain from node1
    staged = Path(stage["path"])
    assert staged.parent == stage_dir / OWNER, staged
    copy = node2_local / OWNER / staged.name    # where node2's stage_dir really is
    for rel, data in FILES.items():
        assert hashlib.sha256((copy / rel).read_bytes()).digest() == \
            hashlib.sha256(data).digest(), rel
    assert not list(node2_local.rglob(".bashrc")) and not list(stage_dir.rglob(".bashrc"))
    assert len(_refusals(log, addrs["node3"])) == 4     # and nothing of OTHER's got further
    assert chat(st["endpoint"], 3, key=job.key)["usage"]["completion_tokens"] == 3


def _cold_port(stage_run: Path) -> str | None:
    try:
        words = (stage_run / "status" / "node2").read_text().split()
    except OSError:
        return None
    return words[1] if words[:1] == ["cold"] else None


def _refusals(log: Path, addr: str) -> list[str] | None:
    """The causes of node2's refusals of connections from `addr`, in order; None before four."""
    found = re.findall(rf"node2: refused a connection from {re.escape(addr)}:\d+ to the "
                       r"chain port: (.*)", log.read_text(errors="replace"))
    return found if len(found) >= 4 else None
