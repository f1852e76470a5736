"""Slurm's job states, and jobs as hpcserve reads them: the vocabulary of job states (declared
once here: TERMINAL_STATES, ACTIVE_STATES, the compact codes, the folding order), JobRecord (one
job or het component as a command showed it), FoldedJob and `fold_het` (het job components
`123+0`, `123+1` folded into one entry per job).

Apart from the parsers (slurm_queue.py, slurm_scontrol.py) because every one of them produces
these records and the operator commands (ops.py) and the runtime (slurm.py) read the states
without parsing anything. Standard library only and nothing of hpcserve: it ships in the job
directory with the runtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence


__all__ = ["ACTIVE_STATES", "TERMINAL_STATES", "JobRecord", "FoldedJob", "fold_het"]

# --------------------------------------------------------------------------------------------
# States
TERMINAL_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "REVOKED",
})
ACTIVE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "RESIZING", "REQUEUED",
    "REQUEUE_FED", "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "RESV_DEL_HOLD", "SIGNALING",
    "STAGE_OUT", "POWER_UP_NODE", "LAUNCH_FAILED", "RECONFIG_FAIL", "UPDATE_DB",
})
# squeue %t / sacct compact codes.
_COMPACT_STATES = {
    "BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "CF": "CONFIGURING",
    "CG": "COMPLETING", "DL": "DEADLINE", "F": "FAILED", "NF": "NODE_FAIL", "OOM": "OUT_OF_MEMORY",
    "PD": "PENDING", "PR": "PREEMPTED", "R": "RUNNING", "RD": "RESV_DEL_HOLD", "RF": "REQUEUE_FED",
    "RH": "REQUEUE_HOLD", "RQ": "REQUEUED", "RS": "RESIZING", "RV": "REVOKED", "SI": "SIGNALING",
    "SE": "SPECIAL_EXIT", "SO": "STAGE_OUT", "ST": "STOPPED", "S": "SUSPENDED", "TO": "TIMEOUT",
}
# Folding het components: the worst terminal state first.
_TERMINAL_SEVERITY = ("NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "FAILED", "TIMEOUT", "DEADLINE",
                      "PREEMPTED", "REVOKED", "CANCELLED", "COMPLETED")
# ...and among components that are all still active, the one furthest from plain RUNNING.
_ACTIVE_PRECEDENCE = ("STOPPED", "SUSPENDED", "SPECIAL_EXIT", "REQUEUE_HOLD", "REQUEUE_FED",
                      "REQUEUED", "RESV_DEL_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT",
                      "COMPLETING", "CONFIGURING", "POWER_UP_NODE", "RUNNING")


@dataclass(frozen=True)
class JobRecord:
    """One job, or one component of a het job, as one of Slurm's commands showed it.

    Fields a source does not show stay at their defaults ('' or None). Times are seconds; epochs are
    seconds since 1970. `reason` is '' when Slurm says 'None'.
    """

    job_id: str                      # as squeue %i prints it: '123', '123+1' (het), '123_4' (array)
    unique_id: int | None = None     # the record's own numeric id (squeue %A, JobId=)
    het_job_id: int | None = None    # the het leader's id, for het components only
    het_offset: int | None = None    # 0, 1, ... for het components only
    name: str = ""
    state: str = ""                  # long form as squeue %T: RUNNING, PENDING, COMPLETING, ...
    reason: str = ""                 # code or Slurm's text: 'Priority', 'ReqNodeNotAvail, Unavail...'
    nodes: str = ""                  # hostlist expression: 'node[2-3]'
    node_count: int | None = None
    partition: str = ""
    user: str = ""
    time_used: int | None = None     # seconds run so far (or in all, once finished)
    time_limit: int | None = None    # seconds; None = unlimited or not set
    time_left: int | None = None
    submit_time: int | None = None
    start_time: int | None = None    # actual, or expected for a pending job when Slurm knows it
    end_time: int | None = None      # actual, or expected (start + limit) for a running job
    exit_code: str = ""              # 'code:signal' as sacct/scontrol print it: '0:0', '3:0', '0:15'
    dependency: str = ""
    batch_host: str = ""
    work_dir: str = ""
    stdout: str = ""
    stderr: str = ""
    source: str = ""                 # 'squeue', 'scontrol', 'sacct'

    @property
    def is_het(self) -> bool:
        return self.het_job_id is not None

    @property
    def leader_id(self) -> str:
        """The id to fold on, cancel and show: the het leader's id for a component."""
        if self.het_job_id is not None:
            return str(self.het_job_id)
        return self.job_id

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def pending_reason(self) -> str:
        """The reason only while the job waits: a job cancelled while pending keeps its old reason."""
        return self.reason if self.pending else ""


