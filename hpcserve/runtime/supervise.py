"""Watching the job while it waits for anything: a signal that arrived, a step that ended, srun
stuck ending a step on a node that is gone, a node Slurm calls down. check() raises the Stop that
says which, with the failure named by role, instance, node and rank, and the log line to read."""

from __future__ import annotations

import os
import signal
import socket
import time

from .events import InstanceFailed, NodeLost
from .failures import (HUNG, NODE_LOST, PORT_TAKEN, PREEMPTED, Stop, TERMINATED, UNHEALTHY,
                       UNREACHABLE, primary_task, step_identity, task_ends)
from .logs import last_error, read_from
from .slurm import Unreachable
from .slurm_cluster import node_lost
from .state import now

BENCH_STEP = "bench"  # its end is the benchmark gate's to judge, not a crash


def _reason(stop: Stop) -> str:
    """A failure's short words for an instance's record: "exited with code 137", "hung"..."""
    f = stop.failure or {}
    if f.get("reason") in (NODE_LOST, HUNG, UNREACHABLE, UNHEALTHY, PORT_TAKEN):
        return f["reason"]
    if f.get("exit_code") is not None:
        return f"exited with code {f['exit_code']}"
    return stop.reason


class Supervisor:
    STUCK_SRUN = 2.0  # s an srun may take to exit after it said it ends the step

    def __init__(self, job):
        self.job = job
        self.signal_seen: tuple[int, float] | None = None  # (signum, when), set by on_signal
        self.signal_reason: str | None = None
        self.signal_stop: Stop | None = None   # what signal_reason means, set with it
        self.requeued_by_slurm = False          # Slurm put the job back in the queue itself
        self.excluded_nodes: list[str] = []     # lost nodes a requeue must not land on again
        self.lost_steps: set[str] = set()       # steps with a node that is gone
        self.hung_steps: set[str] = set()       # steps whose engine stopped answering
        self.terminating_since: dict[str, float] = {}
        self.reported: set = set()   # srun clients whose failure went to the serving loop
        self._resolving = False

    def pause(self, seconds: float) -> bool:
        """Wait between two tries of a Slurm query; False, at once, when a signal arrived that
        is not decided yet (the caller gives up the query and the next check() decides it)."""
        end = now() + seconds
        while now() < end:
            if self.signal_seen is not None and self.signal_reason is None and \
                    not self._resolving:
                return False
            time.sleep(min(0.1, max(0.0, end - now())))
        return True

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
        (signal_stop holds the Stop it means)."""
        if self.signal_reason or self.signal_seen is None:
            return self.signal_reason
        signum, at = self.signal_seen
        self._resolving = True
        try:
            stop = self._stop_for(signum, at)
        finally:
            self._resolving = False
        self.signal_stop = stop
        self.signal_reason = {NODE_LOST: "node_lost", PREEMPTED: "preempted",
                              TERMINATED: "terminated"}.get(
            (stop.failure or {}).get("reason"), stop.reason)
        self.job.log(f"received {signal.Signals(signum).name}: {stop.reason}")
        return self.signal_reason

    def _stop_for(self, signum: int, at: float) -> Stop:
        # USR1 comes from `hpcserve cancel` (scancel --batch --signal=USR1): a requested stop.
        # TERM comes from a scancel, from --signal=B:TERM@grace before the time limit, or from
        # Slurm ending the job for a failed node or a preemption: Slurm's record tells which.
        return Stop("cancelled", "cancelled") if signum == signal.SIGUSR1 else \
            self.why_terminated(at)

    def why_terminated(self, at: float) -> Stop:
        """Why a TERM came, from Slurm's record of the job and of its nodes: a node that failed
        (Slurm ends the job NODE_FAIL, or requeues it), a preemption, the time limit, or else a
        scancel. Node failure and preemption are failures (requeue: N applies). While the
        controller does not answer, the cause cannot be asked: that is said, not guessed."""
        # asked with short tries: the teardown's grace is running
        with self.job.slurm.within(5.0):
            try:
                return self._slurm_says(at)
            except Unreachable as e:
                return Stop("failed", f"terminated by SIGTERM while {e}: whether a scancel, "
                                      "the time limit or a lost node sent it could not be asked",
                            {"step": None, "role": None, "instance": None, "node": None,
                             "reason": TERMINATED, "detail": str(e), "exit_code": None})
            except RuntimeError:
                return Stop("cancelled", "cancelled")  # Slurm's error tells nothing more

    def _slurm_says(self, at: float) -> Stop:
        """The Stop that Slurm's record of the job and its nodes points at."""
        recs = self.job.slurm.records()
        mine = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        self.requeued_by_slurm = any(int(r.get("Restarts") or 0) > mine for r in recs)
        lost = self.lost_nodes()
        if lost or any(r.get("Reason") == "NodeDown" for r in recs):
            node, state = lost[0] if lost else (None, "down")
            return self.node_lost_stop(node, state, "Slurm is ending the job")
        if any(r.get("PreemptTime") not in (None, "", "None", "Unknown") for r in recs):
            return Stop("failed", "preempted: Slurm is ending the job for another one",
                        {"step": None, "role": None, "instance": None, "node": None,
                         "reason": PREEMPTED, "exit_code": None})
        if self._near_time_limit(at):
            return Stop("cancelled", "time_limit")
        return Stop("cancelled", "cancelled")

    def _near_time_limit(self, at: float) -> bool:
        left = self.job.slurm.time_left()
        # what was left when the signal arrived, not now
        return left is not None and left + (now() - at) <= self.job.plan.signal_grace + 90

    # -- the check every wait makes
    def check(self) -> None:
        if self.resolve_signal():
            raise self.signal_stop
        if self.job.allocation.time_is_up(now()):
            raise Stop("cancelled", "time_limit")
        table = self.job.table
        for name, p in list(self.job.steps.items()):
            if name == BENCH_STEP or p in self.reported:
                continue  # its end is the gate's to judge (bench_tick), not a crash
            try:
                self._check_step(name, p)
            except Stop as s:
                # While serving, one instance's failure is recovery's to handle; a signal, the
                # router's failure or a failure before serving ends the deployment.
                if s is self.signal_stop or not table.handles(name) or \
                        (s.failure or {}).get("step") != name:
                    raise  # (the last: a lost router node found while checking this step)
                self.reported.add(p)
                self.job.events.put(InstanceFailed(name, _reason(s),
                                                   s.failure or step_identity(name)))

    def _check_step(self, name: str, p) -> None:
        steps = self.job.steps
        rc = p.poll()
        if rc is not None:
            # Out of the router at once, before anything else is asked: each moment it stays
            # in, requests go to an engine that is gone (harmless when a scancel ends it all).
            self.job.membership.take_out(name)
            time.sleep(0.3)  # a scancel signals steps and us together: let our signal land
            if self.resolve_signal():
                raise self.signal_stop
            # a step that ended on a node Slurm now calls down ended with its node
            if self.check_nodes() & {r[1] for r in self.job.instances.nodes.get(name, [])}:
                self.reported.add(p)
                return  # its node is lost: that event takes it out
            # one that could not bind its port: its launch script's check names the holder
            self.job.instances.owns_port(name, wait=0.5)
            raise Stop("failed", f"step {name} exited with code {rc}", self.failure_of(name, rc))
        if steps.terminating(name):
            # srun reported a task's end and is ending the step but has not exited after
            # a while: it waits for a node that is gone (its slurmstepd with it), until
            # Slurm's node timeout. The step is lost now.
            first = self.terminating_since.setdefault(steps.slurm_name(name), now())
            if now() - first > self.STUCK_SRUN:
                if self.resolve_signal():
                    raise self.signal_stop
                self.step_lost(name)

    # -- a step's end, in its failure's words
    def failure_of(self, name: str, rc) -> dict:
        inst = self.job.instances
        f = {**step_identity(name), "exit_code": rc}
        tasks = task_ends(self.job.steps.this_try(name), inst.nodes.get(name, []),
                          inst.tasks_per_node(name))
        if tasks:
            f["tasks"] = tasks
            primary = primary_task(tasks)
            f.update(node=primary["node"], node_rank=primary["node_rank"],
                     exit_code=primary["exit_code"])
            if inst.tasks_per_node(name) > 1:  # one MPI rank per GPU: name the rank too
                f["rank"] = primary["task"]
        elif name in inst.nodes and len(inst.nodes[name]) == 1:
            f["node"] = inst.nodes[name][0][1]
            f["node_rank"] = 0
        f["log"] = inst.log_file(name, f.get("node_rank"), f.get("node"), f.get("rank"))
        self.last_words(f)
        return f

    def last_words(self, f: dict) -> None:
        """The failure's log tail and the last error line in it (a Python stack trace's frames
        are not one). Read again once the steps are gone: an engine may still be writing its
        last lines when its task's end is first seen."""
        if not f.get("step"):
            return
        srun_log = self.job.steps.srun_log_rel(f["step"])
        rel = f.get("log") or srun_log
        text = read_from(os.path.join(self.job.dir, rel),
                         self.job.steps.offsets.get(f["step"], 0) if rel == srun_log else 0)
        lines = text.splitlines()
        f["log_tail"] = lines[-20:]
        f["error"] = last_error(lines)

    # -- nodes that are gone
    def step_lost(self, name: str) -> None:
        """A step srun could not end: name the node that is gone if there is one, else the
        task that ended."""
        f = self.failure_of(name, None)
        self.raise_if_node_lost(name, f, {t["node"] for t in f.get("tasks", [])})
        raise Stop("failed", f"step {name}: a task ended and srun is terminating the step", f)

    def raise_if_node_lost(self, name: str, f: dict, reported: set = frozenset()) -> None:
        """The first node of the step whose slurmd does not answer (among those srun did not
        report a task of) ends the deployment as a lost node."""
        for rank, node, *_ in self.job.instances.nodes.get(name, []):
            if node not in reported and not self.slurmd_answers(node):
                self.lost_steps.add(name)
                self.excluded_nodes.append(node)
                f.update(node=node, node_rank=int(rank), reason=NODE_LOST, exit_code=None,
                         log=self.job.instances.log_file(name, int(rank), node))
                raise Stop("failed", f"node {node} lost: step {name} cannot end there "
                                     "(its slurmd does not answer)", f)

    def slurmd_answers(self, node: str) -> bool:
        """A TCP connection to the node's slurmd: a crashed node refuses or times out."""
        try:
            addr = self.job.slurm.slurmd_addresses(self.job.instances.node_names()).get(node)
        except (RuntimeError, Unreachable):
            addr = None
        if addr is None:
            return True  # cannot tell: do not blame the node
        try:
            with socket.create_connection(addr, timeout=2):
                return True
        except OSError:
            return False

    def check_nodes(self) -> set[str]:
        """Slurm's word on the job's nodes: one that is down, failed or not responding takes
        out the instances on it while serving (an event for recovery; the nodes reported now
        are returned), and ends the deployment before, or where the router or the batch host
        ran. A controller that does not answer says nothing
        of them: the deployment goes on, and the next poll asks again (not retried here: the
        probes of the serving engines wait meanwhile)."""
        try:
            lost = self.lost_nodes(retry=False)
        except Unreachable as e:
            self.job.note_unreachable(e)
            return set()
        except RuntimeError:
            return set()
        self.job.note_unreachable(None)
        news = set()
        for node, state in lost:
            if not self.job.table.active or node == self.job.instances.router_node or \
                    node == os.environ.get("SLURMD_NODENAME"):  # the batch host: this process
                raise self.node_lost_stop(node, state, None)
            if node not in self.excluded_nodes:
                self.excluded_nodes.append(node)
                self.job.events.put(NodeLost(node, state))
                news.add(node)
        return news

    def lost_nodes(self, retry: bool = True) -> list[tuple[str, str]]:
        """(node, sinfo state) of the job's nodes that are down, failed, drained or not
        responding (a state with *)."""
        names = self.job.instances.node_names()
        states = self.job.slurm.node_states(names, retry=retry)
        return [(n, s) for n, s in states.items() if n in names and node_lost(s)]

    def node_lost_stop(self, node: str | None, state: str, how: str | None) -> Stop:
        """The Stop for a lost node, naming the role, instance and rank that ran there."""
        inst, rank = self.job.instances.on_node(node)
        self.lost_steps.update(self.job.instances.using(node))
        if node:
            self.excluded_nodes.append(node)
        what = f"node {node} lost" if node else "a node was lost"
        return Stop("failed", f"{what}: Slurm reports it {state}" + (f"; {how}" if how else ""),
                    {**step_identity(inst), "node": node, "node_rank": rank,
                     "reason": NODE_LOST, "exit_code": None, "slurm_state": state})
