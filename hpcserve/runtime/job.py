#!/usr/bin/env python3
"""hpcserve's in-job runtime, copied into every job directory as hpcserve_job.py (stdlib only).

job.sbatch execs `hpcserve_job.py run JOBDIR` on the batch host. It runs the rendered step
scripts (steps/*.sh, each one srun), so every command of the job stays readable in the job
directory, and does here what is awkward in bash: HTTP polling with deadlines, supervision of
every step, ordered teardown through Slurm, and state.json.

`hpcserve_job.py discover` runs once per node (one srun per component) and prints the node's
address on the site's interface and its active IB devices.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

# The plan.json contract this runtime understands (hpcserve/runtime/spec.py declares it).
SPEC = "hpcserve-job"
SPEC_VERSION = 5

PHASES = ("pending", "starting", "engines_ready", "router_ready", "serving", "stopping", "requeued",
          "done", "cancelled", "failed")


def now() -> float:
    return time.time()


# ------------------------------------------------------------------------------------ discovery

def _ip_json(args: list[str]) -> list:
    try:
        out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=10)
        return json.loads(out.stdout or "[]") if out.returncode == 0 else []
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def interface_address(iface: str) -> tuple[str, str]:
    """(interface, IPv4 address); `auto` is the default route's interface, else the first
    up interface that is neither loopback nor a container bridge."""
    addrs = _ip_json(["-4", "addr", "show"])
    by_name = {a.get("ifname"): a for a in addrs}
    if iface == "auto":
        routes = _ip_json(["-4", "route", "show", "default"])
        cands = [r.get("dev") for r in routes if r.get("dev")]
        cands += [a.get("ifname") for a in addrs
                  if a.get("ifname") != "lo" and "LOOPBACK" not in a.get("flags", [])
                  and not re.match(r"(docker|br-|veth|virbr|cni|flannel|cali)", a.get("ifname", ""))]
        for c in cands:
            if c in by_name and _first_v4(by_name[c]):
                return c, _first_v4(by_name[c])
        raise SystemExit("hpcserve discover: no interface with an IPv4 address found "
                         "(set site.network.interface)")
    if iface not in by_name or not _first_v4(by_name[iface]):
        known = ", ".join(sorted(n for n in by_name if n))
        raise SystemExit(f"hpcserve discover: interface {iface!r} has no IPv4 address on this "
                         f"node (interfaces with one: {known})")
    return iface, _first_v4(by_name[iface])


def _first_v4(entry: dict) -> str | None:
    for a in entry.get("addr_info", []):
        if a.get("family") == "inet" and a.get("local"):
            return a["local"]
    return None


def active_ib_devices(root: str = "/sys/class/infiniband") -> list[str]:
    out = []
    try:
        devs = sorted(os.listdir(root))
    except OSError:
        return []
    for dev in devs:
        ports = os.path.join(root, dev, "ports")
        try:
            for port in sorted(os.listdir(ports)):
                with open(os.path.join(ports, port, "state")) as f:
                    if "ACTIVE" in f.read():
                        out.append(dev)
                        break
        except OSError:
            continue
    return out


def cmd_discover(args: argparse.Namespace) -> int:
    name = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    nodeid = os.environ.get("SLURM_NODEID", "0")
    if args.preflight:
        # First, so that a node whose address cannot be found still reports its checks.
        pf = _preflight_module()
        plan = load_spec(args.preflight)
        pf.write_report(args.preflight, pf.node_report(plan, args.component, int(nodeid), name))
    iface, ip = interface_address(args.iface)
    if args.ib == "auto":
        ib = active_ib_devices()
        if not ib:
            raise SystemExit("hpcserve discover: ib_devices is auto but no active InfiniBand "
                             "port was found in /sys/class/infiniband")
        ibs = ",".join(ib)
    elif args.ib == "none":
        ibs = "-"
    else:
        ibs = args.ib
    # One tagged line: stderr noise such as "srun: Step created" can never be taken for it.
    print(f"HPCSERVE-NODE {nodeid} {name} {ip} {iface} {ibs}", flush=True)
    return 0


BENCH_STEP = "bench"


def _bench_module():
    """hpcserve_bench.py, beside this file in the job directory (as _preflight_module)."""
    try:
        import hpcserve_bench as bench
    except ImportError:
        from hpcserve.runtime import bench
    return bench


def _preflight_module():
    """hpcserve_preflight.py, beside this file in the job directory (hpcserve.runtime.preflight
    where this module is imported from the package, as the tests do)."""
    try:
        import hpcserve_preflight as checks
    except ImportError:
        from hpcserve.runtime import preflight as checks
    return checks


# ------------------------------------------------------------------------------------------ state

class State:
    def __init__(self, job_dir: str):
        self.path = os.path.join(job_dir, "state.json")
        try:
            with open(self.path) as f:
                self.data = json.load(f)
        except (OSError, ValueError):
            self.data = {}
        self.data.setdefault("history", [])
        self.data["job_id"] = os.environ.get("SLURM_JOB_ID")

    def update(self, phase: str | None = None, **fields) -> None:
        if phase:
            self.data["phase"] = phase
            self.data["history"].append({"phase": phase, "at": round(now(), 3)})
        self.data.update(fields)
        self.data["updated_at"] = round(now(), 3)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)


# --------------------------------------------------------------------------------------- the run

class Stop(Exception):
    """The deployment must end: a step exited, a deadline passed, or a signal arrived."""

    def __init__(self, phase: str, reason: str, failure: dict | None = None):
        super().__init__(reason)
        self.phase = phase
        self.reason = reason
        self.failure = failure


# sbatch exports the submitter's environment, http_proxy/HTTP_PROXY included, and urlopen would
# send /health, /readiness and the smoke request to that site proxy, which cannot reach (or must
# not see) the allocation's nodes.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str, body: dict | None = None, timeout: float = 2.0,
              headers: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with _DIRECT.open(req, timeout=timeout) as r:
        raw = r.read()
        return r.status, (json.loads(raw) if raw.strip() else None)


class SpecError(Exception):
    """plan.json is not a spec this runtime understands: nothing may start."""


def load_spec(job_dir: str) -> dict:
    path = os.path.join(job_dir, "plan.json")
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read {path}: {e}") from None
    got = (plan.get("spec"), plan.get("spec_version")) if isinstance(plan, dict) else (None, None)
    if got != (SPEC, SPEC_VERSION):
        made_by = plan.get("hpcserve_version", "an older hpcserve") if isinstance(plan, dict) \
            else "?"
        raise SpecError(f"{path} is run-time spec {got[1]!r} (rendered by hpcserve {made_by}); "
                        f"this hpcserve_job.py understands spec {SPEC_VERSION} only: render the "
                        "job directory again with one hpcserve version")
    return plan


def refuse(job_dir: str, why: str) -> int:
    """An incompatible job directory: say so in state.json and the log, start nothing."""
    sys.stderr.write(f"hpcserve_job.py: {why}\n")
    try:
        State(job_dir).update("failed", reason=why, finished_at=round(now(), 3),
                              failure={"reason": "incompatible job directory"})
    except OSError:
        pass
    return 2


class Job:
    DISCOVERY_TIMEOUT = 120.0  # s, for all components together
    STUCK_SRUN = 2.0           # s an srun may take to exit after it said it ends the step
    SMOKE_TIMEOUT = 120.0      # s, the whole smoke request
    CLEANUP_TIMEOUT = 60.0     # s at most for removing leftover enroot containers

    def __init__(self, job_dir: str):
        self.dir = job_dir
        self.plan = load_spec(job_dir)
        self.state = State(job_dir)
        if self.state.data.get("phase") == "requeued":
            self.state.data["history"].append({"phase": "pending", "at": round(now(), 3)})
        self.steps: dict[str, subprocess.Popen] = {}
        self.log_offsets: dict[str, int] = {}  # step -> size of its srun log when it started
        self.log_seen: dict[str, int] = {}     # step -> how far check() has read its srun log
        self.log_tail_text: dict[str, str] = {}
        self._slurmd_addrs: dict | None = None
        self._slurm_config: str | None = None
        self.terminating_since: dict[str, float] = {}
        self.lost_steps: set[str] = set()  # steps with a node that is gone
        self.hung_steps: set[str] = set()  # steps whose engine stopped answering
        self.discovery: dict[int, subprocess.Popen] = {}
        self.image_import: subprocess.Popen | None = None   # pyxis: the once-per-job import
        self.nodes: dict[str, list[list[str]]] = {}   # instance -> [[rank, name, ip, iface, ib]]
        self.signal_reason: str | None = None
        self.signal_stop: Stop | None = None   # what signal_reason means, set with it
        self.requeued_by_slurm = False          # Slurm put the job back in the queue itself
        self.excluded_nodes: list[str] = []     # lost nodes a requeue must not land on again
        self.router_node: str | None = None     # known once the router's step starts
        self.router_addr: str | None = None
        self.bench: dict | None = None          # the benchmark step while it runs
        self.signal_seen: tuple[int, float] | None = None  # (signum, when), set by on_signal
        try:
            self.t0 = float(os.environ.get("HPCSERVE_BATCH_T0", ""))
        except ValueError:
            self.t0 = now()
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        self.log_fh = open(os.path.join(job_dir, "logs", "hpcserve-job.log"), "a", buffering=1)

    def log(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{now() - self.t0:7.2f}s] {msg}"
        # Best-effort: a full disk or a closed stdout must not abort a teardown half-way.
        for out in (sys.stdout, self.log_fh):
            try:
                out.write(line + "\n")
                out.flush()
            except (OSError, ValueError):
                pass

    # -- signals
    def on_signal(self, signum, _frame) -> None:
        # Only records the signal: the handler runs between two bytecodes of the main thread,
        # which may be inside a write to the same buffered file (print/log would then raise
        # "reentrant call"), and an squeue call here would stall whatever it interrupted.
        # resolve_signal(), called from check() and run(), decides and logs.
        if self.signal_seen is None:
            self.signal_seen = (signum, now())

    def resolve_signal(self) -> str | None:
        """The stop reason of the first signal that arrived, or None; decided and logged once
        (self.signal_stop holds the Stop it means)."""
        if self.signal_reason or self.signal_seen is None:
            return self.signal_reason
        signum, at = self.signal_seen
        # USR1 comes from `hpcserve cancel` (scancel --batch --signal=USR1): a requested stop.
        # TERM comes from a scancel, from --signal=B:TERM@grace before the time limit, or from
        # Slurm ending the job for a failed node or a preemption: Slurm's record tells which.
        stop = Stop("cancelled", "cancelled") if signum == signal.SIGUSR1 else \
            self.why_terminated(at)
        self.signal_stop = stop
        self.signal_reason = {"node lost": "node_lost", "preempted": "preempted"}.get(
            (stop.failure or {}).get("reason"), stop.reason)
        self.log(f"received {signal.Signals(signum).name}: {stop.reason}")
        return self.signal_reason

    def why_terminated(self, at: float) -> Stop:
        """Why a TERM came, from Slurm's record of the job and of its nodes: a node that failed
        (Slurm ends the job NODE_FAIL, or requeues it), a preemption, the time limit, or else a
        scancel. Node failure and preemption are failures (requeue: N applies)."""
        recs = self.slurm_records()
        mine = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        self.requeued_by_slurm = any(int(r.get("Restarts") or 0) > mine for r in recs)
        lost = self.lost_nodes()
        if lost or any(r.get("Reason") == "NodeDown" for r in recs):
            node, state = lost[0] if lost else (None, "down")
            return self.node_lost_stop(node, state, "Slurm is ending the job")
        if any(r.get("PreemptTime") not in (None, "", "None", "Unknown") for r in recs):
            return Stop("failed", "preempted: Slurm is ending the job for another one",
                        {"step": None, "role": None, "instance": None, "node": None,
                         "reason": "preempted", "exit_code": None})
        if self._near_time_limit(at):
            return Stop("cancelled", "time_limit")
        return Stop("cancelled", "cancelled")

    def slurm_records(self) -> list[dict]:
        """`scontrol -o show job`: one key=value record per component of this job."""
        if not self.job_id:
            return []
        try:
            out = subprocess.run(["scontrol", "-o", "show", "job", self.job_id],
                                 capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        return [dict(re.findall(r"(?:^| )(\w+)=(\S*)", ln))
                for ln in out.splitlines() if ln.strip()]

    def _near_time_limit(self, at: float) -> bool:
        if not self.job_id:
            return False
        try:
            out = subprocess.run(["squeue", "-h", "-j", self.job_id, "-o", "%L"],
                                 capture_output=True, text=True, timeout=5).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            return False
        left = _seconds(out[0]) if out else None
        # what was left when the signal arrived, not now
        return left is not None and left + (now() - at) <= self.plan["signal_grace"] + 90

    def check(self) -> None:
        if self.resolve_signal():
            raise self.signal_stop
        for name, p in self.steps.items():
            if name == BENCH_STEP:
                continue  # its end is the gate's to judge (bench_tick), not a crash
            rc = p.poll()
            if rc is not None:
                time.sleep(0.3)  # a scancel signals steps and us together: let our signal land
                if self.resolve_signal():
                    raise self.signal_stop
                # a step that ended on a node Slurm now calls down ended with its node
                self.check_nodes()
                # one that could not bind its port: its launch script's check names the holder
                self.owns_port(name, wait=0.5)
                raise Stop("failed", f"step {name} exited with code {rc}", self.failure_of(name, rc))
            if self.step_terminating(name):
                # srun reported a task's end and is ending the step but has not exited after
                # a while: it waits for a node that is gone (its slurmstepd with it), until
                # Slurm's node timeout. The step is lost now.
                first = self.terminating_since.setdefault(name, now())
                if now() - first > self.STUCK_SRUN:
                    if self.resolve_signal():
                        raise self.signal_stop
                    self.step_lost(name)

    def step_terminating(self, name: str) -> bool:
        """Whether srun's log (this try's part) says it is terminating the step; read once per
        check from where the last read ended."""
        path = os.path.join(self.dir, "logs", f"{name}.srun.log")
        seen = self.log_seen.setdefault(name, self.log_offsets.get(name, 0))
        new = _read_from(path, seen)
        self.log_seen[name] = seen + len(new.encode())
        self.log_tail_text[name] = (self.log_tail_text.get(name, "") + new)[-4096:]
        return bool(re.search(r"Terminating StepId|Force Terminated|task \d+: (Exited|Killed|"
                              r"Terminated|Segmentation|Aborted|Bus error)",
                              self.log_tail_text[name]))

    def step_lost(self, name: str) -> None:
        """A step srun could not end: name the node that is gone if there is one, else the
        task that ended."""
        f = self.failure_of(name, None)
        self.raise_if_node_lost(name, f, {t["node"] for t in f.get("tasks", [])})
        raise Stop("failed", f"step {name}: a task ended and srun is terminating the step", f)

    def raise_if_node_lost(self, name: str, f: dict, reported: set = frozenset()) -> None:
        """The first node of the step whose slurmd does not answer (among those srun did not
        report a task of) ends the deployment as a lost node."""
        for rank, node, *_ in self.nodes.get(name, []):
            if node not in reported and not self.slurmd_answers(node):
                self.lost_steps.add(name)
                self.excluded_nodes.append(node)
                f.update(node=node, node_rank=int(rank), reason="node lost", exit_code=None,
                         log=self._log_file(name, int(rank), node))
                raise Stop("failed", f"node {node} lost: step {name} cannot end there "
                                     "(its slurmd does not answer)", f)

    def slurmd_answers(self, node: str) -> bool:
        """A TCP connection to the node's slurmd: a crashed node refuses or times out."""
        addr = self.slurmd_addresses().get(node)
        if addr is None:
            return True  # cannot tell: do not blame the node
        try:
            with socket.create_connection(addr, timeout=2):
                return True
        except OSError:
            return False

    def slurmd_addresses(self) -> dict:
        """node -> (address, slurmd port), from `scontrol show node` (asked once)."""
        if self._slurmd_addrs is None:
            self._slurmd_addrs = {}
            names = sorted({r[1] for rows in self.nodes.values() for r in rows})
            try:
                out = subprocess.run(["scontrol", "show", "node", ",".join(names)],
                                     capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                return {}
            conf = self.slurm_config("SlurmdPort") or ""
            default_port = int(conf) if conf.isdigit() else 6818
            for rec in out.split("\n\n"):
                name = re.search(r"NodeName=(\S+)", rec)
                addr = re.search(r"NodeAddr=(\S+)", rec)
                # a node's own Port= where slurm.conf gives one, else SlurmdPort for all
                port = re.search(r"\bPort=(\d+)", rec)
                if name and addr:
                    self._slurmd_addrs[name.group(1)] = (
                        addr.group(1), int(port.group(1)) if port else default_port)
        return self._slurmd_addrs

    def sleep(self, seconds: float) -> None:
        end = now() + seconds
        while now() < end:
            self.check()
            time.sleep(min(0.1, max(0.0, end - now())))

    # -- failure details
    def failure_of(self, name: str, rc: int) -> dict:
        f = {**step_identity(name), "exit_code": rc}
        srun_log = os.path.join(self.dir, "logs", f"{name}.srun.log")
        # After a requeue the file still holds the earlier tries' lines: read only this try's.
        offset = self.log_offsets.get(name, 0)
        text = _read_from(srun_log, offset)
        # srun reports each task's end. Tasks it reports before it starts terminating the step
        # (`--kill-on-bad-exit`) are the causes; the rest are its own kills. Among the causes a
        # signal death (OOM killer, segfault) ranks first, then an unusual exit code.
        tasks = []
        stop_at = re.search(r"_step_signal: Terminating|Force Terminated", text)
        # "task 3:", or for several ranks of one node "tasks 2-3:" (MPI engines)
        for m in re.finditer(r"error: (\S+): tasks? (\d+)[\d,-]*: (Exited with exit code (\d+)|"
                             r"Killed|Terminated|Segmentation fault|Aborted|Bus error)", text):
            code = int(m.group(4)) if m.group(4) else None
            rank = next((int(r) for r, nname, *_ in self.nodes.get(name, []) if nname == m.group(1)),
                        None)
            tasks.append({"node": m.group(1), "node_rank": rank, "task": int(m.group(2)),
                          "how": m.group(3),
                          "exit_code": code if code is not None else 128 + _SIGNALS.get(
                              m.group(3), 9),
                          "cause": stop_at is None or m.start() < stop_at.start()})
        # A task that ended with code 0 while the others ran: srun's --wait ends the step and
        # lists each task's state first ("StepId=4.1 task 1: exited").
        for m in re.finditer(r"StepId=\S+ tasks? ([\d,-]+): exited$", text, re.M):
            for task in _task_ids(m.group(1)):
                rank = task // self.tasks_per_node(name)
                rows = self.nodes.get(name, [])
                tasks.append({"node": rows[rank][1] if rank < len(rows) else None,
                              "node_rank": rank, "task": task, "how": "exited",
                              "exit_code": 0, "cause": True})
        if tasks:
            f["tasks"] = tasks
            primary = min(tasks, key=lambda t: (not t["cause"],
                                                0 if not t["how"].startswith("Exited") else
                                                1 if t["exit_code"] not in (0, 1) else 2))
            f.update(node=primary["node"], node_rank=primary["node_rank"],
                     exit_code=primary["exit_code"])
            if self.tasks_per_node(name) > 1:  # one MPI rank per GPU: name the rank too
                f["rank"] = primary["task"]
        elif name in self.nodes and len(self.nodes[name]) == 1:
            f["node"] = self.nodes[name][0][1]
            f["node_rank"] = 0
        f["log"] = self._log_file(name, f.get("node_rank"), f.get("node"), f.get("rank"))
        self.last_words(f)
        return f

    def last_words(self, f: dict) -> None:
        """The failure's log tail and the last error line in it (a Python stack trace's frames
        are not one). Read again once the steps are gone: an engine may still be writing its
        last lines when its task's end is first seen."""
        if not f.get("step"):
            return
        srun_log = os.path.join("logs", f"{f['step']}.srun.log")
        rel = f.get("log") or srun_log
        text = _read_from(os.path.join(self.dir, rel),
                          self.log_offsets.get(f["step"], 0) if rel == srun_log else 0)
        lines = text.splitlines()
        f["log_tail"] = lines[-20:]
        f["error"] = _last_error(lines)

    def tasks_per_node(self, name: str) -> int:
        return next((i.get("tasks_per_node", 1) for i in self.plan["instances"]
                     if i["name"] == name), 1)

    def _log_file(self, name: str, node_rank, node, rank=None) -> str | None:
        if name == "router":
            return "logs/router.log"
        if node_rank is None:
            return f"logs/{name}.srun.log"
        t = self.tasks_per_node(name)
        if t > 1:
            base = f"logs/{name}.node{node_rank}.{node}.task"
            if rank is not None:  # the task log whose first line names this rank
                for local in range(64):
                    if f"(rank {rank})" in _first_line(os.path.join(self.dir,
                                                                    f"{base}{local}.log")):
                        return f"{base}{local}.log"
            return f"{base}0.log"
        return f"logs/{name}.node{node_rank}.{node}.log"

    # -- steps
    def start_step(self, name: str, script: str, nodelist: list[str]) -> None:
        env = dict(os.environ, NODELIST=",".join(nodelist))
        # Appended to across requeues (logs/<step>.srun.log is read by that name elsewhere), so
        # failure_of() starts reading at the size the file had now.
        with open(os.path.join(self.dir, "logs", f"{name}.srun.log"), "ab") as out:
            self.log_offsets[name] = os.fstat(out.fileno()).st_size
            self.steps[name] = subprocess.Popen(["bash", os.path.join(self.dir, script)],
                                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL)

    def start_image_import(self) -> subprocess.Popen | None:
        """pyxis with a registry image: import it once, here on the batch node, into the shared
        squashfs every step's --container-image names, beside address discovery (the helper
        locks, validates and renames, so other jobs importing the same image wait for it)."""
        imp = (self.plan.get("container") or {}).get("import")
        if not imp:
            return None
        self.log(f"importing {imp['uri']} into {imp['sqsh']} once for every node")
        with open(os.path.join(self.dir, "logs", "import-image.log"), "ab") as log:
            self.image_import = subprocess.Popen(
                ["bash", imp["helper"], imp["uri"], imp["sqsh"]], stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True)
        return self.image_import

    def wait_image_import(self, p: subprocess.Popen | None) -> None:
        if p is None:
            return
        imp = self.plan["container"]["import"]
        while p.poll() is None:
            self.check()
            time.sleep(0.2)
        if p.returncode != 0:
            tail = _tail(os.path.join(self.dir, "logs", "import-image.log"), 5)
            raise Stop("failed", f"importing {imp['uri']} into {imp['sqsh']} failed (exit "
                                 f"{p.returncode}); see logs/import-image.log",
                       {"step": "import-image", "role": None, "instance": None,
                        "node": os.uname().nodename, "reason": "image import failed",
                        "exit_code": p.returncode, "log": "logs/import-image.log",
                        "log_tail": tail})
        self.log(f"image ready: {imp['sqsh']}")

    def stop_image_import(self) -> None:
        """An import still running when the deployment ends: TERM its process group (the
        helper and enroot under it), KILL after 3 s. Its temporary file is never the target."""
        p = self.image_import
        if p is None or p.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(p.pid, sig)
            except OSError:
                return
            try:
                p.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def discover(self) -> dict[int, list[list[str]]]:
        """Every node's address (and its preflight report), one srun per component at once."""
        comps = self.plan["components"]
        outs = {}
        reports = os.path.join(self.dir, "run", "preflight")
        shutil.rmtree(reports, ignore_errors=True)  # an earlier try's reports say nothing now
        os.makedirs(reports)
        t_start = now()
        for c in comps:
            i = c["index"]
            # A file, not a pipe: nobody reads a pipe until srun exits, and srun blocks once the
            # pipe's 64 KiB are full (some 700 nodes' lines).
            outs[i] = os.path.join(self.dir, "run", f"discover-{i}.out")
            with open(outs[i], "wb") as out, \
                    open(os.path.join(self.dir, "logs", f"discover-{i}.log"), "ab") as err:
                self.discovery[i] = subprocess.Popen(
                    ["bash", os.path.join(self.dir, "steps", f"discover-{i}.sh")],
                    stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = now() + self.DISCOVERY_TIMEOUT
        try:
            while True:
                # a component that failed ends discovery at once, whatever the others do
                bad = [c for c in comps if self.discovery[c["index"]].poll() not in (None, 0)]
                if bad:
                    self.preflight((t_start, now()))  # a failed check explains it best
                    raise self._discovery_failed(bad[0], 0)
                running = [i for i, p in self.discovery.items() if p.poll() is None]
                if not running:
                    break
                if now() > deadline:
                    raise Stop("failed", "address discovery on component(s) "
                                         f"{', '.join(map(str, running))} timed out after "
                                         f"{self.DISCOVERY_TIMEOUT:g} s")
                self.check()
                time.sleep(0.05)
        finally:
            self.stop_discovery()
        self.preflight((t_start, now()))
        found = {}
        for c in comps:
            p = self.discovery[c["index"]]
            rows = [ln.split()[1:] for ln in _read_from(outs[c["index"]]).splitlines()
                    if ln.startswith("HPCSERVE-NODE ") and len(ln.split()) == 6]
            if p.returncode != 0 or len(rows) != c["nodes"]:
                raise self._discovery_failed(c, len(rows))
            rows.sort(key=lambda r: int(r[0]))
            found[c["index"]] = [r[1:] for r in rows]  # name, ip, iface, ib
            self.log(f"component {c['index']} ({c['name']}): " +
                     ", ".join(f"{r[0]}={r[1]}" for r in found[c["index"]]))
        return found

    def preflight(self, window: tuple) -> None:
        """The nodes' preflight reports judged together: a table in state.json and the log, and
        a Stop naming node and check for a failed one, before any engine starts."""
        checks = _preflight_module()
        reports = checks.read_reports(self.dir)
        if not reports:
            return
        here = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        result = checks.evaluate(reports, window, self.plan["preflight"], here)
        result["took_s"] = round(window[1] - window[0], 3)
        self.state.update(preflight=result)
        self.log(f"preflight on {len(reports)} node(s) in {result['took_s']:.2f} s "
                 f"({result['mode']}):")
        for line in checks.table_text(result):
            self.log("  " + line)
        if not result["failed"]:
            return
        node, check, detail = result["failed"][0]
        rep = next(r for r in reports if r["node"] == node)
        insts = checks.node_instances(self.plan, rep["component"], rep["nodeid"])
        comp = self.plan["components"][rep["component"]]
        more = len(result["failed"]) - 1
        raise Stop("failed", f"preflight: {check} failed on {node}: {detail}" +
                   (f" (and {more} more failed check(s): see state.json's preflight)"
                    if more else ""),
                   {"step": f"discover-{comp['index']}", "reason": "preflight failed",
                    "check": check, "node": node,
                    "role": insts[0]["role"] if insts else comp["name"],
                    "instance": insts[0]["index"] if insts else None,
                    "instances": [i["name"] for i in insts], "detail": detail,
                    "log": "logs/hpcserve-job.log", "failed": result["failed"]})

    def _discovery_failed(self, c: dict, nrows: int) -> Stop:
        p = self.discovery[c["index"]]
        return Stop("failed", f"address discovery on component {c['index']} ({c['name']}) "
                              f"failed (exit {p.returncode}, {nrows}/{c['nodes']} "
                              f"nodes); see logs/discover-{c['index']}.log",
                    {"step": f"discover-{c['index']}", "role": c["name"],
                     "exit_code": p.returncode,
                     "log_tail": _tail(os.path.join(self.dir, "logs",
                                                    f"discover-{c['index']}.log"))})

    def stop_discovery(self) -> None:
        """TERM every discovery srun still running (srun then ends its step), KILL after 3 s."""
        live = [p for p in self.discovery.values() if p.poll() is None]
        if not live:
            return
        for p in live:
            try:
                p.terminate()
            except OSError:
                pass
        end = now() + 3
        while now() < end and any(p.poll() is None for p in live):
            time.sleep(0.05)
        for p in live:
            if p.poll() is None:
                try:
                    p.kill()
                    p.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    pass

    def run(self) -> int:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(s, self.on_signal)
        try:
            # A requeued job's state.json still holds the last try's outcome.
            self.state.update("starting", started_at=round(self.t0, 3), runtime_at=round(now(), 3),
                              batch_host=os.uname().nodename, endpoint=None, failure=None,
                              reason=None, finished_at=None, smoke_tokens=None,
                              serving_after_s=None, engines_ready_count=0,
                              restarts=int(os.environ.get("SLURM_RESTART_COUNT") or 0))
            self.serve()
            phase, reason, failure = "done", "finished", None  # not reached: serve() raises
        except Stop as s:
            phase, reason, failure = s.phase, s.reason, s.failure
        except BaseException as e:  # a bug here must still tear the job down
            phase, reason, failure = "failed", f"hpcserve runtime error: {e!r}", None
        stop_at = now()
        try:
            self.resolve_signal()
        except Exception as e:
            self.log(f"could not resolve the signal: {e!r}")
        sig = self.signal_stop
        if sig is not None and phase == "failed" and (failure or {}).get("reason") != "node lost":
            # A step that ended because Slurm signalled it too is not a crash of its own: the
            # signal's cause (a scancel, the time limit, a lost node, a preemption) is the reason.
            phase, reason, failure = sig.phase, sig.reason, sig.failure
        self.log(f"stopping: {reason}")
        self.record("stopping", reason=reason, failure=failure)
        try:
            self.teardown()
        except Exception as e:
            self.log(f"teardown error: {e!r}")
        try:
            # before a requeue, which ends this allocation; within the grace where there is some
            grace = float(self.plan["signal_grace"])
            self.cleanup_nodes(min(self.CLEANUP_TIMEOUT, max(10.0, stop_at + grace - 5 - now())))
        except Exception as e:
            self.log(f"node cleanup error: {e!r}")
        if failure:
            self.last_words(failure)  # the engines' processes are gone: their logs are whole
        final = "cancelled" if phase == "cancelled" else phase
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        # A benchmark that failed its gate measured the deployment: another try of the same
        # deployment would measure the same, so that failure is not requeued.
        if final == "failed" and (failure or {}).get("reason") != "benchmark failed" and \
                self.requeue_after(reason, restarts):
            return 0
        self.record(final, reason=reason, finished_at=round(now(), 3), restarts=restarts)
        self.log(f"final state: {final} ({reason})")
        return 0 if final in ("cancelled", "done") else 1

    def requeue_after(self, reason: str, restarts: int) -> bool:
        """Another try for a failed deployment while `requeue: N` allows one: Slurm puts the
        whole job back in the queue and runs this script again (SLURM_RESTART_COUNT counts the
        tries), away from the nodes that were lost. Whether the job was requeued."""
        allowed = int(self.plan.get("requeue") or 0)
        if not self.job_id:
            return False
        if self.requeued_by_slurm:
            # Slurm requeues a --requeue job itself when a node fails; past `requeue: N` that
            # try is not wanted.
            if restarts < allowed:
                return self._requeued(reason, restarts, "by Slurm")
            self.log(f"Slurm requeued the job after {reason}, past requeue: {allowed}: "
                     "cancelling the new try")
            self._scontrol(["scancel", self.job_id])
            return False
        if restarts >= allowed:
            return False
        err = self._scontrol(["scontrol", "requeue", self.job_id])
        if err:
            self.log(f"scontrol requeue failed: {err}")
            return False
        self.exclude_lost_nodes()
        return self._requeued(reason, restarts, "")

    def _requeued(self, reason: str, restarts: int, by: str) -> bool:
        self.record("requeued", reason=reason, finished_at=round(now(), 3), restarts=restarts + 1)
        self.log(f"failed ({reason}); requeued{' ' + by if by else ''}, try {restarts + 2} of "
                 f"{int(self.plan['requeue']) + 1}")
        return True

    def exclude_lost_nodes(self) -> None:
        """Keep the requeued job off the nodes this try lost: Slurm may not know yet that they
        are gone (until its node timeout) and would start the next try there. Each component
        keeps the exclusions it had."""
        lost = sorted(set(self.excluded_nodes))
        if not lost:
            return
        comps = len(self.plan["components"])
        recs = self.slurm_records()
        for k in range(comps):
            had = recs[k].get("ExcNodeList", "") if k < len(recs) else ""
            nodes = ",".join(([had] if had and had != "(null)" else []) + lost)
            jid = f"{self.job_id}+{k}" if comps > 1 else self.job_id
            err = self._scontrol(["scontrol", "update", f"JobId={jid}", f"ExcNodeList={nodes}"])
            self.log(f"next try kept off {', '.join(lost)}" if not err else
                     f"could not keep the next try off {', '.join(lost)}: {err}")

    @staticmethod
    def _scontrol(argv: list[str]) -> str:
        """Run a Slurm command; its error text, or '' when it succeeded."""
        try:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            return repr(e)
        return "" if res.returncode == 0 else (res.stderr or res.stdout).strip()

    def record(self, phase: str | None = None, **fields) -> None:
        """state.update for the stop path: a failed write is logged, never raised, so that it
        cannot skip the teardown that follows."""
        try:
            self.state.update(phase, **fields)
        except Exception as e:
            self.log(f"could not write state.json ({phase}): {e!r}")

    def serve(self) -> None:
        plan = self.plan
        ports_dir = os.path.join(self.dir, "run", "ports")
        os.makedirs(ports_dir, exist_ok=True)
        for f in os.listdir(ports_dir):  # an earlier try's verdicts say nothing about this one
            os.unlink(os.path.join(ports_dir, f))
        importing = self.start_image_import()
        found = self.discover()
        self.wait_image_import(importing)
        if plan["preflight"]["only"]:  # `hpcserve preflight`: the checks are the whole job
            raise Stop("done", f"preflight passed on {sum(len(v) for v in found.values())} "
                               "node(s)")
        heads = {}
        for inst in plan["instances"]:
            names = found[inst["component"]][inst["node_offset"]:inst["node_offset"] + inst["nodes"]]
            rows = [[str(r), *n] for r, n in enumerate(names)]
            self.nodes[inst["name"]] = rows
            with open(os.path.join(self.dir, "run", f"{inst['name']}.nodes"), "w") as f:
                for row in rows:
                    f.write(" ".join(row) + "\n")
            heads[inst["name"]] = names[0][1]
        for inst in plan["instances"]:
            self.start_step(inst["name"], f"steps/{inst['name']}.sh",
                            [r[1] for r in self.nodes[inst["name"]]])
        self.log(f"started {len(plan['instances'])} engine instance(s)")
        rd = plan["readiness"]
        self.wait_engines(heads, rd)
        self.state.update("engines_ready")
        router = plan.get("router")
        self.state.update(health_urls={i["name"]: self.health_url(heads, i)
                                       for i in plan["instances"]})
        if not router:
            self.state.update("serving", endpoint=None)
            self.start_bench(found, f"http://{heads[plan['instances'][0]['name']]}:"
                                    f"{plan['instances'][0]['port']}")
            self.watch(heads, None)
        env_lines = [f"{i['role'].upper()}_{i['index']}_IP={shlex.quote(heads[i['name']])}"
                     for i in plan["instances"]]
        with open(os.path.join(self.dir, "run", "endpoints.env"), "w") as f:
            f.write("\n".join(env_lines) + "\n")
        rnode = found[router["component"]][router["node_offset"]]
        self.router_node, self.router_addr = rnode[0], rnode[1]
        self.state.update(router_node=rnode[0])
        self.start_step("router", "steps/router.sh", [rnode[0]])
        url = f"http://{rnode[1]}:{router['port']}"
        self.wait_router(url, router["readiness"], rd)
        self.state.update("router_ready", endpoint=url)
        if rd["smoke_tokens"]:
            self.smoke(url, rd)
        self.state.update("serving", endpoint=url, serving_after_s=round(now() - self.t0, 3))
        self.log(f"serving at {url}")
        self.start_bench(found, url)
        self.watch(heads, url)

    # -- the benchmark
    def start_bench(self, found: dict, url: str) -> None:
        """benchmark: the client's step on the router's node (or the one instance's leader),
        told the serving URL through run/endpoints.env."""
        b = self.plan.get("benchmark")
        if not b:
            return
        node = found[b["component"]][b["node_offset"]][0]
        with open(os.path.join(self.dir, "run", "endpoints.env"), "a") as f:
            f.write(f"SERVING_URL={shlex.quote(url)}\n")
        os.makedirs(os.path.join(self.dir, b["dir"]), exist_ok=True)
        self.start_step(BENCH_STEP, "steps/bench.sh", [node])
        self.bench = {"node": node, "t0": now(), "next_scrape": now(),
                      "log_sizes": self.engine_log_sizes()}
        self.state.update(benchmark={"running": True, "node": node, "client": b["client"],
                                     "points": [p["label"] for p in b["points"]],
                                     "started_at": round(now(), 3)})
        self.log(f"benchmark: {b['title']} on {node} against {url}, "
                 f"{len(b['points'])} point(s)")

    def bench_evidence(self, reason: str, bdir: str) -> str:
        """What the logs add to a failed point: the client's last words (or srun's, where the
        step never started it), and the first error an engine logged meanwhile."""
        out = ""
        if "wrote no results" in reason or "did not run" in reason:
            last = (_tail(os.path.join(bdir, "bench.log"), 1) if "wrote" in reason else
                    _tail(os.path.join(self.dir, "logs", f"{BENCH_STEP}.srun.log"), 1,
                          self.log_offsets.get(BENCH_STEP, 0)))
            if last:
                out += f": {last[0].strip()[:300]}"
        seen = self.engine_error(self.bench["log_sizes"])
        return out + (f"; engine log {seen}" if seen else "")

    def engine_log_sizes(self) -> dict:
        """Each engine log's size now: what an engine logs from here on is the benchmark's."""
        logs = os.path.join(self.dir, "logs")
        names = tuple(i["name"] + "." for i in self.plan["instances"])
        out = {}
        for f in os.listdir(logs):
            if f.startswith(names) and f.endswith(".log"):
                out[f] = os.path.getsize(os.path.join(logs, f))
        return out

    def engine_error(self, sizes: dict) -> str | None:
        """The first error an engine logged while the benchmark ran (a client sees only "HTTP
        500"; the decode's log says its KV never came)."""
        for f in sorted(self.engine_log_sizes()):
            for line in _read_from(os.path.join(self.dir, "logs", f),
                                   sizes.get(f, 0)).splitlines():
                if "ERROR" in line or "Error" in line:
                    return f"{f.split('.')[0]} ({f.split('.')[2]}): {line.strip()[:300]}"
        return None

    def metrics_targets(self, heads: dict) -> list:
        """Every Prometheus endpoint of the deployment: each instance leader's /metrics and
        the router's metrics port."""
        out = [(i["name"], f"http://{heads[i['name']]}:{i['port']}/metrics")
               for i in self.plan["instances"]]
        r = self.plan.get("router")
        if r and self.router_addr and r.get("prometheus_port"):
            out.append(("router", f"http://{self.router_addr}:{r['prometheus_port']}/metrics"))
        return out

    def bench_tick(self, heads: dict) -> None:
        """While the benchmark runs: scrape metrics now and then; once its step ended, the
        gate (a Stop unless it passed and the deployment goes on serving)."""
        b, spec = self.bench, self.plan.get("benchmark")
        if not b or b.get("done"):
            return
        step = self.steps[BENCH_STEP]
        every = spec["metrics_interval_s"]
        if step.poll() is None:
            if every and now() >= b["next_scrape"]:
                _bench_module().scrape(self.metrics_targets(heads),
                                       os.path.join(self.dir, spec["dir"], "metrics"))
                b["next_scrape"] = now() + every
            return
        b["done"] = True
        self.bench_verdict(spec, step.returncode)

    def bench_verdict(self, spec: dict, rc: int) -> None:
        bench = _bench_module()
        bdir = os.path.join(self.dir, spec["dir"])
        result = bench.evaluate(bdir, spec)
        result.update(node=self.bench["node"], step_rc=rc,
                      took_s=round(now() - self.bench["t0"], 3))
        f = result["failed"]
        if f:
            f["reason"] += self.bench_evidence(f["reason"], bdir)
        with open(os.path.join(bdir, "summary.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        self.state.update(benchmark=result)
        for p in result["points"]:
            self.log(f"benchmark {bench.one_line(p)}")
        if f:
            raise Stop("failed", f"benchmark failed at point {f['point']}: {f['reason']}",
                       {"step": BENCH_STEP, "role": "benchmark", "node": self.bench["node"],
                        "reason": "benchmark failed", "point": f["point"],
                        "detail": f["reason"]})
        self.log(f"benchmark passed: {len(result['points'])} point(s) in {result['took_s']:.1f} s")
        if spec["then"] == "stop":
            raise Stop("done", f"benchmark passed ({len(result['points'])} point(s))")

    @staticmethod
    def health_url(heads: dict, inst: dict) -> str:
        return f"http://{heads[inst['name']]}:{inst['port']}{inst['health_path']}"

    def watch(self, heads: dict, router_url: str | None) -> None:
        """While serving: probe every instance's leader (its engine's health path) and the
        router's readiness, each probe bounded; ask Slurm about the nodes now and then. Ends
        only by raising Stop: a probe target failing `failures` times in a row, a step that
        ended, a lost node, a signal. (One instance's failure ends the deployment; restarting
        just that instance would take its place here.)"""
        lv = self.plan["liveness"]
        targets = [(i["name"], self.health_url(heads, i)) for i in self.plan["instances"]]
        if router_url:
            targets.append(("router", router_url + self.plan["router"]["readiness"]["path"]))
        failed = dict.fromkeys((n for n, _ in targets), 0)
        next_nodes = now() + lv["node_interval"]
        while True:
            self.sleep(lv["interval"])
            self.bench_tick(heads)
            for name, url in targets:
                self.check()
                kind, detail = probe(url, lv["timeout"])
                if kind is None:
                    if failed[name]:
                        self.log(f"{name} answers again at {url}")
                    failed[name] = 0
                    continue
                failed[name] += 1
                self.log(f"{name}: {kind} ({detail}) at {url}, {failed[name]} of "
                         f"{lv['failures']}")
                if failed[name] >= lv["failures"]:
                    if name in self.steps and self.step_terminating(name):
                        self.step_lost(name)  # not the engine's fault: a node or task is gone
                    if name in self.steps:  # an engine on a crashed node does not answer either
                        self.raise_if_node_lost(name, self.failure_of(name, None))
                    if kind == "hung":
                        self.hung_steps.add(name)
                    raise Stop("failed", f"{name} {kind}: {detail}, {failed[name]} probes of "
                                         f"{url} in a row", self.probe_failure(name, kind, url,
                                                                              detail))
            self.record(health={n: ("ok" if c == 0 else f"failing {c}/{lv['failures']}")
                                for n, c in failed.items()})
            if now() >= next_nodes:
                self.check_nodes()
                next_nodes = now() + lv["node_interval"]

    def probe_failure(self, name: str, kind: str, url: str, detail: str) -> dict:
        f = {**step_identity(name), "node": self.leader_node(name), "node_rank": 0}
        f.update(reason=kind, probe=url, detail=detail, exit_code=None,
                 log=self._log_file(name, 0, f["node"]))
        self.last_words(f)
        return f

    def check_nodes(self) -> None:
        """Slurm's word on the job's nodes: one that is down, failed or not responding ends
        the deployment as a lost node."""
        lost = self.lost_nodes()
        if lost:
            node, state = lost[0]
            raise self.node_lost_stop(node, state, None)

    def lost_nodes(self) -> list[tuple[str, str]]:
        """(node, sinfo state) of the job's nodes that are down, failed, drained or not
        responding (a state with *)."""
        names = sorted({r[1] for rows in self.nodes.values() for r in rows})
        if not names:
            return []
        try:
            out = subprocess.run(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N %t"],
                                 capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return []
        lost = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in names and (
                    parts[1].endswith("*") or parts[1].rstrip("*") in ("down", "fail", "failg")):
                lost.append((parts[0], parts[1]))
        return lost

    def node_lost_stop(self, node: str | None, state: str, how: str | None) -> Stop:
        """The Stop for a lost node, naming the role, instance and rank that ran there."""
        inst = next((n for n, rows in self.nodes.items() if any(r[1] == node for r in rows)),
                    None)
        rank = next((int(r[0]) for r in self.nodes.get(inst, []) if r[1] == node), None)
        self.lost_steps.update(n for n, rows in self.nodes.items()
                               if any(r[1] == node for r in rows))
        if node:
            self.excluded_nodes.append(node)
        what = f"node {node} lost" if node else "a node was lost"
        return Stop("failed", f"{what}: Slurm reports it {state}" + (f"; {how}" if how else ""),
                    {**step_identity(inst), "node": node, "node_rank": rank,
                     "reason": "node lost", "exit_code": None, "slurm_state": state})

    def owns_port(self, name: str, wait: float = 0.0) -> bool:
        """Whether the launch script of `name` (an instance or the router) found its own
        process listening on its port (run/ports/NAME). Raises the port clash it found instead:
        another process, another deployment's on a shared node, holds one of its ports."""
        path = os.path.join(self.dir, "run", "ports", name)
        end = now() + wait
        verdict = _read_from(path, 0).strip()
        while not verdict and now() < end:
            time.sleep(0.02)
            verdict = _read_from(path, 0).strip()
        if not verdict.startswith("taken "):
            return verdict == "ours"
        port, _, holder = verdict[6:].partition(" by ")
        node = self.leader_node(name)
        raise Stop("failed", f"port {port} on node {node} is taken by {holder}: {name} cannot "
                             "serve there (another deployment on a shared node?)",
                   {**step_identity(name), "node": node, "node_rank": 0,
                    "reason": "port taken", "port": int(port), "holder": holder,
                    "exit_code": None})

    def leader_node(self, name: str) -> str | None:
        """Where `name` (an instance or the router) serves: its node rank 0."""
        return self.router_node if name == "router" else self.nodes[name][0][1]

    def wait_engines(self, heads: dict, rd: dict) -> None:
        pending = {i["name"]: f"http://{heads[i['name']]}:{i['port']}{i['health_path']}"
                   for i in self.plan["instances"]}
        total = len(pending)
        answered: set = set()  # answered /health, whoever's process that was
        deadline = now() + rd["engine_timeout"]
        self.state.update(engines_ready_count=0, engines_total=total)
        while pending:
            self.check()
            for name, url in list(pending.items()):
                # each poll may take its full 2 s: a signal must not wait for all instances' polls
                self.check()
                try:
                    code, _ = http_json(url, timeout=2)
                except (OSError, ValueError, urllib.error.URLError):
                    continue
                if code == 200:
                    answered.add(name)
                # it answers: its launch script's port check follows within moments
                if code == 200 and self.owns_port(name, wait=0.5):
                    del pending[name]
                    self.log(f"{name} healthy ({url})")
                    self.state.update(engines_ready_count=total - len(pending))
            if pending:
                if now() > deadline:
                    unowned = sorted(answered & set(pending))
                    raise Stop("failed", f"not healthy within {rd['engine_timeout']} s: "
                                         + ", ".join(sorted(pending)) + (
                                             f" ({', '.join(unowned)} answered, but its launch "
                                             "script never confirmed that it was its own "
                                             "process: see its log)" if unowned else ""),
                               {"role": sorted(pending)[0].rpartition("-")[0],
                                "instance": int(sorted(pending)[0].rpartition("-")[2]),
                                "reason": "readiness timeout"})
                self.sleep(rd["poll_interval"])

    def wait_router(self, url: str, ready: dict, rd: dict) -> None:
        """The router's readiness answers 200 and counts every instance as a healthy worker
        (the sum of the fields the router adapter named; none present: the 200 suffices)."""
        deadline = now() + rd["router_timeout"]
        expected = ready["workers"]
        seen = None
        while True:
            self.check()
            try:
                code, body = http_json(url + ready["path"], timeout=2)
                seen = body
                counts = [_dotted(body, f) for f in ready["count"]]
                counts = [c for c in counts if isinstance(c, int)]
                if code == 200 and (not counts or sum(counts) >= expected) and \
                        self.owns_port("router", wait=0.5):
                    self.log(f"router ready with {expected} worker(s) at {url}")
                    return
            except urllib.error.HTTPError as e:
                seen = f"HTTP {e.code}"
            except (OSError, ValueError, urllib.error.URLError):
                pass
            if now() > deadline:
                raise Stop("failed", f"router not ready with {expected} workers within "
                                     f"{rd['router_timeout']} s (last answer: {seen})",
                           {"role": "router", "reason": "readiness timeout"})
            self.sleep(rd["poll_interval"])

    def smoke(self, url: str, rd: dict) -> None:
        # A router started with --api-key {from_env: NAME} wants it: read NAME from the job's
        # environment (sbatch exported it), never from a file.
        key_env = (self.plan.get("router") or {}).get("api_key_env")
        auth = ({"Authorization": f"Bearer {os.environ.get(key_env, '')}"} if key_env else {})
        body = {"model": self.plan["served_name"], "max_tokens": rd["smoke_tokens"],
                "messages": [{"role": "user", "content": "hpcserve smoke test: say hello"}]}
        # In a thread, so that a signal or a dying step ends the wait at once, not after up to
        # SMOKE_TIMEOUT s; the thread is a daemon and ends with the router's connection.
        box: dict = {}

        def call() -> None:
            try:
                box["result"] = http_json(url + "/v1/chat/completions", body, headers=auth,
                                          timeout=self.SMOKE_TIMEOUT)
            except BaseException as e:
                box["error"] = e

        t = threading.Thread(target=call, name="hpcserve-smoke", daemon=True)
        deadline = now() + self.SMOKE_TIMEOUT
        t.start()
        while t.is_alive():
            self.check()
            if now() > deadline:  # urllib's timeout is per socket operation, not overall
                raise Stop("failed", f"smoke request failed: no answer within "
                                     f"{self.SMOKE_TIMEOUT:g} s",
                           {"role": "router", "reason": "smoke request failed"})
            t.join(0.1)
        try:
            if "error" in box:
                raise box["error"]
            code, resp = box["result"]
        except urllib.error.HTTPError as e:
            raise Stop("failed", f"smoke request failed: HTTP {e.code} "
                                 f"{e.read()[:300].decode(errors='replace')}",
                       {"role": "router", "reason": "smoke request failed"}) from None
        except (OSError, ValueError, urllib.error.URLError) as e:
            raise Stop("failed", f"smoke request failed: {e}",
                       {"role": "router", "reason": "smoke request failed"}) from None
        tokens = ((resp or {}).get("usage") or {}).get("completion_tokens") or 0
        if tokens <= 0:
            raise Stop("failed", "smoke request returned 0 tokens",
                       {"role": "router", "reason": "smoke request returned 0 tokens"})
        self.log(f"smoke request returned {tokens} token(s)")
        self.state.update(smoke_tokens=tokens)

    # -- teardown
    def component_ids(self) -> list[str]:
        """Each het component's own job id: `squeue --steps -j LEADER` lists only component 0's
        steps (Slurm 22.05), so the others must be named by their own ids."""
        n = int(os.environ.get("SLURM_HET_SIZE") or 0)
        ids = [os.environ.get(f"SLURM_JOB_ID_HET_GROUP_{i}", "") for i in range(n)]
        return [i for i in ids if i] or ([self.job_id] if self.job_id else [])

    def step_ids(self) -> dict[str, str]:
        comps = self.component_ids()
        if not comps:
            return {}
        try:
            out = subprocess.run(["squeue", "-h", "--steps", "-j", ",".join(comps),
                                  "-o", "%i %j"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
        ids: dict[str, list[str]] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                ids.setdefault(parts[1], []).append(parts[0])
        return {k: " ".join(v) for k, v in ids.items()}

    def signal_steps(self, names: list[str], sig: str, ids: dict[str, str]) -> None:
        for n in [n for n in names if n in self.lost_steps and self.steps[n].poll() is None]:
            # A step on a lost node: Slurm cannot signal it there (scancel would block on the
            # dead slurmd); ending its srun client here is all that can be done.
            self.log(f"step {n} has a lost node: SIGKILL to its srun client")
            try:
                self.steps[n].kill()
            except OSError:
                pass
        names = [n for n in names if n not in self.lost_steps]
        targets = [sid for n in names if self.steps[n].poll() is None
                   for sid in ids.get(n, "").split()]
        if targets:
            self.log(f"scancel --signal={sig} {' '.join(targets)}")
            try:
                subprocess.run(["scancel", f"--signal={sig}", *targets], capture_output=True,
                               timeout=10)
            except (OSError, subprocess.TimeoutExpired) as e:
                self.log(f"scancel failed: {e!r}")
        for n in names:  # a step Slurm does not list (yet): signal its srun client instead
            if self.steps[n].poll() is None and not ids.get(n):
                self.log(f"step {n} not listed by squeue: {sig} to its srun client")
                try:
                    self.steps[n].send_signal(signal.SIGKILL if sig == "KILL" else signal.SIGTERM)
                except OSError:
                    pass

    def stop_signal(self, step: str) -> str:
        if step in self.hung_steps:
            return "KILL"  # a hung engine answers no TERM: waiting for it only delays the end
        if step == "router":
            return (self.plan.get("router") or {}).get("stop_signal", "TERM")
        inst = next((i for i in self.plan["instances"] if i["name"] == step), {})
        return inst.get("stop_signal", "TERM")

    def wait_steps(self, names: list[str], until: float) -> bool:
        while now() < until:
            if all(self.steps[n].poll() is not None for n in names):
                return True
            time.sleep(0.05)
        return all(self.steps[n].poll() is not None for n in names)

    def slurm_config(self, key: str) -> str | None:
        """A value of `scontrol show config` (asked once per job)."""
        if self._slurm_config is None:
            try:
                self._slurm_config = subprocess.run(["scontrol", "show", "config"],
                                                    capture_output=True, text=True,
                                                    timeout=5).stdout
            except (OSError, subprocess.TimeoutExpired):
                return None
        m = re.search(rf"^{key}\s*=\s*(\S+)", self._slurm_config, re.M)
        return m.group(1) if m else None

    def kill_wait(self) -> float | None:
        """Slurm's KillWait: after a plain scancel, Slurm SIGKILLs every process of the job (this
        one too) that long after its TERM, so the teardown must be over by then."""
        kw = self.slurm_config("KillWait")
        return float(kw) if kw and kw.isdigit() else None

    def teardown_budget(self) -> tuple[float, float]:
        """(seconds for the whole teardown, the time Slurm's own SIGKILL may end this process)."""
        budget = max(2.0, float(self.plan["signal_grace"]) - 5)
        hard_end = float("inf")
        if self.signal_seen and self.signal_seen[0] == signal.SIGTERM and \
                self.signal_reason != "time_limit":
            # TERM may be a plain scancel: Slurm's own SIGKILL follows after KillWait, and the
            # final state must be written before it. Slurm kills what is left anyway. The time
            # limit's TERM (--signal=B:TERM@grace) comes `grace` s before the end: that is the
            # budget then, not KillWait (draining 16 enroot nodes takes more than 15 s).
            kw = self.kill_wait()
            if kw is not None:
                hard_end = self.signal_seen[1] + kw - 0.7
                budget = max(0.5, min(budget, (hard_end - now()) / 2))
        return budget, hard_end

    def teardown(self) -> None:
        self.stop_discovery()
        self.stop_image_import()
        budget, hard_end = self.teardown_budget()
        end = now() + budget
        live = [n for n, p in self.steps.items() if p.poll() is None]
        if not live:
            return
        ids: dict[str, str] = {}
        try:
            ids = self.step_ids()
            # Router first, so no new request reaches an engine that is going away.
            # The benchmark client first: its requests would only fail from here on.
            tiers = [[BENCH_STEP], ["router"],
                     [n for n in self.steps if n not in ("router", BENCH_STEP)]]
            for tier in tiers:
                tier = [n for n in tier if n in self.steps and self.steps[n].poll() is None]
                if not tier:
                    continue
                # All engine steps get their stop signal at once (the spec's stop_signal, TERM
                # for every engine so far), and Slurm delivers it to every task of a step. An
                # engine whose ranks >= 1 ignore it (SGLang's wait for the rank-0 shutdown
                # broadcast) still ends rank 0 first in effect.
                for sig in dict.fromkeys(self.stop_signal(n) for n in tier):
                    names = [n for n in tier if self.stop_signal(n) == sig]
                    self.log(f"SIG{sig} to {', '.join(names)}")
                    self.signal_steps(names, sig, ids)
                self.wait_steps(tier, min(end, now() + max(1.0, (end - now()) / 2)))
        finally:
            # Whatever went wrong above, nothing may outlive the grace period.
            left = [n for n, p in self.steps.items() if p.poll() is None]
            if left:
                self.wait_steps(left, end)
                left = [n for n, p in self.steps.items() if p.poll() is None]
            if left:
                self.log(f"SIGKILL to {', '.join(left)} after the grace period")
                try:
                    ids = self.step_ids() or ids
                except Exception as e:  # never expected: step_ids catches what squeue raises
                    self.log(f"listing steps failed: {e!r}")
                self.signal_steps(left, "KILL", ids)
                if not self.wait_steps(left, min(now() + 5.0, hard_end)):
                    for n in left:
                        if self.steps[n].poll() is None:
                            try:
                                self.steps[n].kill()
                            except OSError:
                                pass
                    self.wait_steps(left, min(now() + 2, hard_end))

    def cleanup_nodes(self, timeout: float) -> None:
        """What tasks leave on their nodes when they end early: enroot containers of tasks that
        were SIGKILLed (srun's --kill-on-bad-exit, or the KILL tier above) before their
        container-task.sh could remove them, and the engine's private temporary directories
        (plan "scratch"). Each is listed by a file under run/ while it exists. Best-effort."""
        jd = os.path.abspath(self.dir)
        if (self.plan.get("container") or {}).get("runtime") == "enroot":
            self._cleanup("container", "containers",
                          ["bash", os.path.join(jd, "launch", "container-task.sh"), "--cleanup"],
                          timeout)
        if self.plan.get("scratch"):
            self._cleanup("scratch", "scratch",
                          ["bash", os.path.join(jd, "launch", "scratch-cleanup.sh")], timeout)

    def _cleanup(self, what: str, marks: str, argv: list[str], timeout: float) -> None:
        made = os.path.join(self.dir, "run", marks)  # one file per thing not removed yet
        try:
            left = sorted(os.listdir(made))
        except OSError:
            return
        if not left:
            return
        self.log(f"{what} left behind: {', '.join(left)}; removing them")
        comps = self.plan["components"]
        procs = []
        with open(os.path.join(self.dir, "logs", f"{what}-cleanup.log"), "ab") as out:
            # One step per component on all its nodes: each removes only the leftovers of the
            # node it runs on, so every node must run it.
            for c in comps:
                cmd = ["srun", *([f"--het-group={c['index']}"] if len(comps) > 1 else []),
                       f"--nodes={c['nodes']}", f"--ntasks={c['nodes']}", "--ntasks-per-node=1",
                       "--overlap", f"--job-name={what}-cleanup", "--kill-on-bad-exit=0", *argv]
                try:
                    procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL))
                except OSError as e:
                    self.log(f"{what} cleanup on component {c['index']}: {e!r}")
        end = now() + timeout
        while now() < end and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                self.log(f"{what} cleanup still running after {timeout:.0f} s: stopping it")
                try:
                    p.terminate()
                    p.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    try:
                        p.kill()
                        p.wait(timeout=2)
                    except (OSError, subprocess.TimeoutExpired):
                        pass
                except OSError:
                    pass
        try:
            left = sorted(os.listdir(made))
        except OSError:
            left = []
        self.log(f"{what} cleanup: " + (f"still left: {', '.join(left)} (see "
                                        f"logs/{what}-cleanup.log)" if left else "none left"))


_SIGNALS = {"Killed": 9, "Terminated": 15, "Segmentation fault": 11, "Aborted": 6, "Bus error": 7}


def probe(url: str, timeout: float) -> tuple[str | None, str]:
    """(None, "") when `url` answers 2xx/3xx/4xx within `timeout`; else the kind of failure:
    hung (no answer in time), unreachable (refused, no route) or unhealthy (an error status)."""
    try:
        with _DIRECT.open(urllib.request.Request(url), timeout=timeout) as r:
            r.read(65536)
        return None, ""
    except urllib.error.HTTPError as e:
        return ("unhealthy", f"HTTP {e.code}") if e.code >= 500 else (None, "")
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            return "hung", f"no answer within {timeout:g} s"
        return "unreachable", str(e.reason)
    except (socket.timeout, TimeoutError):
        return "hung", f"no answer within {timeout:g} s"
    except OSError as e:
        return "unreachable", str(e)


def _task_ids(spec: str) -> list[int]:
    """Slurm's task list ("1", "0-3", "0,2-3") as task ids."""
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def _dotted(obj, path: str):
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _seconds(s: str) -> int | None:
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", s.strip())
    if not m:
        return None
    d, h, mi, se = (int(x) if x else 0 for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + se


def step_identity(name: str | None) -> dict:
    """The step, role and instance a failure names, from a step name: "decode-0", "router",
    or None where no step is known."""
    if name is None:
        return {"step": None, "role": None, "instance": None}
    role, _, idx = name.rpartition("-")
    return {"step": name, "role": role or name,
            "instance": int(idx) if idx.isdigit() else None}


def _read_from(path: str, offset: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _first_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.readline()
    except OSError:
        return ""


def _tail(path: str, n: int = 20, offset: int = 0) -> list[str]:
    return _read_from(path, offset).splitlines()[-n:]


_ERROR_LINE = re.compile(r"\b(ERROR|FATAL|CRITICAL|Error|Fatal|Segfault|Segmentation fault|"
                         r"Traceback|Aborted)\b")


def _last_error(lines: list[str]) -> str | None:
    """The last line that reports an error (Python's, an engine logger's, a crash handler's),
    not a line of a stack trace."""
    for ln in reversed(lines):
        if _ERROR_LINE.search(ln) and not ln.lstrip().startswith(("File ", "at ", "#")):
            return ln.strip()[:500]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hpcserve_job.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="orchestrate the deployment (called by job.sbatch)")
    r.add_argument("job_dir")
    d = sub.add_parser("discover", help="print this node's address line")
    d.add_argument("--iface", default="auto")
    d.add_argument("--ib", default="none")
    d.add_argument("--component", type=int, default=0, help="this step's het-job component")
    d.add_argument("--preflight", metavar="JOB_DIR",
                   help="also run the preflight checks of JOB_DIR/plan.json on this node")
    a = ap.parse_args(argv)
    if a.cmd == "discover":
        return cmd_discover(a)
    try:
        job = Job(a.job_dir)
    except SpecError as e:
        return refuse(a.job_dir, str(e))
    return job.run()


if __name__ == "__main__":
    sys.exit(main())
