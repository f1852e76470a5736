"""A real Slurm cluster on this machine: one slurmctld, one slurmd per node, each node in its own
network namespace with its own address on a private bridge, and a munged of its own with a new
key, which authenticates every request as a site's MUNGE does.

Why namespaces: with every slurmd on one IP, engines on two "nodes" would collide on ports and bugs
that real clusters expose (a wrong leader address, binding 127.0.0.1) would stay hidden.

Everything this module creates is recorded in <state dir>/state.json the moment it is created, so
`down` removes exactly that (and only that), even after an `up` that failed half-way. Processes are
ended by PID, and a PID is trusted only while its start time still matches the recorded one.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from hpcserve.errors import HpcserveError

STATE_DIR_ENV = "HPCSERVE_DEVCLUSTER_DIR"
DEFAULT_STATE_DIR = "/tmp/hpcserve-devcluster"
DEFAULT_SUBNET = "10.250.0.0/24"
DEFAULT_PREFIX = "hs"
# Slurm's own default MaxJobId (slurm.conf(5)): 0x03ff0000
DEFAULT_MAX_JOB_ID = 0x03FF0000
PARTITION = "local"
CPUS_PER_NODE = 2
MEMORY_PER_NODE_MB = 2000
# Node i gets host address NODE_HOST_OFFSET + i (10.250.0.11, .12, ...): easy to read next to node names.
NODE_HOST_OFFSET = 10
STATE_VERSION = 1

# name -> Debian package that provides it; the error for a missing binary names the package.
REQUIRED_BINARIES: dict[str, str] = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sinfo": "slurm-client",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "scontrol": "slurm-client",
    "nsenter": "util-linux",
    "ip": "iproute2",
    "munged": "munge",
}
# A root shell started without a login profile may lack the sbin directories where the daemons live.
_EXTRA_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_IFNAMSIZ = 15  # the kernel's limit on interface names
# sinfo base states (flags like '*' stripped) that mean a node can run jobs.
_HEALTHY_NODE_STATES = {"idle", "alloc", "mix", "comp", "resv", "plnd"}


class DevClusterError(HpcserveError):
    """A dev-cluster problem the CLI reports in a few lines (exit 2) with what to do about it."""


def default_state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR)


class DevCluster:
    """A local multi-node Slurm cluster whose files all live under `state_dir`.

    `subnet`, `prefix` (names: <prefix>-br0, <prefix>-n<i>, <prefix>-v<i>) and `bridge` let several
    clusters (a user's demo cluster and the test suite's) run side by side. `binaries` maps a
    program name to the path to use (None or a missing path counts as not installed) and `path`
    replaces the search path for the others, so preflight errors can be exercised without
    uninstalling anything. Once a cluster is up, `status`/`down`/`env` follow what state.json
    recorded, not the constructor's arguments.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        nodes: int = 4,
        subnet: str = DEFAULT_SUBNET,
        prefix: str = DEFAULT_PREFIX,
        bridge: str | None = None,
        *,
        binaries: Mapping[str, str | None] | None = None,
        path: str | None = None,
        timeout: float = 30.0,
        pin_cpus: bool = True,
        topology: Mapping[str, str] | None = None,
        job_ids: range = range(1, DEFAULT_MAX_JOB_ID + 1),
    ) -> None:
        self.state_dir = Path(state_dir) if state_dir is not None else default_state_dir()
        self.state_dir = Path(os.path.abspath(self.state_dir))
        self.nodes = int(nodes)
        self.pin_cpus = pin_cpus
        self.subnet = subnet
        self.prefix = prefix
        self.bridge = bridge or f"{prefix}-br0"
        self.binaries_override = dict(binaries or {})
        self.path = path
        self.timeout = float(timeout)
        # leaf switch -> its nodes (a hostlist): Slurm's topology/tree over them; None: none
        self.topology = dict(topology) if topology else None
        # Slurm's FirstJobId and MaxJobId: clusters up side by side on one machine (one per test
        # session) give out disjoint job ids, as separate sites do, so nothing keyed by the job
        # id (a node's per-job scratch directory) is shared between them through this machine's
        # /tmp
        self.job_ids = job_ids

    # ------------------------------------------------------------------ paths and naming
    @property
    def conf_path(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def state_path(self) -> Path:
        return self.state_dir / "state.json"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    def _layout(self) -> dict[str, Any]:
        """Names and addresses: from state.json when a cluster is recorded, else from the arguments."""
        state = self._load_state()
        if state is not None:
            return state["layout"]
        return self._planned_layout()

    def _job_ids(self, layout: dict[str, Any]) -> range:
        return range(*layout.get("job_ids", (1, DEFAULT_MAX_JOB_ID + 1)))

    def gives_job_id(self, job_id: int) -> bool:
        """Whether `job_id` is one this cluster gives out (FirstJobId to MaxJobId)."""
        return job_id in self._job_ids(self._layout())

    def _planned_layout(self) -> dict[str, Any]:
        self._validate_args()
        net = ipaddress.ip_network(self.subnet)
        names = [f"node{i}" for i in range(1, self.nodes + 1)]
        return {
            "nodes": names,
            "subnet": str(net),
            "prefixlen": net.prefixlen,
            "bridge": self.bridge,
            "bridge_addr": str(net[1]),
            "netns": {n: f"{self.prefix}-n{i}" for i, n in enumerate(names, 1)},
            "veth": {n: f"{self.prefix}-v{i}" for i, n in enumerate(names, 1)},
            "addr": {n: str(net[NODE_HOST_OFFSET + i]) for i, n in enumerate(names, 1)},
            "job_ids": [self.job_ids.start, self.job_ids.stop],
        }

    def _validate_args(self) -> None:
        if self.nodes < 1:
            raise DevClusterError(f"--nodes must be at least 1, got {self.nodes}")
        try:
            net = ipaddress.ip_network(self.subnet)
        except ValueError as e:
            raise DevClusterError(f"subnet {self.subnet!r} is not a network like 10.250.0.0/24: {e}") from None
        if net.version != 4:
            raise DevClusterError(f"subnet {self.subnet!r} must be IPv4")
        if net.num_addresses - 2 < NODE_HOST_OFFSET + self.nodes:
            raise DevClusterError(
                f"subnet {net} is too small for {self.nodes} nodes "
                f"(node i gets host address {NODE_HOST_OFFSET}+i); use a /24")
        if not re.fullmatch(r"[a-z][a-z0-9]*", self.prefix):
            raise DevClusterError(f"prefix {self.prefix!r} must be lowercase letters and digits, starting with a letter")
        for name in (self.bridge, f"{self.prefix}-n{self.nodes}", f"{self.prefix}-v{self.nodes}"):
            if len(name) > _IFNAMSIZ or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                raise DevClusterError(
                    f"interface/namespace name {name!r} is invalid or longer than {_IFNAMSIZ} characters; "
                    "choose a shorter prefix/bridge")
        # slurm.conf has no quoting, and pmix puts unix sockets under TmpFS (108-byte path limit).
        sd = str(self.state_dir)
        if re.search(r"[\s#%\"'\\]", sd):
            raise DevClusterError(f"state dir {sd!r} must not contain spaces, quotes, '#', '%' or backslashes")
        if len(sd) > 60:
            raise DevClusterError(
                f"state dir {sd!r} is too long ({len(sd)} > 60 characters): Slurm and PMIx put unix sockets "
                "under it and socket paths are limited to 108 bytes")

    def node_addresses(self) -> dict[str, str]:
        """{'node1': '10.250.0.11', ...}: the address each node has inside its namespace."""
        return dict(self._layout()["addr"])

    def netns_names(self) -> dict[str, str]:
        return dict(self._layout()["netns"])

    # ------------------------------------------------------------------ environment for clients
    def slurm_env(self) -> dict[str, str]:
        """What to add to a subprocess's environment so Slurm's commands talk to this cluster,
        and so that MPI jobs run on it: the nodes share one kernel, hostname and /dev/shm, where
        OpenMPI's shared-memory transport (vader) names its segments by hostname and local
        rank, so two "nodes" would map each other's segments; its TCP transport is used."""
        return {"SLURM_CONF": str(self.conf_path), "OMPI_MCA_btl": "^vader"}

    def env(self) -> str:
        """Shell lines for `eval`, pointing Slurm's commands at this cluster."""
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.slurm_env().items())

    def client_env(self) -> dict[str, str]:
        """os.environ for running Slurm's commands against this cluster (e.g. subprocess env=).

        SLURM_*/S*_ variables of the caller are dropped: inside a real Slurm job, an inherited
        SLURM_JOB_ID would make srun think it already has an allocation here.
        """
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SINFO_", "SQUEUE_", "SBATCH_", "SRUN_", "SALLOC_"))}
        env["PATH"] = (env.get("PATH", "") + ":" + _EXTRA_PATH).lstrip(":")
        env.update(self.slurm_env())
        return env

    def _daemon_env(self) -> dict[str, str]:
        # Daemons get a fixed environment so a cluster behaves the same whoever started it.
        return {"PATH": _EXTRA_PATH, "LANG": "C.UTF-8", "HOME": "/root", **self.slurm_env()}

    # ------------------------------------------------------------------ preflight
    def resolve_binaries(self) -> tuple[dict[str, str], list[str]]:
        """(found name -> absolute path, missing names)."""
        search = self.path if self.path is not None else (os.environ.get("PATH", "") + ":" + _EXTRA_PATH)
        found: dict[str, str] = {}
        missing: list[str] = []
        for name in REQUIRED_BINARIES:
            if name in self.binaries_override:
                cand = self.binaries_override[name]
                if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
                    found[name] = os.path.abspath(cand)
                else:
                    missing.append(name)
                continue
            hit = shutil.which(name, path=search) if search else None
            if hit:
                found[name] = os.path.abspath(hit)
            else:
                missing.append(name)
        return found, missing

    def preflight(self) -> dict[str, str]:
        """Check for root and the programs `up` needs; raise one error that says what to run."""
        problems: list[str] = []
        if os.geteuid() != 0:
            problems.append(
                "the dev cluster must be started as root (it creates network namespaces and runs "
                "slurmctld/slurmd as root): run it with sudo, e.g. "
                "`sudo \"$(command -v hpcserve)\" dev-cluster up`")
        found, missing = self.resolve_binaries()
        if missing:
            pkgs = list(dict.fromkeys(REQUIRED_BINARIES[m] for m in missing))
            problems.append(
                f"missing program(s): {', '.join(missing)}. Install them with: "
                f"sudo apt-get update && sudo apt-get install -y {' '.join(pkgs)}  "
                "(or run scripts/setup.sh as root, which installs everything hpcserve needs)")
        if problems:
            raise DevClusterError("cannot start the dev cluster:\n  - " + "\n  - ".join(problems))
        return found

    # ------------------------------------------------------------------ state file
    def _load_state(self) -> dict[str, Any] | None:
        try:
            text = self.state_path.read_text()
        except FileNotFoundError:
            return None
        try:
            state = json.loads(text)
            if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
                raise ValueError(f"not a version-{STATE_VERSION} state file")
            return state
        except ValueError as e:
            raise DevClusterError(
                f"{self.state_path} is unreadable ({e}); inspect it, remove what it lists by hand, then delete it"
            ) from None

    def _save_state(self, state: dict[str, Any]) -> None:
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.state_path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise up/down on one state dir (two `up`s at once would fight over the same names)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def recorded_pids(self) -> dict[str, int]:
        """Every daemon PID this cluster started, by role ('slurmctld', 'slurmd:node1', ...)."""
        state = self._load_state() or {}
        return {k: v["pid"] for k, v in state.get("pids", {}).items()}

    # ------------------------------------------------------------------ commands
    def _run(self, argv: list[str], *, check: bool = True, timeout: float = 15.0,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        try:
            cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise DevClusterError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s") from None
        if check and cp.returncode != 0:
            raise DevClusterError(
                f"`{shlex.join(argv)}` failed (exit {cp.returncode}): {(cp.stderr or cp.stdout).strip()}")
        return cp

    def _ip(self, bins: Mapping[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run([bins["ip"], *args], check=check)

    # ------------------------------------------------------------------ up
    def up(self) -> dict[str, Any]:
        """Start the cluster and wait until every node is idle; idempotent on a healthy cluster.

        Returns status() plus 'already_up' and 'elapsed_s'.
        """
        t0 = time.monotonic()
        bins = self.preflight()
        planned = self._planned_layout()  # validates the arguments before anything is created
        with self._locked():
            state = self._load_state()
            if state is not None:
                health = self._health(state, bins)
                if health["healthy"]:
                    if state["layout"] != planned:
                        raise DevClusterError(
                            f"a different dev cluster is already up in {self.state_dir} "
                            f"({len(state['layout']['nodes'])} nodes on {state['layout']['subnet']}); "
                            f"run `hpcserve dev-cluster down --state-dir {shlex.quote(str(self.state_dir))}` first")
                    return {**self.status(), "already_up": True, "elapsed_s": time.monotonic() - t0}
                # Leftovers of a crashed cluster or half-finished up: clear them, then start afresh.
                self._teardown(state, bins)
            layout = planned
            self._check_no_clash(layout, bins)
            state = {"version": STATE_VERSION, "layout": layout, "created": {"bridge": None, "netns": [], "veth": []},
                     "pids": {}, "ports": {}, "hostname": _short_hostname(), "started_at": time.time(),
                     "topology": self.topology}
            self._prepare_dirs(layout)
            self._save_state(state)
            try:
                self._create_network(state, bins)
                self._start_daemons(state, bins)
                self._wait_idle(state, bins)
                self._check_node_to_node(state, bins)
            except BaseException as e:
                tail = self.log_tail()
                try:
                    self._teardown(state, bins)
                except DevClusterError as td:
                    tail += f"\n(teardown after the failure also failed: {td})"
                if isinstance(e, DevClusterError):
                    raise DevClusterError(f"{e}\nlogs (kept in {self.log_dir}):\n{tail}") from None
                raise
        return {**self.status(), "already_up": False, "elapsed_s": time.monotonic() - t0}

    def _check_no_clash(self, layout: dict[str, Any], bins: Mapping[str, str]) -> None:
        links = set(_link_names(self._ip(bins, "-o", "link", "show").stdout))
        existing_ns = set(_netns_names(self._ip(bins, "netns", "list").stdout))
        clash = sorted(({layout["bridge"], *layout["veth"].values()} & links)
                       | (set(layout["netns"].values()) & existing_ns))
        if clash:
            raise DevClusterError(
                f"{', '.join(clash)} already exist(s) but {self.state_path} does not record them: another dev "
                "cluster (another state dir) or something else uses these names. Choose another --prefix/--bridge, "
                "or stop that cluster with `hpcserve dev-cluster down --state-dir <its dir>`")
        net = ipaddress.ip_network(layout["subnet"])
        for line in self._ip(bins, "-o", "-4", "addr", "show").stdout.splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "inet":
                have = ipaddress.ip_interface(parts[3]).network
                if have.overlaps(net):
                    raise DevClusterError(
                        f"subnet {net} overlaps {parts[3]} on interface {parts[1].rstrip(':')}: choose another --subnet")

    def _prepare_dirs(self, layout: dict[str, Any]) -> None:
        # Fresh runtime dirs every time: stale slurmctld state would resurrect old jobs.
        for sub in ("spool", "tmp", "run", "log", "munge"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        (self.state_dir / "spool" / "ctld").mkdir(parents=True)
        (self.state_dir / "run").mkdir()
        self.log_dir.mkdir()
        for node in layout["nodes"]:
            # Each slurmd needs its own spool and, for pmix, its own TmpFS; slurmd won't create them.
            (self.state_dir / "spool" / node).mkdir(parents=True)
            (self.state_dir / "tmp" / node).mkdir(parents=True)

    def _create_network(self, state: dict[str, Any], bins: Mapping[str, str]) -> None:
        layout = state["layout"]
        created = state["created"]
        br = layout["bridge"]
        self._ip(bins, "link", "add", br, "type", "bridge")
        created["bridge"] = br
        self._save_state(state)
        self._ip(bins, "addr", "add", f"{layout['bridge_addr']}/{layout['prefixlen']}", "dev", br)
        self._ip(bins, "link", "set", br, "up")
        for node in layout["nodes"]:
            ns, veth, addr = layout["netns"][node], layout["veth"][node], layout["addr"][node]
            self._ip(bins, "netns", "add", ns)
            created["netns"].append(ns)
            self._save_state(state)
            self._ip(bins, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            created["veth"].append(veth)
            self._save_state(state)
            self._ip(bins, "link", "set", veth, "master", br, "up")
            self._ip(bins, "-n", ns, "addr", "add", f"{addr}/{layout['prefixlen']}", "dev", "eth0")
            self._ip(bins, "-n", ns, "link", "set", "eth0", "up")
            self._ip(bins, "-n", ns, "link", "set", "lo", "up")
            # No default route on purpose: node traffic can only reach the bridge, never leave the machine.

    def _write_conf(self, state: dict[str, Any]) -> None:
        layout, ports, sd = state["layout"], state["ports"], self.state_dir
        host = state["hostname"]
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr={layout['addr'][n]} "
            f"CPUs={CPUS_PER_NODE} RealMemory={MEMORY_PER_NODE_MB} State=UNKNOWN"
            for n in layout["nodes"])
        nodes = ",".join(layout["nodes"])
        self.conf_path.write_text(f"""\
# Generated by `hpcserve dev-cluster up`; removed by `down`. Point clients here with SLURM_CONF.
ClusterName={_cluster_name(layout)}
FirstJobId={self._job_ids(layout).start}
MaxJobId={self._job_ids(layout).stop - 1}
SlurmctldHost={host}({layout['bridge_addr']})
SlurmctldPort={ports['slurmctld']}
SlurmdPort={ports['slurmd']}
SlurmUser=root
SlurmdUser=root
# MUNGE, as sites run Slurm: every request names the uid the kernel gave its client's munge call,
# so a user (the adversarial tests' second one) cannot claim another's. The cluster runs its own
# munged with a key of its own (munged.conf: socket=), never the machine's.
AuthType=auth/munge
CredType=cred/munge
# A requeued batch job may start again only cred_expire + 1 s later (slurmctld's requeue path
# sets its begin time so; default 120 s): 10 s lets requeue tests see the next try promptly.
AuthInfo=cred_expire=10,socket={self._munge_socket()}
StateSaveLocation={sd}/spool/ctld
# %n: several slurmd share this host, so each needs its own spool, pid file, log and TmpFS.
SlurmdSpoolDir={sd}/spool/%n
SlurmctldPidFile={sd}/run/slurmctld.pid
SlurmdPidFile={sd}/run/slurmd-%n.pid
SlurmctldLogFile={sd}/log/slurmctld.log
SlurmdLogFile={sd}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# srun --mpi=pmix puts its per-node server directories here; one shared dir makes the nodes collide.
TmpFS={sd}/tmp/%n
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Het jobs are started only by the backfill scheduler; its default 30 s interval makes them wait that long.
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
# Impossible requests fail at submit instead of pending forever.
EnforcePartLimits=ALL
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# Short KillWait keeps teardown tests fast; MinJobAge keeps finished jobs visible to squeue.
KillWait=5
# A crashed node holds its job COMPLETING (and a requeue waiting) until slurmctld calls it DOWN,
# SlurmdTimeout after its last answer (default 300 s); 15 s lets node-loss tests requeue promptly.
SlurmdTimeout=15
MinJobAge=300
ReturnToService=2
InactiveLimit=0
# Slurm complains at start-up when its default mailer is absent; the dev cluster sends no mail.
MailProg=/bin/true
{self._topology_conf(state)}{node_lines}
PartitionName={PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")

    def _topology_conf(self, state: dict[str, Any]) -> str:
        """topology.conf for topology/tree (leaf switches under one top switch, so that a job
        may still span them), and slurm.conf's line for it; nothing without a topology."""
        leaves = state.get("topology")
        path = self.state_dir / "topology.conf"
        if not leaves:
            path.unlink(missing_ok=True)
            return ""
        lines = [f"SwitchName={s} Nodes={n}" for s, n in leaves.items()]
        lines.append(f"SwitchName=top Switches={','.join(leaves)}")
        path.write_text("# Generated by hpcserve's dev cluster: topology/tree\n" + "\n".join(lines)
                        + "\n")
        return "# Leaf switches in topology.conf beside this file (topology.conf(5)).\n" \
               "TopologyPlugin=topology/tree\n"

    def set_topology(self, topology: Mapping[str, str] | None) -> None:
        """Give the running cluster topology/tree over these leaf switches (None: take it
        away): slurm.conf and topology.conf are written again and slurmctld restarts to load
        the plugin; the slurmds keep running (they route no messages by the topology)."""
        with self._locked():
            state = self._load_state()
            if state is None:
                raise DevClusterError("no dev cluster here")
            state["topology"] = dict(topology) if topology else None
            self._save_state(state)
            self._write_conf(state)
        self.stop_controller()
        self.start_controller()

    def _start_daemons(self, state: dict[str, Any], bins: Mapping[str, str]) -> None:
        layout = state["layout"]
        run_dir = self.state_dir / "run"
        ctld_port = _pick_free_port(set())
        state["ports"] = {"slurmctld": ctld_port, "slurmd": _pick_free_port({ctld_port})}
        self._write_conf(state)
        self._save_state(state)
        # Daemon mode (no -D): the daemons detach and are reaped by init, so they outlive this
        # process cleanly and leave no zombies behind in a long-lived caller such as pytest.
        self._start_munged(state, bins)
        self._launch("slurmctld", [bins["slurmctld"], "-f", str(self.conf_path)],
                     run_dir / "slurmctld.pid", state)
        for node in layout["nodes"]:
            self._start_slurmd(node, state, bins)

    def _munge_socket(self) -> str:
        return str(self.state_dir / "munge" / "munge.socket")

    def _start_munged(self, state: dict[str, Any], bins: Mapping[str, str]) -> None:
        """The cluster's own munged: a new random key (0400) in a 0700 directory, its socket in
        a directory every user may reach (the nodes share this host's file system, so one
        daemon serves them all). As root it needs --force (munged(8))."""
        d = self.state_dir / "munge"
        (d / "private").mkdir(parents=True, mode=0o700)
        d.chmod(0o755)
        key = d / "private" / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        self._launch("munged", [bins["munged"], "--force", f"--socket={self._munge_socket()}",
                                f"--key-file={key}", f"--log-file={self.log_dir}/munged.log",
                                f"--pid-file={d}/munged.pid",
                                f"--seed-file={d / 'private' / 'munged.seed'}"],
                     d / "munged.pid", state)

    def _start_slurmd(self, node: str, state: dict[str, Any], bins: Mapping[str, str],
                      binds: Mapping[str, str] | None = None) -> None:
        layout = state["layout"]
        # nsenter, not `ip netns exec`: the latter remounts /sys and slurmd then fails with
        # "No filesystem mounted on /sys/fs/cgroup".
        argv = [bins["nsenter"], f"--net=/run/netns/{layout['netns'][node]}",
                bins["slurmd"], "-f", str(self.conf_path), "-N", node]
        if binds:
            # The node's own view of some paths, as a node-local disk differs from its
            # neighbours': a private mount namespace (slurmd, its steps and their tasks inherit
            # it) with each source bind-mounted over its target.
            mounts = " && ".join(f"mount --bind {shlex.quote(src)} {shlex.quote(dst)}"
                                 for dst, src in binds.items())
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f'{mounts} && exec "$@"', "sh", *argv]
        # Each node gets a core of its own (round robin over this machine's), which its tasks
        # inherit: an engine binding threads to "its" CPUs (vLLM's CPU backend) then finds one
        # per node, as on separate machines, instead of all nodes on core 0.
        cpus = sorted(os.sched_getaffinity(0))
        i = layout["nodes"].index(node)
        self._launch(f"slurmd:{node}", argv, self.state_dir / "run" / f"slurmd-{node}.pid",
                     state, cpus={cpus[i % len(cpus)]} if self.pin_cpus else None)

    def crash_node(self, node: str) -> list[int]:
        """What a node failure does: SIGKILL every process in the node's network namespace,
        slurmd and the job's slurmstepd and tasks included. Returns the PIDs killed."""
        with self._locked():
            state = self._load_state()
            if state is None:
                raise DevClusterError("no dev cluster here")
            bins, _ = self.resolve_binaries()
            ns = state["layout"]["netns"][node]
            pids = [int(p) for p in self._ip(bins, "netns", "pids", ns).stdout.split()]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            state["pids"].pop(f"slurmd:{node}", None)
            self._save_state(state)
            return pids

    def restart_node(self, node: str, binds: Mapping[str, str] | None = None) -> None:
        """Start a crashed node's slurmd again and wait until every node is usable; `binds`
        (target -> source) gives that node paths of its own (see _start_slurmd)."""
        with self._locked():
            state = self._load_state()
            bins, _ = self.resolve_binaries()
            self._start_slurmd(node, state, bins, binds)
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                nodes = self._sinfo(bins) or {}
                if nodes.get(node) in ("idle", "mix", "alloc"):
                    return
                if nodes.get(node, "").startswith(("drain", "drng")):
                    # a job's recovery drained it as lost: put it back in service
                    self._run([bins["scontrol"], "update", f"NodeName={node}", "State=RESUME"],
                              check=False, timeout=15, env=self.client_env())
                time.sleep(0.25)
            raise DevClusterError(f"{node} did not come back within {self.timeout:.0f} s")

    def stop_controller(self) -> int:
        """What a controller restart or crash looks like to clients: slurmctld (the PID this
        cluster started, never found by name) ends on SIGTERM, which makes it save its state
        to StateSaveLocation first. The slurmds and the jobs' steps keep running. Returns the
        PID ended; start_controller() brings it back with its jobs."""
        with self._locked():
            state = self._load_state()
            p = (state or {}).get("pids", {}).get("slurmctld")
            if p is None or not _alive(p["pid"], p["start"]):
                raise DevClusterError("no running slurmctld of this dev cluster to stop")
            # slurmscriptd and other helpers it forked: they end with it (waited for below).
            family = {p["pid"]: p["start"], **_descendants({p["pid"]})}
            os.kill(p["pid"], signal.SIGTERM)
            deadline = time.monotonic() + self.timeout
            while any(_alive(pid, start) for pid, start in family.items()):
                if time.monotonic() > deadline:
                    raise DevClusterError(f"slurmctld (PID {p['pid']}) did not end within "
                                          f"{self.timeout:.0f} s of SIGTERM")
                time.sleep(0.05)
            state["pids"].pop("slurmctld")
            self._save_state(state)
            return p["pid"]

    def start_controller(self) -> int:
        """Start slurmctld again after stop_controller(). Without -c it recovers the jobs saved
        in StateSaveLocation (slurmctld(8)), so jobs that ran through the outage run on. Waits
        until Slurm answers for every node again; returns the new PID."""
        with self._locked():
            state = self._load_state()
            if state is None:
                raise DevClusterError("no dev cluster here")
            if "slurmctld" in state.get("pids", {}):
                raise DevClusterError("slurmctld of this dev cluster is already running")
            bins, _ = self.resolve_binaries()
            pid_file = self.state_dir / "run" / "slurmctld.pid"
            with contextlib.suppress(FileNotFoundError):
                pid_file.unlink()  # the old PID must not pass for the new one
            self._launch("slurmctld", [bins["slurmctld"], "-f", str(self.conf_path)], pid_file,
                         state)
            self._wait_answers(state, bins)
            return state["pids"]["slurmctld"]["pid"]

    def _wait_answers(self, state: dict[str, Any], bins: Mapping[str, str]) -> None:
        """Until the cluster is healthy again: every daemon alive and sinfo listing every node
        in a usable state (idle, or busy with recovered jobs)."""
        deadline = time.monotonic() + self.timeout
        while True:
            health = self._health(state, bins)
            if health["healthy"]:
                return
            if time.monotonic() > deadline:
                raise DevClusterError(f"slurmctld did not answer for every node within "
                                      f"{self.timeout:.0f} s (last sinfo: "
                                      f"{health['nodes'] or 'no answer'})")
            time.sleep(0.25)

    def _launch(self, role: str, argv: list[str], pid_file: Path, state: dict[str, Any],
                cpus: set[int] | None = None) -> None:
        out = self.log_dir / f"{role.replace(':', '-')}.out"
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        with open(out, "ab") as fh:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh,
                                    env=self._daemon_env(), start_new_session=True,
                                    preexec_fn=pin)
        try:
            rc = proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            # Still in the foreground: record it so teardown ends it.
            state["pids"][role] = {"pid": proc.pid, "start": _starttime(proc.pid)}
            self._save_state(state)
            raise DevClusterError(f"{role} did not detach within {self.timeout:.0f} s") from None
        if rc != 0:
            raise DevClusterError(f"{role} exited with status {rc} while starting (`{shlex.join(argv)}`)")
        deadline = time.monotonic() + self.timeout
        while True:
            pid = _read_pid(pid_file)
            if pid is not None:
                start = _starttime(pid)
                if start is not None:
                    state["pids"][role] = {"pid": pid, "start": start}
                    self._save_state(state)
                    return
            if time.monotonic() > deadline:
                raise DevClusterError(f"{role} did not write a live PID to {pid_file} within {self.timeout:.0f} s")
            time.sleep(0.05)

    def _wait_idle(self, state: dict[str, Any], bins: Mapping[str, str]) -> None:
        deadline = time.monotonic() + self.timeout
        last = "no answer from sinfo yet"
        while True:
            dead = [role for role, p in state["pids"].items() if not _alive(p["pid"], p["start"])]
            if dead:
                raise DevClusterError(f"{', '.join(dead)} died while the cluster was starting")
            nodes = self._sinfo(bins)
            if nodes is not None:
                last = ", ".join(f"{n}={s}" for n, s in sorted(nodes.items())) or "no nodes listed"
                if set(nodes) == set(state["layout"]["nodes"]) and all(s == "idle" for s in nodes.values()):
                    return
            if time.monotonic() > deadline:
                raise DevClusterError(f"nodes not all idle within {self.timeout:.0f} s (last sinfo: {last})")
            time.sleep(0.25)

    def _check_node_to_node(self, state: dict[str, Any], bins: Mapping[str, str]) -> None:
        """Node-to-node traffic crosses the bridge, which the controller-to-node traffic checked by
        `sinfo` does not. With br_netfilter loaded, bridged packets go through iptables FORWARD, and a
        DROP policy there (Docker sets one) would make every multi-node srun hang instead of fail."""
        layout = state["layout"]
        if len(layout["nodes"]) < 2:
            return
        src, dst = layout["nodes"][0], layout["nodes"][1]
        code = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()"
        argv = [bins["nsenter"], f"--net=/run/netns/{layout['netns'][src]}", sys.executable, "-c", code,
                layout["addr"][dst], str(state["ports"]["slurmd"])]
        cp = self._run(argv, check=False, timeout=15)
        if cp.returncode != 0:
            err = (cp.stderr.strip().splitlines() or ["?"])[-1]
            raise DevClusterError(
                f"{src} cannot reach {dst}'s slurmd at {layout['addr'][dst]}:{state['ports']['slurmd']} across "
                f"bridge {layout['bridge']} ({err}). If bridged traffic is filtered by iptables (br_netfilter "
                "with a FORWARD DROP policy, as Docker sets up), allow it with "
                f"`iptables -I FORWARD -i {layout['bridge']} -o {layout['bridge']} -j ACCEPT` "
                "or `sysctl -w net.bridge.bridge-nf-call-iptables=0`, then run up again")

    def _sinfo(self, bins: Mapping[str, str]) -> dict[str, str] | None:
        """{node: state} from sinfo, or None if the controller does not answer."""
        cp = self._run([bins["sinfo"], "-h", "-N", "-p", PARTITION, "-o", "%N|%t"],
                       check=False, timeout=15, env=self.client_env())
        if cp.returncode != 0:
            return None
        out: dict[str, str] = {}
        for line in cp.stdout.splitlines():
            if "|" in line:
                n, s = line.split("|", 1)
                out[n.strip()] = s.strip()
        return out

    def _health(self, state: dict[str, Any], bins: Mapping[str, str]) -> dict[str, Any]:
        dead = [role for role, p in state.get("pids", {}).items() if not _alive(p["pid"], p["start"])]
        expected = {"munged", "slurmctld", *(f"slurmd:{n}" for n in state["layout"]["nodes"])}
        missing = sorted(expected - set(state.get("pids", {})))
        nodes = None
        if "slurmctld" not in dead and not missing:
            nodes = self._sinfo(bins)
        bad = [] if nodes is None else [
            f"{n}={s}" for n, s in nodes.items()
            if "*" in s or s.rstrip("$@+~#%!-^") not in _HEALTHY_NODE_STATES]
        healthy = (not dead and not missing and nodes is not None
                   and set(nodes) == set(state["layout"]["nodes"]) and not bad)
        return {"healthy": healthy, "dead": dead + missing, "nodes": nodes, "bad_nodes": bad}

    # ------------------------------------------------------------------ status
    def status(self) -> dict[str, Any]:
        """Where the cluster stands: {'up', 'healthy', 'state_dir', 'slurm_conf', 'controller', 'nodes', ...}."""
        state = self._load_state()
        base = {"state_dir": str(self.state_dir), "slurm_conf": str(self.conf_path), "partition": PARTITION}
        if state is None:
            return {**base, "up": False, "healthy": False, "controller": None, "nodes": []}
        bins, _ = self.resolve_binaries()
        health = (self._health(state, bins) if "sinfo" in bins
                  else {"healthy": False, "dead": [], "nodes": None, "bad_nodes": []})
        layout, pids = state["layout"], state.get("pids", {})
        ctld = pids.get("slurmctld")
        sinfo = health["nodes"] or {}
        nodes = []
        for n in layout["nodes"]:
            p = pids.get(f"slurmd:{n}")
            nodes.append({"name": n, "address": layout["addr"][n], "netns": layout["netns"][n],
                          "state": sinfo.get(n, "unknown"), "slurmd_pid": p["pid"] if p else None,
                          "slurmd_alive": bool(p and _alive(p["pid"], p["start"]))})
        return {
            **base,
            "up": True,
            "healthy": health["healthy"],
            "problems": health["dead"] + health["bad_nodes"],
            "controller": {"pid": ctld["pid"] if ctld else None,
                           "alive": bool(ctld and _alive(ctld["pid"], ctld["start"])),
                           "address": layout["bridge_addr"], "port": state.get("ports", {}).get("slurmctld"),
                           "hostname": state.get("hostname")},
            "slurmd_port": state.get("ports", {}).get("slurmd"),
            "subnet": layout["subnet"],
            "bridge": layout["bridge"],
            "nodes": nodes,
        }

    # ------------------------------------------------------------------ down
    def down(self) -> dict[str, Any]:
        """End every process the cluster started or runs, remove its namespaces and links.

        Returns {'was_up': bool, 'ended': [pids], 'removed': [names]}; a cluster that is not up is not an error.
        """
        if not self.state_path.exists():
            return {"was_up": False, "ended": [], "removed": [], "state_dir": str(self.state_dir)}
        bins, _ = self.resolve_binaries()
        with self._locked():
            state = self._load_state()
            if state is None:
                return {"was_up": False, "ended": [], "removed": [], "state_dir": str(self.state_dir)}
            result = self._teardown(state, bins)
        return {"was_up": True, **result, "state_dir": str(self.state_dir)}

    def _teardown(self, state: dict[str, Any], bins: Mapping[str, str]) -> dict[str, Any]:
        errors: list[str] = []
        created = state.get("created", {})
        # A PID runs on one of our nodes exactly when its /proc/<pid>/ns/net is the inode that
        # `ip netns add` bind-mounted at /run/netns/<ns> (the same test `ip netns pids` makes).
        ns_ids = {}
        for ns in created.get("netns", []):
            with contextlib.suppress(OSError):
                st = os.stat(f"/run/netns/{ns}")
                ns_ids[(st.st_dev, st.st_ino)] = ns
        daemons = {p["pid"]: p["start"] for p in state.get("pids", {}).values()}
        # Their children too (slurmctld's slurmscriptd lives in the host namespace, not in ours).
        daemons.update(_descendants({pid for pid, start in daemons.items() if _alive(pid, start)}))
        ended = _end_processes(daemons, lambda: _pids_in_netns(ns_ids))
        leftover = [pid for pid, start in daemons.items() if _alive(pid, start)] + _pids_in_netns(ns_ids)
        if leftover:
            errors.append(f"processes still running after KILL: {sorted(set(leftover))}")
        removed: list[str] = []
        if "ip" in bins:
            # Deleting the host end of a veth deletes its peer inside the namespace too.
            for veth in created.get("veth", []):
                cp = self._ip(bins, "link", "del", veth, check=False)
                if cp.returncode == 0:
                    removed.append(veth)
                elif "Cannot find device" not in cp.stderr:
                    errors.append(f"ip link del {veth}: {cp.stderr.strip()}")
            for ns in created.get("netns", []):
                cp = self._ip(bins, "netns", "del", ns, check=False)
                if cp.returncode == 0:
                    removed.append(ns)
                elif "No such file" not in cp.stderr:
                    errors.append(f"ip netns del {ns}: {cp.stderr.strip()}")
            br = created.get("bridge")
            if br:
                cp = self._ip(bins, "link", "del", br, check=False)
                if cp.returncode == 0:
                    removed.append(br)
                elif "Cannot find device" not in cp.stderr:
                    errors.append(f"ip link del {br}: {cp.stderr.strip()}")
        elif created.get("veth") or created.get("netns") or created.get("bridge"):
            errors.append("`ip` (iproute2) is missing, so the namespaces and links could not be removed")
        if errors:
            # Keep state.json so a later `down` can finish the job.
            raise DevClusterError("dev cluster teardown incomplete:\n  - " + "\n  - ".join(errors))
        # Logs stay for post-mortems; everything else is runtime state.
        for sub in ("spool", "tmp", "run", "munge"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        for f in (self.conf_path, self.state_path):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        return {"ended": sorted(ended), "removed": removed}

    # ------------------------------------------------------------------ logs
    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of the controller's and every node's log (and daemon stdout/stderr)."""
        if not self.log_dir.is_dir():
            return f"(no logs in {self.log_dir})"
        files = sorted(self.log_dir.iterdir(), key=lambda p: (not p.name.startswith("slurmctld"), p.name))
        chunks = []
        for f in files:
            if not f.is_file():
                continue
            try:
                text = f.read_text(errors="replace")
            except OSError as e:
                text = f"(unreadable: {e})"
            if not text.strip():
                continue
            tail = "\n".join(text.splitlines()[-lines:])
            chunks.append(f"==> {f} <==\n{tail}")
        return "\n".join(chunks) if chunks else f"(logs in {self.log_dir} are empty)"


# ---------------------------------------------------------------------- helpers
def _short_hostname() -> str:
    # slurmctld refuses to start unless SlurmctldHost names this host; it compares the short name.
    return socket.gethostname().split(".")[0]


def _cluster_name(layout: dict[str, Any]) -> str:
    return "dev" + re.sub(r"[^a-z0-9]", "", layout["bridge"].lower())


def _pick_free_port(exclude: set[int]) -> int:
    """A TCP port free on this host, below the kernel's ephemeral range so outgoing connections
    don't grab it between now and the daemon's bind."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        if port in exclude:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise DevClusterError("found no free TCP port in 20000-32000 for slurmctld/slurmd")


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a PID, or None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()
    return fields[0], int(fields[19])


def _starttime(pid: int) -> int | None:
    st = _proc_stat(pid)
    return None if st is None or st[0] in "ZX" else st[1]


def _alive(pid: int, start: int | None) -> bool:
    """True while `pid` is the very process recorded (same start time) and not a zombie."""
    st = _proc_stat(pid)
    if st is None or st[0] in "ZX":
        return False
    return start is None or st[1] == start


def _pids_in_netns(ns_ids: Mapping[tuple[int, int], str]) -> list[int]:
    if not ns_ids:
        return []
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ns_ids and _starttime(int(entry)) is not None:
            pids.append(int(entry))
    return pids


def _descendants(roots: set[int]) -> dict[int, int | None]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                data = fh.read()
        except OSError:
            continue
        ppid = int(data[data.rfind(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: dict[int, int | None] = {}
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out and child not in roots:
                out[child] = _starttime(child)
                todo.append(child)
    return {pid: start for pid, start in out.items() if start is not None}


def _end_processes(daemons: Mapping[int, int | None], netns_pids: Any,
                   grace: float = 2.0, kill_wait: float = 5.0) -> set[int]:
    """TERM our daemons and every process inside our namespaces, wait up to `grace`, then KILL.

    The grace is short because slurmstepd and srun ignore TERM (they wait for their tasks and for
    slurmd, which is going away too), so with jobs running the KILL always comes; the daemons
    themselves exit on TERM well within it. Namespace members are rescanned each round because a
    dying slurmstepd/job may still fork.
    """
    targets: dict[int, int | None] = {pid: start for pid, start in daemons.items() if _alive(pid, start)}
    for pid in netns_pids():
        targets.setdefault(pid, _starttime(pid))
    signalled: set[int] = set()

    def signal_all(sig: int) -> None:
        for pid, start in list(targets.items()):
            if _alive(pid, start):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                    signalled.add(pid)

    def wait(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            for pid in netns_pids():
                if pid not in targets:
                    targets[pid] = _starttime(pid)
                    if _alive(pid, targets[pid]):
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGTERM)
                            signalled.add(pid)
            if not any(_alive(pid, start) for pid, start in targets.items()):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    signal_all(signal.SIGTERM)
    if not wait(grace):
        for _ in range(3):
            signal_all(signal.SIGKILL)
            if wait(kill_wait):
                break
    return signalled


def _link_names(ip_o_link: str) -> list[str]:
    names = []
    for line in ip_o_link.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _netns_names(ip_netns_list: str) -> list[str]:
    return [line.split()[0] for line in ip_netns_list.splitlines() if line.strip()]
