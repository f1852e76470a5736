"""Another try for a failed deployment while `requeue: N` allows one: Slurm puts the whole job
back in the queue and runs the batch script again (SLURM_RESTART_COUNT counts the tries), each
het component kept off the nodes this try lost."""

from __future__ import annotations

from .slurm import Unreachable
from .state import now


class Requeue:
    def __init__(self, job):
        self.job = job

    def after(self, reason: str, restarts: int) -> bool:
        """Whether the failed job was requeued (by Slurm itself, or now)."""
        allowed = int(self.job.plan.requeue)
        if not self.job.job_id or self.job.allocation.active:
            # in an allocation the user holds: the allocation is theirs, never requeued here
            return False
        if self.job.supervisor.requeued_by_slurm:
            # Slurm requeues a --requeue job itself when a node fails; past `requeue: N` that
            # try is not wanted.
            if restarts < allowed:
                return self._requeued(reason, restarts, "by Slurm")
            self.job.log(f"Slurm requeued the job after {reason}, past requeue: {allowed}: "
                         "cancelling the new try")
            self.job.slurm.command(["scancel", self.job.job_id])
            return False
        if restarts >= allowed:
            return False
        # retried while the controller does not answer: a failed deployment is requeued once
        # Slurm can take it, not dropped because it was restarting
        err = self.job.slurm.command(["scontrol", "requeue", self.job.job_id])
        if err:
            self.job.log(f"scontrol requeue failed: {err}")
            return False
        self.exclude_lost_nodes()
        return self._requeued(reason, restarts, "")

    def _requeued(self, reason: str, restarts: int, by: str) -> bool:
        self.job.state.record(self.job.log, "requeued", reason=reason,
                              finished_at=round(now(), 3), restarts=restarts + 1)
        self.job.log(f"failed ({reason}); requeued{' ' + by if by else ''}, try "
                     f"{restarts + 2} of {int(self.job.plan.requeue) + 1}")
        return True

    def exclude_lost_nodes(self) -> None:
        """Keep the requeued job off the nodes this try lost: Slurm may not know yet that they
        are gone (until its node timeout) and would start the next try there. Each component
        keeps the exclusions it had."""
        lost = sorted(set(self.job.supervisor.excluded_nodes))
        if not lost:
            return
        comps = len(self.job.plan.components)
        try:
            recs = self.job.slurm.records()
        except (RuntimeError, Unreachable):
            recs = []
        for k in range(comps):
            had = recs[k].get("ExcNodeList", "") if k < len(recs) else ""
            nodes = ",".join(([had] if had and had != "(null)" else []) + lost)
            jid = f"{self.job.job_id}+{k}" if comps > 1 else self.job.job_id
            err = self.job.slurm.command(["scontrol", "update", f"JobId={jid}",
                                          f"ExcNodeList={nodes}"])
            self.job.log(f"next try kept off {', '.join(lost)}" if not err else
                         f"could not keep the next try off {', '.join(lost)}: {err}")
