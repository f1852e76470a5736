"""How the deployment ends, and what a failure names: the Stop that ends it, the step, role,
instance, node and rank a failure points at, and what srun's log says about each task's end."""

from __future__ import annotations

import re


# The kinds of failure: state.json's failure.reason, and an instance's "why" where one is its
# cause. Declared once here; every module that names or compares one uses these.
NODE_LOST = "node lost"                      # Slurm calls a node down, or its slurmd is gone
HUNG = "hung"                                # no answer in time, and no sign of progress
UNREACHABLE = "unreachable"                  # refused, no route
UNHEALTHY = "unhealthy"                      # an error status (5xx) from its health path
PORT_TAKEN = "port taken"                    # another process holds one of its ports
READINESS_TIMEOUT = "readiness timeout"      # not healthy (or not ready) within its timeout
SMOKE_FAILED = "smoke request failed"
SMOKE_EMPTY = "smoke request returned 0 tokens"
REGISTRATION_FAILED = "router registration failed"
ROUTER_RESTART_FAILED = "router restart failed"
BENCHMARK_FAILED = "benchmark failed"        # the benchmark's gate: not requeued
PREEMPTED = "preempted"
TERMINATED = "terminated"                    # a TERM whose cause Slurm could not be asked
INCOMPATIBLE = "incompatible job directory"  # plan.json this runtime cannot read
# a probe's kinds: what the liveness verdict and an instance's record say
PROBE_KINDS = (HUNG, UNREACHABLE, UNHEALTHY)


class Stop(Exception):
    """The deployment must end: a step exited, a deadline passed, or a signal arrived."""

    def __init__(self, phase: str, reason: str, failure: dict | None = None):
        super().__init__(reason)
        self.phase = phase
        self.reason = reason
        self.failure = failure


def step_identity(name: str | None) -> dict:
    """The step, role and instance a failure names, from a step name: "decode-0", "router",
    or None where no step is known."""
    if name is None:
        return {"step": None, "role": None, "instance": None}
    role, _, idx = name.rpartition("-")
    return {"step": name, "role": role or name,
            "instance": int(idx) if idx.isdigit() else None}


_SIGNALS = {"Killed": 9, "Terminated": 15, "Segmentation fault": 11, "Aborted": 6, "Bus error": 7}
# srun's words for a task that is gone, and for ending the step (`--kill-on-bad-exit`, --wait)
_TERMINATING = re.compile(r"Terminating StepId|Force Terminated|task \d+: (Exited|Killed|"
                          r"Terminated|Segmentation|Aborted|Bus error)")


def srun_terminating(text: str) -> bool:
    """Whether srun's log says it is ending the step because a task ended."""
    return bool(_TERMINATING.search(text))


def task_ids(spec: str) -> list[int]:
    """Slurm's task list ("1", "0-3", "0,2-3") as task ids."""
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def task_ends(text: str, rows: list, tasks_per_node: int) -> list[dict]:
    """Each task srun reports ended, from its log: node, node rank, task, how, exit code, and
    whether it is a cause (reported before srun started ending the step) or srun's own kill."""
    tasks = []
    stop_at = re.search(r"_step_signal: Terminating|Force Terminated", text)
    # "task 3:", or for several ranks of one node "tasks 2-3:" (MPI engines)
    for m in re.finditer(r"error: (\S+): tasks? (\d+)[\d,-]*: (Exited with exit code (\d+)|"
                         r"Killed|Terminated|Segmentation fault|Aborted|Bus error)", text):
        code = int(m.group(4)) if m.group(4) else None
        rank = next((int(r) for r, nname, *_ in rows if nname == m.group(1)), None)
        tasks.append({"node": m.group(1), "node_rank": rank, "task": int(m.group(2)),
                      "how": m.group(3),
                      "exit_code": code if code is not None else 128 + _SIGNALS.get(
                          m.group(3), 9),
                      "cause": stop_at is None or m.start() < stop_at.start()})
    # A task that ended with code 0 while the others ran: srun's --wait ends the step and
    # lists each task's state first ("StepId=4.1 task 1: exited").
    for m in re.finditer(r"StepId=\S+ tasks? ([\d,-]+): exited$", text, re.M):
        for task in task_ids(m.group(1)):
            rank = task // tasks_per_node
            tasks.append({"node": rows[rank][1] if rank < len(rows) else None,
                          "node_rank": rank, "task": task, "how": "exited",
                          "exit_code": 0, "cause": True})
    return tasks


def primary_task(tasks: list[dict]) -> dict:
    """The task to blame: a cause before srun's own kills; among causes a signal death (OOM
    killer, segfault) first, then an unusual exit code."""
    return min(tasks, key=lambda t: (not t["cause"],
                                     0 if not t["how"].startswith("Exited") else
                                     1 if t["exit_code"] not in (0, 1) else 2))
