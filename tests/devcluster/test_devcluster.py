"""The dev cluster is a real Slurm cluster: het jobs, pmix, per-node addresses, clean teardown."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcserve.devcluster.cli import dev_cluster as dev_cluster_cli
from hpcserve.devcluster.cluster import DevCluster, DevClusterError

PY = sys.executable
CLI = [PY, "-c", "from hpcserve.devcluster.cli import dev_cluster; dev_cluster()"]

# Runs inside a task: reports the node Slurm says it is on and every IPv4 address it can see, read
# with the SIOCGIFADDR ioctl so the job needs nothing but Python.
PROBE = r'''
import fcntl, json, os, socket, struct, sys

def addr(name):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            raw = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(raw[20:24])

ifs = {name: addr(name) for _, name in socket.if_nameindex()}
rec = {"node": os.environ.get("SLURMD_NODENAME"), "ifs": {k: v for k, v in ifs.items() if v}}
if len(sys.argv) > 2 and sys.argv[2] == "mpi":
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rec.update(rank=comm.rank, size=comm.size)
    rec["gathered"] = comm.allgather({"rank": comm.rank, "node": rec["node"], "ip": ifs.get("eth0")})
else:
    rec["het_size"] = os.environ.get("SLURM_HET_SIZE")
print("PROBE " + sys.argv[1] + " " + json.dumps(rec), flush=True)
'''


def _run_batch(script: str, env: dict[str, str], out: Path, timeout: float = 90) -> dict[str, list[dict]]:
    """sbatch --wait the script; return the PROBE records by tag, failing with the job's output."""
    path = out.with_suffix(".sbatch")
    path.write_text(script)
    cp = subprocess.run(["sbatch", "--wait", str(path)], env=env, capture_output=True, text=True,
                        timeout=timeout)
    text = out.read_text() if out.exists() else "(no output file)"
    assert cp.returncode == 0, f"sbatch --wait rc={cp.returncode}\n{cp.stderr}\n--- job output ---\n{text}"
    records: dict[str, list[dict]] = {}
    for line in text.splitlines():
        if line.startswith("PROBE "):
            _, tag, payload = line.split(" ", 2)
            records.setdefault(tag, []).append(json.loads(payload))
    return records


