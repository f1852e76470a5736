"""Ending one instance's step while the others serve: a failed attempt (recovery.py) or an
instance leaving on request (drain.py). Its step is signalled through Slurm (by step id;
through its srun client where its node is lost) and retired from the watched steps at once;
each tick of the serving loop then waits for its srun client, which is KILLed if it has not
ended STOP_WAIT_S after the signal."""

from __future__ import annotations

from .failures import HUNG
from .state import now
from .table import OUT

STOP_WAIT_S = 10.0   # s an old attempt's step may take to end after its signal, then KILL
STOPPING = "stopping"


class Stopper:
    def __init__(self, job):
        self.job = job

    def stop(self, rec, sig: str | None = None) -> None:
        """`rec`'s step ended: `sig`, else KILL for a hung engine (it answers no TERM), TERM
        for any other."""
        job = self.job
        rec.task = None
        if rec.name not in job.steps:
            return
        proc = job.steps[rec.name]
        if proc.poll() is None:
            lost = job.supervisor.lost_steps if rec.lost else set()
            sig = sig or ("KILL" if rec.why_first == HUNG else "TERM")
            job.steps.signal([rec.name], sig,
                             job.step_ids(errors=Exception), lost, job.slurm, job.log)
        rec.old = job.steps.retire(rec.name)
        rec.deadline = now() + STOP_WAIT_S
        rec.stage = STOPPING

    def tick(self) -> None:
        """Every instance whose step is ending: done once its srun client exited (one that is
        out then waits for its restart), KILLed once its grace is over."""
        for rec in list(self.job.table.recs.values()):
            if rec.stage == STOPPING:
                self._stopping(rec)

    def _stopping(self, rec) -> None:
        old = rec.old
        if old is None or old.poll() is not None:
            rec.old = None
            rec.stage = "waiting" if rec.status == OUT else None
            return
        if now() > rec.deadline:
            self.job.log(f"{rec.name}: attempt {rec.attempt} did not end: SIGKILL to its srun")
            try:
                old.kill()
            except OSError:
                pass
            rec.deadline = now() + STOP_WAIT_S
