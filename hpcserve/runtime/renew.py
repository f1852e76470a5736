"""Renewal: an instance job (plan.json attach) that hands its instances over to its twin before
its time limit, so that the deployment serves on across every instance job's limit.

`hpcserve scale --add` rendered the job twice, <role>-<seq>/ and <role>-<seq>b/, each plan.json's
renew naming the other (twin_dir) and the margin (margin_s). While serving, the orchestrator
reads its own job's end from Slurm (squeue %L, again every REREAD_S) and, margin_s before it,
runs sbatch on the twin's job.sbatch: once, and only while the twin's directory is not in use
(its state.json absent or ended: a directory runs again in place once its last job ended).
When the twin's state.json says serving under that successor's job id, this job drains every
instance of its own through the drain requests of drain.py (out of the router first, in-flight
requests finished) and ends "done", "renewed by job N". The twin does the same in turn. A job
scaled in on request (`hpcserve scale --remove`) renews no more: its twin would bring every
instance back.

Slurm's warning signal is the trigger of last resort: the job is rendered with
--signal=B:23@margin_s (contract.RENEW_SIGNAL, SIGURG) in place of TERM at signal_grace, which Slurm
may send up to 60 s early (sbatch(1), --signal); it submits the successor at once if this job
has not yet. Without that TERM, the job stops itself signal_grace before its limit (time_is_up,
asked by every check), as a job in an allocation does: the teardown at the limit stays orderly.
"""

from __future__ import annotations

import os
import signal

from .contract import RENEW_SIGNAL, SERVING_PHASES, TERMINAL_PHASES
from .drain import write_request
from .failures import Stop
from .slurm import Unreachable
from .spec import Renew
from .state import now, read_state
from .table import DRAINING, LEAVING, SERVING

REREAD_S = 30.0   # s between two reads of the job's end (an extension moves it)
RETRY_S = 5.0     # s before an sbatch that failed, or a successor that ended, is tried again
TRIES = 3         # successors submitted at most (one that fails before serving is replaced)
DRAIN_S = 60.0    # s at most for an instance's in-flight requests once it left the router


