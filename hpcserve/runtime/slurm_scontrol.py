"""Pure parsers for `scontrol show job` and `scontrol -o show node`: records of Key=value
fields, one-line (-o) or multi-line.

- `parse_scontrol_job`: `scontrol show job [-o] [ID]`, one or many records.
- `parse_scontrol_fields(text, first="NodeName")`: `scontrol -o show node`.

Apart from squeue/sacct's columns (slurm_queue.py): reading Key=value with free-text values needs
the keys scontrol prints, and the nodes' records are read here too. Standard library only and
nothing of hpcserve: it ships in the job directory with the runtime.
"""

from __future__ import annotations

import re

from .slurm_jobs import JobRecord
from .slurm_values import _clean, _int, _reason, parse_duration, parse_timestamp


__all__ = ["scontrol_argv", "parse_scontrol_job", "parse_scontrol_fields"]


def scontrol_argv(job_id: str | None = None) -> list[str]:
    return ["scontrol", "show", "job", "-o"] + ([job_id] if job_id else [])


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
