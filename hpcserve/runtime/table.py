"""The instance table: each engine instance's status, attempts and nodes while the deployment
serves, and the deployment's phase that follows from them.

It is the one place the concerns read an instance's status and the one place it changes:
recovery (a failure, a restart), drains (leaving on request), liveness (what it probes),
reconcile, renewal, autoscale, file_sd and attach all ask it. It calls none of them: each
change is written to state.json ("instances", the phase) at once, and `changed` tells the
serving loop (job.py) that what depends on the serving set (the Prometheus file) is due.

An instance's status: serving; out (failed, waiting for its restart); restarting; failed (its
restarts are spent, or it cannot come back in this job); draining (leaving on request, not
counted against its role's minimum); removed (drained).
"""

from __future__ import annotations

from concurrent.futures import Future

from . import caches
from .spec import Instance, RecoveryPolicy, Spec
from .state import now

SERVING, OUT, RESTARTING, FAILED = "serving", "out", "restarting", "failed"
DRAINING, REMOVED = "draining", "removed"
LEAVING = (DRAINING, REMOVED)       # leaving on request: not counted against a role's minimum


class Rec:
    """One instance's record: state.json's entry plus where its recovery stands."""

    def __init__(self, spec: Instance, nodes: list[str], at: float):
        self.name, self.role, self.index = spec.name, spec.role, spec.index
        self.status, self.why, self.stage = SERVING, None, None
        self.attempt, self.restarts = 0, 0
        self.nodes, self.since = nodes, at
        self.recover_s: float | None = None
        self.next_try_at: float | None = None
        self.failed_at: float | None = None
        self.deadline = 0.0
        self.next_poll = 0.0
        self.taken_out = False                # out of the router before its failure is judged
        self.lost: set[str] = set()
        self.task: Future | None = None       # the probe, smoke or registration under way
        self.old = None                       # the srun client of the attempt being stopped
        self.why_first: str | None = None     # what took it out, before any "cannot restart"
        self.attempts: list[dict] = []

    def as_state(self) -> dict:
        return {"role": self.role, "index": self.index, "status": self.status, "why": self.why,
                "attempt": self.attempt, "restarts": self.restarts, "nodes": self.nodes,
                "since": round(self.since, 3), "recover_s": self.recover_s,
                "next_try_at": self.next_try_at and round(self.next_try_at, 3),
                "attempts": self.attempts}


class Table:
    def __init__(self, plan: Spec, job_dir: str, instances, steps, state, log):
        self.plan, self.dir = plan, job_dir
        self.instances, self.steps, self.state, self.log = instances, steps, state, log
        self.recs: dict[str, Rec] = {}
        self.active = False     # the deployment serves: an instance's failure is recovered
        self.changed = False    # the serving set changed since the loop last looked
        self._phase = SERVING

    def begin(self) -> None:
        """The deployment serves: every instance's record, its first attempt serving now."""
        at = now()
        for spec in self.plan.instances:
            rec = Rec(spec, [r[1] for r in self.instances.nodes[spec.name]], at)
            rec.attempts.append(self.attempt_entry(rec, at))
            rec.attempts[-1]["serving_at"] = round(at, 3)
            if self.plan.caches is not None:
                rec.attempts[-1]["caches"] = caches.read(self.dir, rec.name)
            self.recs[spec.name] = rec
        self.active = True
        self.save()

    # -- what the others ask
    def get(self, name: str) -> Rec | None:
        return self.recs.get(name) if self.active else None

    def handles(self, name: str | None) -> bool:
        """Whether a failure of `name` is recovered (an instance, once the deployment serves),
        not the end of the deployment."""
        return self.active and name in self.recs

    def serving(self, name: str) -> bool:
        return self.recs[name].status == SERVING if name in self.recs else True

    def all_serving(self) -> bool:
        """Every instance serves: the router's readiness counts them all."""
        return all(r.status == SERVING for r in self.recs.values())

    def any_status(self, *statuses: str) -> bool:
        return any(r.status in statuses for r in self.recs.values())

    def all_in(self, *statuses: str) -> bool:
        """Some instance is recorded and every one's status is among `statuses`."""
        return bool(self.recs) and all(r.status in statuses for r in self.recs.values())

    def kept(self, role: str | None = None) -> list[Rec]:
        """The instances (of `role`) that are not leaving on request (draining or removed)."""
        return [r for r in self.recs.values()
                if r.status not in LEAVING and role in (None, r.role)]

    @staticmethod
    def needed(pol: RecoveryPolicy, kept: list[Rec]) -> int:
        """The role's minimum of serving instances, lowered by those leaving on request."""
        return min(pol.min_serving, len(kept))

    def phase(self) -> str:
        """serving, degraded (an instance is out) or recovering (a role below its minimum); an
        instance drained on request is neither."""
        below = False
        for role, pol in self.plan.recovery.items():
            mine = self.kept(role)
            below |= sum(r.status == SERVING for r in mine) < self.needed(pol, mine)
        kept_serving = all(r.status == SERVING for r in self.kept())
        return "recovering" if below else SERVING if kept_serving else "degraded"

    # -- the one place a status changes
    def set_status(self, rec: Rec, status: str, why: str | None) -> None:
        rec.status, rec.why, rec.since = status, why, now()
        self.save()

    def save(self) -> None:
        phase = self.phase()
        self.state.record(self.log, phase if phase != self._phase else None,
                          instances={n: r.as_state() for n, r in self.recs.items()},
                          excluded_nodes=sorted(self.instances.moved) + sorted(
                              {n for r in self.recs.values() for n in r.lost}))
        if phase != self._phase:
            self.log(f"deployment {phase}")
        self._phase = phase
        self.changed = True

    def take_changed(self) -> bool:
        changed, self.changed = self.changed, False
        return changed

    # -- attempts
    def attempt_entry(self, rec: Rec, at: float) -> dict:
        first = self.instances.nodes[rec.name][0]
        return {"attempt": rec.attempt, "nodes": list(rec.nodes), "started_at": round(at, 3),
                "serving_at": None, "ended_at": None, "end": None, "failure": None,
                "log": self.instances.log_file(rec.name, 0, first[1]),
                "srun_log": self.steps.srun_log_rel(rec.name)}

    @staticmethod
    def end_attempt(rec: Rec, reason: str, failure: dict | None, at: float) -> None:
        last = rec.attempts[-1]
        if last["ended_at"] is None:
            last.update(ended_at=round(at, 3), end=reason, failure=failure)
