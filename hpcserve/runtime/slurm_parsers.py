"""Pure parsers for what Slurm's commands print: squeue -o, scontrol show job/node/config, sacct,
steps, sinfo.

Nothing here runs a command: the operator commands run them through the Runner seam
(hpcserve.slurm.runner), the in-job runtime through runtime/slurm.py, and both hand the text over.
Standard library only and nothing of hpcserve: it ships in the job directory with the runtime, so
the job and `hpcserve status` read Slurm's words with the same code.

What each parser accepts (samples in tests/data/slurm/, see its README):
- `parse_squeue_format`: `squeue -h -t all -o SQUEUE_FORMAT` (or another `-o` format: pass it).
- `parse_scontrol_job`: `scontrol show job [-o] [ID]`, one or many records, one-line or multi-line.
- `parse_sacct`: `sacct -X -P -n --format=SACCT_FORMAT`; `sacct_disabled` spots a cluster without
  accounting (sacct exits 1 there), where status has to come from squeue and scontrol alone.
- `parse_steps`: `squeue -h --steps -o STEPS_FORMAT`.
- `parse_config`: `scontrol show config`; `parse_scontrol_fields(text, first="NodeName")`:
  `scontrol -o show node`; `parse_node_states`: `sinfo -h -N -o NODE_STATES_FORMAT`.
- `fold_het`: het job components (`123+0`, `123+1`) folded into one entry per job.
- `reason_in_words`: a pending reason in words for people.
- `controller_unreachable`: Slurm's words for a busy or restarting slurmctld, in what a command
  printed; `retry_delay` and RETRY_DELAYS_S: how long to wait before asking again, and when to
  give up (the operator commands' runner and the in-job runtime both follow it).

Slurm prints times in the cluster's local time without a zone; the text parsers read them in this
process's time zone (right for a local runner; over SSH set TZ to the cluster's).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence


__all__ = [
    "SQUEUE_FORMAT", "STEPS_FORMAT", "SACCT_FIELDS", "SACCT_FORMAT",
    "ACTIVE_STATES", "TERMINAL_STATES",
    "JobRecord", "FoldedJob", "StepRecord",
    "squeue_argv", "steps_argv", "NODE_STATES_FORMAT", "parse_node_states", "node_lost",
    "sacct_argv", "scontrol_argv", "config_argv", "parse_config",
    "parse_squeue_format", "parse_scontrol_job", "parse_scontrol_fields",
    "parse_sacct", "sacct_disabled", "parse_steps", "fold_het",
    "reason_in_words", "REASON_WORDS", "parse_duration", "parse_timestamp",
    "CONTROLLER_UNREACHABLE", "NOT_DELIVERED", "RETRY_DELAYS_S", "RETRY_WINDOW_S",
    "controller_unreachable", "request_not_delivered", "retry_delay",
]

# --------------------------------------------------------------------------------------------
# Formats. The job name is the LAST field everywhere: it is the one free-text field (a name may
# contain '|', spaces, anything), so a parser can split the others off the left and keep the rest.
# %r prints the reason text (for a pending job; 'None' otherwise), %N the node list, %A the
# component's own numeric job id (het components: %i is '123+1', %A is e.g. 124).
SQUEUE_FORMAT = "%i|%A|%T|%r|%N|%D|%P|%u|%M|%l|%L|%V|%S|%e|%j"
# Steps: %i step id ('5.0', '5.batch'), %A number of tasks, %N nodes, %M time used, %j step name.
STEPS_FORMAT = "%i|%A|%N|%M|%j"
SACCT_FIELDS = ("JobID", "State", "ExitCode", "Elapsed", "NodeList", "Reason", "JobName")
SACCT_FORMAT = ",".join(SACCT_FIELDS)


def squeue_argv(job_ids: Sequence[str] | None = None) -> list[str]:
    """`squeue` for every job (finished ones too, while slurmctld remembers them: MinJobAge)."""
    # --me: only this user's jobs, not the whole cluster's queue
    argv = ["squeue", "--me", "-h", "-t", "all", "-o", SQUEUE_FORMAT]
    if job_ids:
        argv += ["-j", ",".join(job_ids)]
    return argv


def steps_argv(job_ids: Sequence[str] | None = None) -> list[str]:
    """`squeue --steps`. Pass every component's own id (%A) of a het job, not just the leader's:
    on 22.05 `-j 123` lists only component 0's steps (component 1's show under its own id)."""
    argv = ["squeue", "-h", "--steps", "-o", STEPS_FORMAT]
    if job_ids:
        argv += ["-j", ",".join(job_ids)]
    return argv


def sacct_argv(job_ids: Sequence[str]) -> list[str]:
    return ["sacct", "-j", ",".join(job_ids), "-X", "-P", "-n", f"--format={SACCT_FORMAT}"]


def scontrol_argv(job_id: str | None = None) -> list[str]:
    return ["scontrol", "show", "job", "-o"] + ([job_id] if job_id else [])


def config_argv() -> list[str]:
    return ["scontrol", "show", "config"]


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` -> {Key: value} ('ClusterName = dev' lines; values as printed)."""
    out = {}
    for line in (text or "").splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