@pytest.mark.slurm
def test_het_job_groups_run_on_distinct_nodes_with_their_own_addresses(dev_cluster, slurm_env, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "het.out"
    py, pr = shlex.quote(PY), shlex.quote(str(probe))
    recs = _run_batch(f"""#!/bin/bash
#SBATCH --job-name=hs-het-test
#SBATCH --output={out}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH hetjob
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
set -euo pipefail
{py} {pr} batch
srun --het-group=0 {py} {pr} g0
srun --het-group=1 {py} {pr} g1
""", slurm_env, out)
    addrs = dev_cluster.node_addresses()
    assert len(recs.get("batch", [])) == 1 and len(recs.get("g0", [])) == 1, recs
    assert len(recs.get("g1", [])) == 2, recs
    (batch,), (g0,) = recs["batch"], recs["g0"]
    g1 = recs["g1"]
    assert batch["het_size"] == "2"
    # The batch script runs on group 0's node, inside that node's namespace.
    assert batch["node"] == g0["node"]
    assert batch["ifs"] == {"lo": "127.0.0.1", "eth0": addrs[g0["node"]]}
    g1_nodes = {r["node"] for r in g1}
    assert len(g1_nodes) == 2 and g0["node"] not in g1_nodes, (g0, g1)
    for rec in [g0, *g1]:
        # Only lo and its own eth0: each task sees its node's namespace, not the host's network.
        assert rec["ifs"] == {"lo": "127.0.0.1", "eth0": addrs[rec["node"]]}, rec
    ips = [r["ifs"]["eth0"] for r in [g0, *g1]]
    assert len(set(ips)) == 3


@pytest.mark.slurm
def test_each_node_runs_its_tasks_on_a_core_of_its_own(dev_cluster, slurm_env):
    # An engine that binds its threads to the CPUs it may use (vLLM's CPU backend) must see one
    # per node, as on separate machines, not every node on core 0.
    cores = sorted(os.sched_getaffinity(0))
    seen = {}
    for i, node in enumerate(["node1", "node2", "node3"]):
        out = subprocess.run(["srun", "-p", "local", "-w", node, "-N1", "grep",
                              "Cpus_allowed_list", "/proc/self/status"], env=slurm_env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        seen[node] = out.split()[-1]
        assert seen[node] == str(cores[i % len(cores)]), (node, out)
    if len(cores) > 1:
        assert seen["node1"] != seen["node2"]


@pytest.mark.slurm
def test_srun_mpi_pmix_allgathers_every_nodes_address(dev_cluster, slurm_env, tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "mpi.out"
    recs = _run_batch(f"""#!/bin/bash
#SBATCH --job-name=hs-pmix-test
#SBATCH --output={out}
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
srun --mpi=pmix {shlex.quote(PY)} {shlex.quote(str(probe))} mpi mpi
""", slurm_env, out)
    addrs = dev_cluster.node_addresses()
    ranks = recs.get("mpi", [])
    assert sorted(r["rank"] for r in ranks) == [0, 1], recs
    assert all(r["size"] == 2 for r in ranks)
    expected = sorted(({"rank": r["rank"], "node": r["node"], "ip": addrs[r["node"]]} for r in ranks),
                      key=lambda d: d["rank"])
    assert len({r["node"] for r in ranks}) == 2
    for r in ranks:
        assert r["gathered"] == expected, r


def _links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines()}


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _start_time(pid: int) -> int | None:
    """Start time of a live (non-zombie) process; None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    return None if fields[0] in "ZX" else int(fields[19])


def _pids_in(netns: set[str]) -> dict[int, int]:
    ids = {(st.st_dev, st.st_ino) for st in (os.stat(f"/run/netns/{ns}") for ns in netns)}
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = os.stat(f"/proc/{entry}/ns/net")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in ids and (start := _start_time(int(entry))) is not None:
                found[int(entry)] = start
    return found


def _children_of(parents: dict[int, int]) -> dict[int, int]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
            if ppid in parents and (start := _start_time(int(entry))) is not None:
                found[int(entry)] = start
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


@pytest.mark.slurm
def test_up_then_down_leaves_nothing_behind(devcluster_slot, devcluster_subnet):
    """A separate 2-node cluster through the CLI: up (twice), a job left running, down."""
    k = devcluster_slot
    sd = f"/tmp/hpcserve-pytest-{k}/small"  # its own slot-scoped dir, subnet and prefix
    prefix = f"hsd{k}"
    cluster = DevCluster(sd)
    cluster.down()  # leftovers of an earlier, killed session in this slot
    subnet = devcluster_subnet(252)
    net = subnet.rsplit(".", 1)[0]
    opts = ["--state-dir", sd, "--nodes", "2", "--subnet", subnet, "--prefix", prefix]
    links_before, ns_before = _links(), _netns()
    ours = {f"{prefix}-br0", f"{prefix}-v1", f"{prefix}-v2"}
    our_ns = {f"{prefix}-n1", f"{prefix}-n2"}
    assert not (links_before & ours) and not (ns_before & our_ns)
    try:
        up = subprocess.run([*CLI, "up", *opts], capture_output=True, text=True, timeout=60)
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"export SLURM_CONF={sd}/slurm.conf" in up.stdout
        assert ours <= _links() and our_ns <= _netns()
        daemons = cluster.recorded_pids()
        assert set(daemons) == {"munged", "slurmctld", "slurmd:node1", "slurmd:node2"}
        # requests are authenticated as a site's are, by the cluster's own munged and key
        conf = subprocess.run(["scontrol", "show", "config"], env=cluster.client_env(),
                              capture_output=True, text=True, timeout=30).stdout
        assert re.search(r"^AuthType\s+= auth/munge$", conf, re.M), conf
        assert re.search(rf"^AuthInfo\s+= .*socket={re.escape(sd)}/munge/munge.socket", conf,
                         re.M), conf
        daemon_starts = {pid: _start_time(pid) for pid in daemons.values()}
        assert None not in daemon_starts.values()

        again = subprocess.run([*CLI, "up", *opts], capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr
        assert cluster.recorded_pids() == daemons

        st = subprocess.run([*CLI, "status", "--state-dir", sd, "--json"], capture_output=True, text=True)
        assert st.returncode == 0, st.stdout + st.stderr
        info = json.loads(st.stdout)
        assert info["healthy"] and info["controller"]["pid"] == daemons["slurmctld"]
        assert [(n["name"], n["state"], n["address"]) for n in info["nodes"]] == [
            ("node1", "idle", f"{net}.11"), ("node2", "idle", f"{net}.12")]
        env = subprocess.run([*CLI, "env", "--state-dir", sd], capture_output=True, text=True)
        assert env.stdout == (f"export SLURM_CONF={shlex.quote(sd + '/slurm.conf')}\n"
                              "export OMPI_MCA_btl='^vader'\n")

        # A job still running at `down` must not survive it.
        sub = subprocess.run(["sbatch", "--parsable", "-N2", "-o", "/dev/null", "--wrap", "srun sleep 600"],
                             env=cluster.client_env(), capture_output=True, text=True, timeout=30)
        assert sub.returncode == 0, sub.stderr
        deadline = time.monotonic() + 30
        while True:
            in_ns = _pids_in(our_ns)
            sleeps = [p for p in in_ns if os.path.basename(_cmdline(p)[0]) == "sleep"]
            if len(sleeps) >= 2:
                break
            assert time.monotonic() < deadline, f"job's sleep never started: {in_ns}"
            time.sleep(0.2)
        # Everything the cluster runs: its daemons, their children (slurmscriptd), the job's processes.
        everything = {**in_ns, **daemon_starts, **_children_of(daemon_starts)}
        assert len(everything) > len(daemons) + 2

        down = subprocess.run([*CLI, "down", "--state-dir", sd], capture_output=True, text=True, timeout=60)
        assert down.returncode == 0, down.stdout + down.stderr
        survivors = {pid: _cmdline(pid) for pid, start in everything.items() if _start_time(pid) == start}
        assert survivors == {}
        links_after, ns_after = _links(), _netns()
        assert not (links_after & ours) and not (ns_after & our_ns)
        # Nothing else new either, except what other dev clusters (other pytest sessions, a user's
        # demo cluster) may have created meanwhile under their own prefixes.
        others = re.compile(rf"(?!{prefix}-)[a-z][a-z0-9]*-(br0|n[0-9]+|v[0-9]+)$")
        assert {n for n in links_after - links_before if not others.match(n)} == set()
        assert {n for n in ns_after - ns_before if not others.match(n)} == set()
        left = sorted(p.name for p in Path(sd).iterdir())
        assert left == [".lock", "log"], left  # logs stay for post-mortems, runtime files go

        again_down = subprocess.run([*CLI, "down", "--state-dir", sd], capture_output=True, text=True)
        assert again_down.returncode == 0 and "no dev cluster is up" in again_down.stdout
        st = subprocess.run([*CLI, "status", "--state-dir", sd], capture_output=True, text=True)
        assert st.returncode == 1 and "no dev cluster is up" in st.stdout
    finally:
        cluster.down()


def test_missing_programs_error_says_what_to_install(tmp_path):
    sd = tmp_path / "dc"
    with pytest.raises(DevClusterError) as err:
        DevCluster(sd, path="").up()
    msg = str(err.value)
    assert "apt-get install -y slurmctld slurmd slurm-client util-linux iproute2" in msg, msg
    assert not sd.exists(), "preflight must fail before anything is created"

    fake = tmp_path / "nope" / "slurmd"
    with pytest.raises(DevClusterError) as err:
        DevCluster(sd, binaries={"slurmd": str(fake), "ip": None}).up()
    msg = str(err.value)
    assert "missing program(s): slurmd, ip" in msg
    assert "apt-get install -y slurmd iproute2" in msg, msg
    assert not sd.exists()


def test_cli_reports_not_root_with_exit_2_and_no_traceback(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(dev_cluster_cli, ["up", "--state-dir", str(tmp_path / "dc")])
    assert result.exit_code == 2, result.output
    assert "must be started as root" in result.output and "sudo" in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_names_longer_than_the_kernel_allows_are_rejected(tmp_path):
    with pytest.raises(DevClusterError, match="longer than 15"):
        DevCluster(tmp_path, prefix="averylongprefix").node_addresses()
    assert DevCluster("/tmp/x", nodes=2, subnet="10.9.8.0/24").node_addresses() == {
        "node1": "10.9.8.11", "node2": "10.9.8.12"}


def test_cli_module_imports_without_the_cluster_logic():
    code = "import sys, hpcserve.devcluster.cli; print('hpcserve.devcluster.cluster' in sys.modules)"
    cp = subprocess.run([PY, "-c", code], capture_output=True, text=True, check=True)
    assert cp.stdout.strip() == "False"