@dataclass(frozen=True)
class FoldedJob:
    """A job as a deployment sees it: a plain job, or all components of a het job together.

    `state` is the overall state: a state all components share; else PENDING if any component
    pends; else, when all are still active, the one furthest from RUNNING (CONFIGURING, COMPLETING,
    ...); else the worst terminal state (NODE_FAIL > BOOT_FAIL > OUT_OF_MEMORY > FAILED > TIMEOUT >
    DEADLINE > PREEMPTED > REVOKED > CANCELLED > COMPLETED) even while other components still run;
    `active` then says something still holds nodes (cancel the leader id to free them).
    """

    job_id: str                      # the leader's id: what to cancel and show
    name: str
    state: str
    reason: str                      # the reason of the component that decided `state`
    components: tuple[JobRecord, ...] = field(default=())

    @property
    def is_het(self) -> bool:
        return any(c.is_het for c in self.components)

    @property
    def states(self) -> tuple[str, ...]:
        return tuple(c.state for c in self.components)

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(c.nodes for c in self.components)

    @property
    def unique_ids(self) -> tuple[int, ...]:
        """Each component's own job id (what `squeue --steps -j` needs)."""
        return tuple(c.unique_id for c in self.components if c.unique_id is not None)

    @property
    def node_count(self) -> int | None:
        counts = [c.node_count for c in self.components]
        return None if any(n is None for n in counts) else sum(counts)  # type: ignore[misc]

    @property
    def mixed(self) -> bool:
        """Components disagree (e.g. one cancelled with `scancel 123+1`, the other running)."""
        return len(set(self.states)) > 1

    @property
    def active(self) -> bool:
        """Some component still pends or holds nodes."""
        return any(s not in TERMINAL_STATES for s in self.states)

    @property
    def finished(self) -> bool:
        return bool(self.components) and not self.active

    @property
    def pending_reason(self) -> str:
        return self.reason if self.state == "PENDING" else ""


# --------------------------------------------------------------------------------------------
# Folding het jobs

def _overall_state(states: Sequence[str]) -> str:
    uniq = set(states)
    if len(uniq) == 1:
        return states[0]
    if "PENDING" in uniq:
        return "PENDING"
    terminal = [s for s in _TERMINAL_SEVERITY if s in uniq]
    if terminal:
        return terminal[0]
    unknown = [s for s in states if s not in _ACTIVE_PRECEDENCE]
    if unknown:
        return unknown[0]
    return next(s for s in _ACTIVE_PRECEDENCE if s in uniq)


def _sort_key(job_id: str) -> tuple[int, int | str]:
    m = re.match(r"^(\d+)", job_id)
    return (0, int(m.group(1))) if m else (1, job_id)


def fold_het(records: Iterable[JobRecord]) -> list[FoldedJob]:
    """Group records by leader id (het components together), ordered by job id.

    Components are ordered by het offset; a component seen twice keeps its first record (so
    `fold_het(squeue_records + sacct_records)` prefers squeue's).
    """
    groups: dict[str, dict[Any, JobRecord]] = {}
    for r in records:
        comp_key = r.het_offset if r.is_het else r.job_id
        groups.setdefault(r.leader_id, {}).setdefault(comp_key, r)
    out: list[FoldedJob] = []
    for leader in sorted(groups, key=_sort_key):
        comps = tuple(sorted(groups[leader].values(),
                             key=lambda c: (c.het_offset if c.het_offset is not None else -1)))
        state = _overall_state([c.state for c in comps])
        decider = next((c for c in comps if c.state == state and c.reason), None) \
            or next((c for c in comps if c.state == state), comps[0])
        name = next((c.name for c in comps if c.name), "")
        out.append(FoldedJob(job_id=leader, name=name, state=state, reason=decider.reason,
                             components=comps))
    return out