# sinfo -h -N -o NODE_STATES_FORMAT: one line per node, its compact state ('idle', 'mix*').
NODE_STATES_FORMAT = "%N %t"


def parse_node_states(text: str) -> dict[str, str]:
    """`sinfo -h -N -o NODE_STATES_FORMAT` -> {node: compact state}."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def node_lost(state: str) -> bool:
    """A compact sinfo state of a node that is gone for its jobs: down, failed or not responding
    (any state with '*')."""
    return state.endswith("*") or state.rstrip("*") in ("down", "fail", "failg")


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


@dataclass(frozen=True)
class StepRecord:
    step_id: str                     # '5.0', '5.batch', '5.extern'
    job_id: str                      # the part before the dot: a component's OWN id for het jobs
    step: str                        # '0', 'batch', 'extern', 'interactive'
    name: str = ""
    nodes: str = ""
    tasks: int | None = None
    time_used: int | None = None


# --------------------------------------------------------------------------------------------
# Values

_NULLISH = {"", "(null)", "N/A", "NONE", "None", "Unknown", "UNKNOWN", "n/a", "none"}
_UNLIMITED = {"UNLIMITED", "INFINITE", "Infinity", "NOT_SET", "INVALID"}
_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+(?:\.\d+)?))?$")
_TIMESTAMP_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M")


def parse_duration(text: str | None) -> int | None:
    """Slurm's durations in seconds: 'M:SS', 'H:MM:SS', 'D-HH:MM:SS', 'D-HH', 'D-HH:MM', 'MM'.

    None for 'UNLIMITED', 'INFINITE', 'NOT_SET', 'N/A' and anything unreadable.
    """
    if text is None:
        return None
    s = text.strip()
    if not s or s in _NULLISH or s in _UNLIMITED:
        return None
    m = _DURATION.match(s)
    if not m:
        return None
    days, a, b, c = m.groups()
    a_i = int(a)
    if days is not None:  # D-H, D-H:M, D-H:M:S
        h, mi, se = a_i, int(b or 0), float(c or 0)
        return int(int(days) * 86400 + h * 3600 + mi * 60 + se)
    if c is not None:  # H:M:S
        return int(a_i * 3600 + int(b) * 60 + float(c))
    if b is not None:  # M:S
        return a_i * 60 + int(b)
    return a_i * 60  # a bare number is minutes (sbatch --time convention)


def parse_timestamp(text: str | None) -> int | None:
    """'2026-11-22T04:07:35' (cluster local time) -> epoch seconds; None for N/A, Unknown, NONE..."""
    if text is None:
        return None
    s = text.strip()
    if not s or s in _NULLISH:
        return None
    for fmt in _TIMESTAMP_FORMATS:
        try:
            return int(time.mktime(time.strptime(s, fmt)))
        except (ValueError, OverflowError):
            continue
    return None


def _int(text: Any) -> int | None:
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    if isinstance(text, float):
        return int(text)
    if isinstance(text, str):
        m = re.match(r"^\s*(\d+)", text)  # '4', '4-4' (scontrol NumNodes range)
        return int(m.group(1)) if m else None
    return None


def _clean(text: Any) -> str:
    """A string field: '(null)' and None become ''."""
    if text is None or isinstance(text, (dict, list, bool)):
        return ""
    s = str(text).strip()
    return "" if s == "(null)" else s


def _reason(text: Any) -> str:
    s = _clean(text)
    return "" if s in ("None", "none") else s


# --------------------------------------------------------------------------------------------
# squeue -o

_FORMAT_CODE = re.compile(r"^%\.?\d*([A-Za-z])$")
_JOB_ID = re.compile(r"^(\d+)(?:\+(\d+))?(?:_(\S+))?$")


def _format_codes(fmt: str) -> list[str]:
    codes = []
    for piece in fmt.split("|"):
        m = _FORMAT_CODE.match(piece.strip())
        codes.append(m.group(1) if m else "")
    return codes


def _split_fields(line: str, n: int, free_last: bool) -> list[str] | None:
    parts = line.split("|", n - 1) if free_last else line.split("|")
    return parts if len(parts) == n else None


def _split_job_id(text: str) -> tuple[int | None, int | None]:
    """'123+1' -> (123, 1); anything else -> (None, None)."""
    m = _JOB_ID.match(text)
    if m and m.group(2) is not None:
        return int(m.group(1)), int(m.group(2))
    return None, None


def parse_squeue_format(text: str, fmt: str = SQUEUE_FORMAT) -> list[JobRecord]:
    """`squeue -h -o FMT` lines -> JobRecords. FMT is '|'-separated %-codes (widths allowed).

    Known codes: %i %A %j %T %t %r %R %N %D %P %u %M %l %L %V %S %e %E %Z; others are skipped.
    Lines with the wrong number of fields (truncated output, headers) are skipped. Only the last
    field may contain '|' (put %j last, as SQUEUE_FORMAT does).
    """
    codes = _format_codes(fmt)
    out: list[JobRecord] = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = _split_fields(line.rstrip("\r"), len(codes), free_last=codes[-1] in "jZ")
        if parts is None:
            continue
        v = dict(zip(codes, parts))
        shown = (v.get("i") or v.get("A") or "").strip()
        if not _JOB_ID.match(shown):
            continue  # a header line, or garbage
        het, off = _split_job_id(shown)
        uid = _int(v.get("A"))
        if uid is None and het is None and shown.isdigit():
            uid = int(shown)
        state = v.get("T", "").strip().upper() or _COMPACT_STATES.get(v.get("t", "").strip(), "")
        reason, nodes = _reason(v.get("r")), _clean(v.get("N"))
        if "R" in v:  # %R: '(Reason)' for pending/failed jobs, else the node list
            r = v["R"].strip()
            if r.startswith("(") and r.endswith(")"):
                reason = reason or _reason(r[1:-1])
            elif not nodes:
                nodes = r
        out.append(JobRecord(
            job_id=shown, unique_id=uid, het_job_id=het, het_offset=off, name=v.get("j", ""),
            state=state, reason=reason, nodes=nodes, node_count=_int(v.get("D")),
            partition=_clean(v.get("P")), user=_clean(v.get("u")),
            time_used=parse_duration(v.get("M")), time_limit=parse_duration(v.get("l")),
            time_left=parse_duration(v.get("L")), submit_time=parse_timestamp(v.get("V")),
            start_time=parse_timestamp(v.get("S")), end_time=parse_timestamp(v.get("e")),
            dependency=_clean(v.get("E")), work_dir=_clean(v.get("Z")), source="squeue",
        ))
    return out


# --------------------------------------------------------------------------------------------
# squeue --steps

def parse_steps(text: str, fmt: str = STEPS_FORMAT) -> list[StepRecord]:
    """`squeue -h --steps -o FMT` -> StepRecords (codes %i %j %N %A %M; others skipped).

    On 22.05 a het job's steps carry the COMPONENT's own job id: the step of `srun --het-group=1`
    in job 3+1 (own id 4) is '4.1', not '3+1.0'; step numbers count across the whole het job.
    """
    codes = _format_codes(fmt)
    out: list[StepRecord] = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = _split_fields(line.rstrip("\r"), len(codes), free_last=codes[-1] == "j")
        if parts is None:
            continue
        v = dict(zip(codes, parts))
        sid = v.get("i", "").strip()
        job, dot, step = sid.partition(".")
        if not dot or not step or not _JOB_ID.match(job):
            continue
        out.append(StepRecord(step_id=sid, job_id=job, step=step, name=v.get("j", ""),
                              nodes=_clean(v.get("N")), tasks=_int(v.get("A")),
                              time_used=parse_duration(v.get("M"))))
    return out


# --------------------------------------------------------------------------------------------
# scontrol show job

# Keys whose values are free text and may contain spaces (and even 'x=y'): such a value ends only
# where a key scontrol is known to print follows. Other values end at the next ' Key='.
_FREE_TEXT_KEYS = frozenset({
    "JobName", "Comment", "AdminComment", "SystemComment", "Command", "WorkDir", "StdOut", "StdErr",
    "StdIn", "Reason", "Extra", "Dependency", "Features", "Prefer", "Licenses", "MailUser",
    "BurstBuffer", "SELinuxContext", "Container", "ClusterFeatures", "BatchFeatures",
})
# Keys printed by src/scontrol/info_job.c (22.05 ... 24.11).
_SCONTROL_KEYS = frozenset("""
JobId ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset HetJobIdSet JobName UserId
GroupId MCS_label Priority Nice Account QOS WCKey JobState Reason Dependency Requeue Restarts
BatchFlag Reboot ExitCode DerivedExitCode RunTime TimeLimit TimeMin SubmitTime EligibleTime
AccrueTime StartTime EndTime Deadline PreemptEligibleTime PreemptTime SuspendTime SecsPreSuspend
LastSchedEval Scheduler Partition AllocNode:Sid ReqNodeList ExcNodeList NodeList SchedNodeList
BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T TRES ReqTRES AllocTRES Socks/Node
NtasksPerN:B:S:C CoreSpec ThreadSpec MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode
Features DelayBoot OverSubscribe Contiguous Licenses Network Command WorkDir StdErr StdIn StdOut
Power Comment AdminComment SystemComment Extra Reservation BurstBuffer BurstBufferState
CpusPerTres MemPerTres TresBind TresFreq TresPerJob TresPerNode TresPerSocket TresPerTask
MailUser MailType CronJob CrontabSpec Container ContainerID containerid FedOrigin FedViableSiblings
FedActiveSiblings ClusterFeatures BatchFeatures Prefer Switches Wait-for-Switch KillOInInvalidDependent
NtasksPerTRES OOMKillStep SpreadJob StepMgrEnabled SELinuxContext CompletingTime ResizeTime
ResvPorts last_update_time Nodes Nodes(COMPLETING) Nodes(DOWN) CPU_IDs Mem GRES JOB_GRES
GresEnforceBind GresAllowTaskSharing GresOneTaskPerSharing FailedNode TimeOutDelay Profile
""".split())
_KEY_AT = re.compile(r"(?:^|(?<=\s))([A-Za-z][\w/:.()-]*)=")


def _split_key_values(line: str) -> dict[str, str]:
    cands = [(m.start(1), m.end(), m.group(1)) for m in _KEY_AT.finditer(line)]
    out: dict[str, str] = {}
    cur_key: str | None = None
    cur_start = 0
    for start, vstart, key in cands:
        if cur_key is not None:
            if cur_key in _FREE_TEXT_KEYS and key not in _SCONTROL_KEYS:
                continue  # 'JobName=a b=c': part of the free-text value
            out.setdefault(cur_key, line[cur_start:start].strip())
        cur_key, cur_start = key, vstart
    if cur_key is not None:
        out.setdefault(cur_key, line[cur_start:].strip())
    return out


def parse_scontrol_fields(text: str, first: str = "JobId") -> list[dict[str, str]]:
    """`scontrol show job [-o]` (or `show node`, first="NodeName") -> one {Key: value} per
    record, in order.

    Records start at 'JobId=' ('NodeName='); the multi-line form (no -o) is joined first. Values
    stay as printed ('(null)', 'Unknown', 'root(0)').
    """
    records: list[list[str]] = []
    for line in (text or "").splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith(first + "="):
            records.append([s])
        elif records and "=" in s:
            records[-1].append(s)
    return [_split_key_values(" ".join(r)) for r in records]


def parse_scontrol_job(text: str) -> list[JobRecord]:
    """`scontrol show job [-o] [ID]` -> JobRecords (a het job shows one record per component).

    'slurm_load_jobs error: Invalid job id specified' (on stderr, rc 1) and 'No jobs in the
    system' both give [].
    """
    out: list[JobRecord] = []
    for f in parse_scontrol_fields(text):
        uid = _int(f.get("JobId"))
        if uid is None:
            continue
        het = _int(f.get("HetJobId")) or None
        off = _int(f.get("HetJobOffset")) if het is not None else None
        arr = _int(f.get("ArrayJobId"))
        task = f.get("ArrayTaskId", "")
        if het is not None:
            shown = f"{het}+{off if off is not None else 0}"
        elif arr is not None and task and task != "N/A":
            shown = f"{arr}_{task}"
        else:
            shown = str(uid)
        user = _clean(f.get("UserId"))
        user = user.split("(", 1)[0] if "(" in user else user
        # scontrol turns spaces in the reason's text into '_' ('ReqNodeNotAvail,_UnavailableNodes:n4')
        reason = _reason(f.get("Reason", "")).replace("_", " ")
        out.append(JobRecord(
            job_id=shown, unique_id=uid, het_job_id=het, het_offset=off,
            name=f.get("JobName", ""), state=_clean(f.get("JobState")).upper(), reason=reason,
            nodes=_clean(f.get("NodeList")), node_count=_int(f.get("NumNodes")),
            partition=_clean(f.get("Partition")), user=user,
            time_used=parse_duration(f.get("RunTime")), time_limit=parse_duration(f.get("TimeLimit")),
            submit_time=parse_timestamp(f.get("SubmitTime")),
            start_time=parse_timestamp(f.get("StartTime")),
            end_time=parse_timestamp(f.get("EndTime")), exit_code=_clean(f.get("ExitCode")),
            dependency=_clean(f.get("Dependency")), batch_host=_clean(f.get("BatchHost")),
            work_dir=_clean(f.get("WorkDir")), stdout=_clean(f.get("StdOut")),
            stderr=_clean(f.get("StdErr")), source="scontrol",
        ))
    return out


# --------------------------------------------------------------------------------------------
# sacct

_ACCOUNTING_DISABLED = "Slurm accounting storage is disabled"


def sacct_disabled(result: Any) -> bool:
    """True when sacct said 'Slurm accounting storage is disabled' (it exits 1 then).

    `result` is a runner Result (rc/out/err), a CompletedProcess (stdout/stderr) or the text.
    """
    if isinstance(result, str):
        text = result
    else:
        parts = [getattr(result, a, None) for a in ("err", "out", "stderr", "stdout")]
        text = "\n".join(p if isinstance(p, str) else p.decode(errors="replace")
                         if isinstance(p, bytes) else "" for p in parts)
    return _ACCOUNTING_DISABLED in text


def parse_sacct(text: str, fields: Sequence[str] = SACCT_FIELDS) -> list[JobRecord]:
    """`sacct -X -P -n --format=F1,F2,...` -> JobRecords; `fields` names the columns in order.

    Step rows ('123.batch', '123+0.0') are skipped: ask with -X for allocations. Only the last
    column may contain '|'. 'CANCELLED by 0' reads as CANCELLED.
    """
    names = [f.strip().lower() for f in fields]
    free_last = bool(names) and names[-1] in ("jobname", "comment", "workdir", "submitline")
    out: list[JobRecord] = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        parts = _split_fields(line.rstrip("\r"), len(names), free_last)
        if parts is None:
            continue
        v = dict(zip(names, parts))
        shown = (v.get("jobid") or v.get("jobidraw") or "").strip()
        if "." in shown or not _JOB_ID.match(shown):
            continue
        het, off = _split_job_id(shown)
        uid = _int(v.get("jobidraw"))
        if uid is None and het is None and shown.isdigit():
            uid = int(shown)
        state = v.get("state", "").strip().split(" ", 1)[0].upper().rstrip("+")
        state = _COMPACT_STATES.get(state, state)
        nodes = _clean(v.get("nodelist"))
        out.append(JobRecord(
            job_id=shown, unique_id=uid, het_job_id=het, het_offset=off,
            name=v.get("jobname", ""), state=state, reason=_reason(v.get("reason")),
            nodes="" if nodes == "None assigned" else nodes, node_count=_int(v.get("nnodes")),
            partition=_clean(v.get("partition")), user=_clean(v.get("user")),
            time_used=parse_duration(v.get("elapsed")), time_limit=parse_duration(v.get("timelimit")),
            submit_time=parse_timestamp(v.get("submit")), start_time=parse_timestamp(v.get("start")),
            end_time=parse_timestamp(v.get("end")), exit_code=_clean(v.get("exitcode")),
            work_dir=_clean(v.get("workdir")), source="sacct",
        ))
    return out


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


# --------------------------------------------------------------------------------------------
# Reasons in words

REASON_WORDS: dict[str, str] = {
    "Priority": "waiting behind higher-priority jobs",
    "Resources": "waiting for nodes to become free",
    "Dependency": "waiting for a job it depends on",
    "DependencyNeverSatisfied": "will never start: a job it depends on failed or was cancelled",
    "BeginTime": "waiting for its requested start time",
    "JobHeldUser": "held by its user (release it with `scontrol release`)",
    "JobHeldAdmin": "held by an administrator",
    "ReqNodeNotAvail": "a node it needs is unavailable (down, drained or reserved)",
    "NodeDown": "a node it needs is down",
    "PartitionNodeLimit": "asks for more nodes than the partition allows now "
                          "(or some of the partition's nodes are down or drained)",
    "PartitionTimeLimit": "asks for a longer time limit than the partition allows",
    "PartitionDown": "the partition is down",
    "PartitionInactive": "the partition is inactive",
    "PartitionConfig": "the request does not fit the partition's configuration",
    "Reservation": "waiting for its reservation to become active",
    "ReservationDeleted": "its reservation was deleted",
    "Licenses": "waiting for licenses",
    "BadConstraints": "its constraints cannot be satisfied",
    "Constraints": "its constraints cannot be satisfied now",
    "Prolog": "its prolog is still running",
    "Cleaning": "being requeued, still cleaning up its previous run",
    "WaitingForScheduling": "not looked at by the scheduler yet",
    "SchedDefer": "scheduling deferred (SchedulerParameters=defer)",
    "FrontEndDown": "no front-end node is available",
    "PowerUpNode": "waiting for powered-down nodes to boot",
    "MaxPoweredUpNodes": "waiting: too many nodes are powered up",
    "AssociationJobLimit": "its account has reached its job limit",
    "AssociationResourceLimit": "its account has reached a resource limit",
    "AssociationTimeLimit": "its account has reached its time limit",
    "AccountingPolicy": "held back by an accounting policy limit",
    "InvalidAccount": "its account is invalid",
    "InvalidQOS": "its QOS is invalid",
    "AccountNotAllowed": "its account may not use this partition",
    "QOSNotAllowed": "its QOS may not use this partition",
    "QOSJobLimit": "its QOS has reached its job limit",
    "QOSResourceLimit": "its QOS has reached a resource limit",
    "QOSTimeLimit": "its QOS has reached its time limit",
    "QOSUsageThreshold": "its QOS usage threshold is exceeded",
    "JobHoldMaxRequeue": "held: requeued too many times",
    "JobArrayTaskLimit": "waiting: the array's simultaneous task limit is reached",
    "BurstBufferResources": "waiting for burst buffer resources",
    "BurstBufferStageIn": "staging in burst buffer data",
    "DeadLine": "cannot finish before its deadline",
    "MpiPortsBusy": "waiting for free MPI ports",
    # terminal reasons
    "NonZeroExitCode": "exited with a non-zero exit code",
    "RaisedSignal": "killed by a signal",
    "TimeLimit": "reached its time limit",
    "InactiveLimit": "reached the system's inactivity limit",
    "JobLaunchFailure": "could not be launched (file system, program name, ...)",
    "SystemFailure": "failed because of a Slurm, file system or network failure",
    "OutOfMemory": "ran out of memory",
    "FedJobLock": "waiting for the federation's job lock",
}
_LIMIT = re.compile(r"^(QOS|Assoc(?:iation)?)(Grp|Max|Min)(\w+?)(Limit)?$")
_ACCOUNT_LIMIT = re.compile(r"^Max(\w+?)Per(Account|User)$")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_UNITS = {"Cpu": "CPU", "CPU": "CPU", "GRES": "GRES", "Mem": "memory", "Memory": "memory",
          "BB": "burst buffer", "Jobs": "jobs", "Job": "job"}


def _camel_words(s: str) -> str:
    return " ".join(_UNITS.get(w, w.lower()) for w in _CAMEL.split(s) if w)


def reason_in_words(reason: str | None) -> str:
    """A Slurm job reason ('Priority', 'QOSMaxNodePerUserLimit', 'ReqNodeNotAvail, UnavailableNodes:
    node4', a free-text description) in words for people. '' for no reason ('None', '', None).

    Unknown codes fall back to "Slurm reason 'X'" rather than guessing.
    """
    r = (reason or "").strip()
    if r.startswith("(") and r.endswith(")"):  # squeue %R wraps reasons in parentheses
        r = r[1:-1].strip()
    if r in ("", "None", "none", "null"):
        return ""
    code, sep, detail = r.partition(",")
    code, detail = code.strip(), detail.strip()
    if code in REASON_WORDS:
        words = REASON_WORDS[code]
        if detail:
            if detail.startswith("UnavailableNodes:"):
                nodes = detail.split(":", 1)[1].strip()
                if nodes:
                    words += f"; unavailable: {nodes}"
            else:
                words += f" ({detail})"
        return words
    m = _LIMIT.match(code)
    if m:
        who = "its QOS" if m.group(1) == "QOS" else "its account (association)"
        kind = {"Grp": "group", "Max": "max", "Min": "min"}[m.group(2)]
        return f"held back by {who}: limit on {kind} {_camel_words(m.group(3))} reached"
    m = _ACCOUNT_LIMIT.match(code)
    if m:
        return (f"held back by a per-{m.group(2).lower()} limit: "
                f"max {_camel_words(m.group(1))} reached")
    if " " in r:
        return r  # already Slurm's own words (a state description)
    return f"Slurm reason '{r}'"


# --------------------------------------------------------------------------------------------
# A busy or restarting controller
#
# Slurm's own words for a request slurmctld did not answer, from the error table of
# src/common/slurm_errno.c (the same texts from slurm-22-05-8-1, which Debian 12 ships, to
# master). Each command prints one behind a prefix of its own: `slurm_load_jobs error: ...`
# (squeue, scontrol show job, scancel --signal), `slurm_load_ctl_conf error: ...` (scontrol show
# config), `slurm_load_partitions: ...` (sinfo), `scancel: error: Kill job error on job id N: ...`,
# `sbatch: error: Batch job submission failed: ...`, `allocation failure: ...` (sbatch
# --test-only). Each client already retries a refused connection for MessageTimeout seconds
# (slurm_open_controller_conn in src/common/slurm_protocol_api.c) before it prints one.
CONTROLLER_UNREACHABLE = (
    # SLURMCTLD_COMMUNICATIONS_{CONNECTION,SEND,RECEIVE,SHUTDOWN}_ERROR: "Unable to contact slurm
    # controller (connect failure)" etc.; what every command prints while slurmctld is stopped.
    "Unable to contact slurm controller",
    # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT: connected, but no answer within MessageTimeout (a
    # controller busy, or stopped with SIGSTOP).
    "Socket timed out on send/recv operation",
    # SLURM_PROTOCOL_SOCKET_ZERO_BYTES_SENT: the connection closed mid-request (going down).
    "Zero Bytes were transmitted or received",
    # ESLURM_IN_STANDBY_MODE / ESLURM_IN_STANDBY_USE_BACKUP: a backup controller that has not
    # taken over (yet), or a primary that went back to standby.
    "Slurm backup controller in standby mode",
    "Controller is in standby mode, try a different controller",
)
# Of those, the words that say the request never reached a controller that acts on it: the
# connection was refused, or a controller in standby turned it away. After any other one a
# request may have been carried out all the same: an `sbatch` that printed "Socket timed out on
# send/recv operation" against a stopped (SIGSTOP) slurmctld on the test cluster had its job
# queued once slurmctld went on.
NOT_DELIVERED = (
    "Unable to contact slurm controller (connect failure)",
    "Slurm backup controller in standby mode",
    "Controller is in standby mode, try a different controller",
)
# Waits before the 2nd, 3rd, ... try of a query the controller did not answer: 5 tries, 26 s of
# waiting in all; no try starts later than RETRY_WINDOW_S after the first one started (each
# failed try itself takes up to MessageTimeout, 10 s by default).
RETRY_DELAYS_S = (2.0, 4.0, 8.0, 12.0)
RETRY_WINDOW_S = 30.0


# What Slurm's commands print where they have no cluster to ask: no slurm.conf (SLURM_CONF,
# /etc/slurm) and no configless DNS SRV record (Slurm 22.05's src/common/fetch_config.c). Asking
# again cannot help: this is a machine outside the cluster, not a controller that is busy.
NOT_CONFIGURED = (
    "Could not establish a configuration source",
    "_establish_config_source: failed to fetch config",
)


def not_configured(text: str | None) -> bool:
    """True when a Slurm command says it has no configuration: no cluster is known here."""
    return bool(text) and any(words in text for words in NOT_CONFIGURED)


def controller_unreachable(text: str | None) -> bool:
    """True when a Slurm command's output says slurmctld did not answer (busy, restarting,
    stopped, or a backup in standby); False for every answer the controller gave, refusals
    included ('Invalid job id specified', 'Job/step already completing or completed')."""
    return bool(text) and any(words in text for words in CONTROLLER_UNREACHABLE)


def request_not_delivered(text: str | None) -> bool:
    """True when the output says the request never reached a controller that acts on it, so
    sending it again cannot do anything twice (see NOT_DELIVERED)."""
    return bool(text) and any(words in text for words in NOT_DELIVERED)


def retry_delay(tries: int, elapsed: float, delays: Sequence[float] = RETRY_DELAYS_S,
                window: float = RETRY_WINDOW_S) -> float | None:
    """Seconds to wait before asking again after `tries` tries that the controller did not
    answer, the first of which started `elapsed` seconds ago; None: give up."""
    if tries < 1 or tries > len(delays) or elapsed + delays[tries - 1] > window:
        return None
    return delays[tries - 1]