class Renewal:
    def __init__(self, job):
        self.job = job
        self.spec: Renew | None = job.plan.renew
        self.end: float | None = None     # when Slurm's time limit ends the job
        self.asked = -REREAD_S
        self.signalled = False            # RENEW_SIGNAL came
        self.successor: str | None = None
        self.tries = 0
        self.next_try = 0.0
        self.waiting_said = False
        self.renewed = False              # the twin serves: this job's instances drain
        self.withdrawn = False            # scaled in on request: no renewal any more
        self.end_reason: str | None = None  # what the job ends for once the twin took over
        if self.spec is not None:
            signal.signal(getattr(signal, "SIG" + RENEW_SIGNAL), self._on_signal)
            # one that came while job.sbatch ran, before this handler (job.sbatch.j2)
            self.signalled = os.environ.get("HPCSERVE_RENEW_SIGNALLED") == "1"

    def _on_signal(self, _signum, _frame) -> None:
        self.signalled = True  # only recorded: tick() acts on it (see Supervisor.on_signal)

    # -- the job's end, from Slurm
    def end_at(self, at: float) -> float | None:
        """The job's end, asked again every REREAD_S; an unreachable controller keeps the last
        answer (said once, as the job's other queries say it)."""
        if at - self.asked >= REREAD_S:
            self.asked = at
            try:
                left = self.job.slurm.time_left(retry=False)
            except Unreachable as e:
                self.job.note_unreachable(e)
            except RuntimeError as e:
                self.job.log(f"asking job {self.job.job_id}'s time limit failed: {e}")
            else:
                self.job.note_unreachable(None)
                self.end = at + left if left is not None else self.end
        return self.end

    def time_is_up(self, at: float) -> bool:
        """Whether the job ends within signal_grace: time to stop (its TERM is not asked for)."""
        if self.spec is None:
            return False
        end = self.end_at(at)
        return end is not None and at >= end - float(self.job.plan.signal_grace)

    # -- while serving, between liveness rounds
    def tick(self) -> None:
        if self.spec is None or not self.job.table.active:
            return
        if self.renewed:
            return self._handed_over()
        if self.withdrawn or self._scaled_in():
            return
        at = now()
        if self.successor is None:
            end = self.end_at(at)
            why = "Slurm's warning signal" if self.signalled else \
                f"{self.spec.margin_s:g} s before the time limit" if end is not None and \
                at >= end - self.spec.margin_s else None
            if why and at >= self.next_try and self.tries < TRIES:
                self._submit(why)
        else:
            self._watch(at)

    def _scaled_in(self) -> bool:
        """An instance drained on request (`hpcserve scale --remove`) ends renewal: the twin
        would start every instance again. A successor not serving yet is cancelled."""
        if not self.job.table.any_status(*LEAVING):
            return False
        self.withdrawn = True
        said = "an instance was drained on request: this job no longer renews"
        if self.successor:
            err = self.job.slurm.command(["scancel", self.successor], retry=False)
            said += f"; its successor job {self.successor} " + (
                f"could not be cancelled: {err}" if err else "is cancelled")
        self.job.log(said)
        return True

    def _submit(self, why: str) -> None:
        twin, job = self.spec.twin_dir, self.job
        st = read_state(twin)
        if self._in_use(st):
            if not self.waiting_said:
                job.log(f"renewal due ({why}) but {twin} is in use by job {st.get('job_id')} "
                        f"({st.get('phase')}): waiting for it to end")
                self.waiting_said = True
            self.next_try = now() + RETRY_S
            return
        self.tries += 1
        try:
            jid = job.slurm.submit(os.path.join(twin, "job.sbatch"))
        except (RuntimeError, Unreachable) as e:
            job.log(f"renewal: sbatch of {twin}/job.sbatch failed: {e}")
            self.next_try = now() + RETRY_S
            if self.tries >= TRIES:
                self._lapse(f"sbatch of {twin}/job.sbatch failed: {e}")
            return
        self.successor = jid
        job.log(f"renewal ({why}): submitted job {jid} in {twin}")
        job.state.record(job.log, renew={"twin_dir": twin, "end_at": self.end,
                                         "successor_job_id": jid,
                                         "submitted_at": round(now(), 3), "trigger": why,
                                         "renewed_at": None})

    def _in_use(self, st: dict) -> bool:
        """Whether the twin's directory is in use: its state.json has not ended and Slurm still
        knows the job that wrote it (one killed outright, or lost with its node, never wrote
        its end; a controller that does not answer leaves the directory in use)."""
        if not st or st.get("phase") in TERMINAL_PHASES:
            return False
        jid = str(st.get("job_id") or "")
        return bool(jid) and self.job.slurm.job_alive(jid) is not False

    def _watch(self, at: float) -> None:
        st = read_state(self.spec.twin_dir)
        if st.get("job_id") != self.successor:
            return  # not started yet
        phase = st.get("phase")
        if phase in SERVING_PHASES:
            return self._hand_over()
        if phase in TERMINAL_PHASES:
            again = "trying again" if self.tries < TRIES else \
                f"no more tries ({TRIES}): this job serves until its time limit"
            ended = f"successor job {self.successor} ended {phase} ({st.get('reason')}) " \
                    "before it served"
            self.job.log(f"renewal: {ended}; {again}")
            self.successor, self.next_try = None, at + RETRY_S
            if self.tries >= TRIES:
                self._lapse(ended)

    def _lapse(self, last: str) -> None:
        """Every try spent: state.json's renew says so, and `hpcserve status` with it, for the
        instances end at this job's time limit with no successor to take them over."""
        job = self.job
        job.state.record(job.log, renew={
            **(job.state.data.get("renew") or {"twin_dir": self.spec.twin_dir}),
            "lapsed": f"{TRIES} successor(s) tried, the last: {last}; the instances end at "
                      "this job's time limit"})

    def _hand_over(self) -> None:
        """The twin serves: every instance of this job drains (drain.py), each out of the
        router first; the job then ends "done" with the successor named."""
        job = self.job
        self.renewed = True
        self.end_reason = f"renewed by job {self.successor}"
        job.log(f"successor job {self.successor} serves: draining this job's instances")
        job.state.record(job.log, renew={**(job.state.data.get("renew") or {}),
                                         "renewed_at": round(now(), 3)})
        end = self.end_at(now())
        budget = DRAIN_S if end is None else max(
            1.0, min(DRAIN_S, end - float(job.plan.signal_grace) - now() - 5))
        for name, rec in job.table.recs.items():
            if rec.status == SERVING:
                write_request(job.dir, name, budget, job.job_id)

    def _handed_over(self) -> None:
        """Ends the job once none of its instances serves or drains (one that was out or
        restarting when the twin took over is not waited for)."""
        if not self.job.table.any_status(SERVING, DRAINING):  # a drain under way is draining
            raise Stop("done", self.end_reason)
