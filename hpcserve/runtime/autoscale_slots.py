"""An autoscale slot as the front's orchestrator sees it (runtime/autoscale.py): Slot, its job
directory and the job it runs now; the jobs of a renewing slot's pair (runtime/renew.py) read
from their directories; whether a front's autoscaled role has slots alone.

Apart from the Autoscaler because they read the slots' job directories, not the loop's state,
and slots_alone() is read by the job and its liveness rounds without the autoscaler.
"""

from __future__ import annotations

import os

from .contract import TERMINAL_PHASES
from .spec import Instance, Spec
from .state import read_json, read_state


class Slot:
    """One slot: its job directory (with renew: its pair's first), and the job it runs now:
    the one this orchestrator submitted, or after a renewal the successor that job submitted
    into the twin directory (runtime/renew.py), which takes the slot over as it serves."""

    def __init__(self, job_dir: str):
        self.dir = job_dir
        self.name = os.path.basename(job_dir.rstrip("/"))
        self.job_id: str | None = None
        self.job_dir = job_dir  # where job_id runs: the slot's directory or its twin
        self.prev: tuple | None = None  # (job id, dir) the last renewal took over from
        self.drained: str | None = None  # the job a remove's drain request went to
        self.status = "free"   # free, submitting, pending, starting, serving, draining
        self.task = None       # the sbatch under way
        self.submitted_at = 0.0  # when this orchestrator last submitted it (newest drains first)
        self.asked_at = 0.0    # when Slurm was last asked whether its running job still is
        self.plan: Spec | None = None

    def twin(self) -> str | None:
        """The other directory of the slot's pair (renew:), None without renewal."""
        self.instance()
        return self.plan.renew.twin_dir if self.plan.renew is not None else None

    def other(self, job_dir: str) -> str | None:
        twin = self.twin()
        return twin and (self.dir if job_dir == twin else twin)

    def instance(self) -> Instance | None:
        if self.plan is None:
            self.plan = Spec(read_json(os.path.join(self.dir, "plan.json")))
        return first_instance(self.plan)

    def instance_name(self) -> str | None:
        """The name of the slot's instance (None where its plan.json names none)."""
        inst = self.instance()
        return inst.name if inst is not None else None

    def as_state(self) -> dict:
        return {"dir": self.job_dir, "job_id": self.job_id, "status": self.status}


def first_instance(plan: Spec) -> Instance | None:
    """A slot's plan.json's one instance; None where it names none (read_json reads a missing
    or half-written file as {}: a Spec without instances)."""
    insts = getattr(plan, "instances", None)
    return insts[0] if insts else None


def job_instance(job_dir: str) -> Instance | None:
    """The instance of a slot's directory (its plan.json's one; both of a pair name it alike)."""
    return first_instance(Spec(read_json(os.path.join(job_dir, "plan.json"))))


def pair_jobs(s: Slot) -> list[tuple]:
    """(job id, dir) of every job the slot may run now: its job, the one it took over from
    (draining), the successor its job submitted (not serving yet)."""
    out = [(s.job_id, s.job_dir)] if s.job_id else []
    if s.prev:
        out.append(s.prev)
    st = read_state(s.job_dir)
    # only the slot's own job's record: while it is queued the file is its directory's last job's
    sent = (st.get("renew") or {}) if st.get("job_id") == s.job_id else {}
    if s.job_id and sent.get("successor_job_id") not in (None, s.job_id) and sent.get(
            "twin_dir"):
        out.append((str(sent["successor_job_id"]), sent["twin_dir"]))
    return list(dict.fromkeys(out))


def ended(jid: str, job_dir: str) -> bool:
    """Whether the job's own state.json in `job_dir` says it ended."""
    st = read_state(job_dir)
    return st.get("job_id") == jid and st.get("phase") in TERMINAL_PHASES


def slots_alone(plan: Spec) -> bool:
    """Whether some autoscaled role has no instance of the front's own
    (roles.<role>.instances: 0): its slots are all it has."""
    if plan.autoscale is None:
        return False
    return any(not any(i.role == n for i in plan.instances) for n in plan.autoscale)
