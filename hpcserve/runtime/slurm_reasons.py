"""Slurm's job reasons in words for people: `reason_in_words` ('Priority',
'QOSMaxNodePerUserLimit', 'ReqNodeNotAvail, UnavailableNodes: node4' ...) and REASON_WORDS.

Apart from the parsers: it reads no output, only the reason a parser found, for `hpcserve
status`. Standard library only and nothing of hpcserve: it ships in the job directory with the
runtime.
"""

from __future__ import annotations

import re


__all__ = ["reason_in_words", "REASON_WORDS"]

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
