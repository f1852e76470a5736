"""Pure parsers for what squeue and sacct print: the queue's jobs, their steps, and accounting.

What each parser accepts (samples in tests/data/slurm/, see its README):
- `parse_squeue_format`: `squeue -h -t all -o SQUEUE_FORMAT` (or another `-o` format: pass it).
- `parse_sacct`: `sacct -X -P -n --format=SACCT_FORMAT`; `sacct_disabled` spots a cluster without
  accounting (sacct exits 1 there), where status has to come from squeue and scontrol alone.
- `parse_steps`: `squeue -h --steps -o STEPS_FORMAT`.

Apart from scontrol's key=value records (slurm_scontrol.py): these read '|'-separated columns.
Nothing here runs a command: the operator commands run them through the Runner seam
(hpcserve.slurm.runner), the in-job runtime through runtime/slurm.py, and both hand the text over.
Standard library only and nothing of hpcserve: it ships in the job directory with the runtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from .slurm_jobs import _COMPACT_STATES, JobRecord
from .slurm_values import _clean, _int, _reason, parse_duration, parse_timestamp


__all__ = [
    "SQUEUE_FORMAT", "STEPS_FORMAT", "SACCT_FIELDS", "SACCT_FORMAT", "StepRecord",
    "squeue_argv", "steps_argv", "sacct_argv",
    "parse_squeue_format", "parse_sacct", "sacct_disabled", "parse_steps",
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
