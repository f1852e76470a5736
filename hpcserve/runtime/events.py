"""What the concerns see and the serving loop (job.py) acts on.

A concern that sees something another concern must act on reports it here instead of calling
that concern: the supervisor and liveness see an instance fail or a node go, recovery sees an
instance that can only join the router by restarting it. The loop takes the events in the
order they came, once per tick, and hands each to the concern that acts on it. The other
things the loop hears of come through files or Slurm and are read where they land: a drain
request (run/control/, drain.py), the time limit (supervise.py, renew.py).
"""

from __future__ import annotations

from collections import deque, namedtuple

# namedtuples rather than dataclasses: the runtime starts with every job's batch script, and
# dataclasses would bring inspect and typing into its start (12 ms of its ~240).


class InstanceFailed(namedtuple("InstanceFailed", "name reason failure")):
    """An instance failed while the deployment serves: recovery takes it out and restarts it.
    reason: its short words ("exited with code 137", "hung", "node lost", ...); failure:
    state.json's failure record (step, role, instance, node, rank, log)."""
    __slots__ = ()


class NodeLost(namedtuple("NodeLost", "node state")):
    """Slurm reports a node of the job down (state: Slurm's word for it, or how it was told):
    every instance with a rank there fails."""
    __slots__ = ()


class RouterRestartAsked(namedtuple("RouterRestartAsked", "name")):
    """An instance is ready to serve again, but its router takes no worker while it runs: the
    router restarts with the serving set, then the instance registers (or fails)."""
    __slots__ = ()


class Events:
    def __init__(self):
        self._queue: "deque[InstanceFailed | NodeLost | RouterRestartAsked]" = deque()

    def put(self, event: InstanceFailed | NodeLost | RouterRestartAsked) -> None:
        self._queue.append(event)

    def take(self) -> list:
        """Every event reported since the last take, in order."""
        out = list(self._queue)
        self._queue.clear()
        return out
