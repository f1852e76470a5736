"""The jobs a renewing instance job runs as now (`renew:`, runtime/renew.py), for the operator
commands that treat a deployment as one (status, list, cancel, scale --remove).

A successor is submitted from inside the job, so the index holds only the first job of a pair
(<role>-<seq>/); the others are found in the pair's own files: each directory's state.json
names the job that last ran it (job_id), and a job's renew record names the successor it
submitted into its twin, which may not have started yet. A directory's current job is the
newest of those ids (Slurm gives ids out in increasing order).
"""

from __future__ import annotations

import posixpath
from typing import Iterable

from . import deployments
from .records import replace
from .slurm.runner import read_json


def current(entries: Iterable[deployments.Entry], runner) -> list[deployments.Entry]:
    """`entries`, each renewing instance job's replaced by the current job of each directory
    of its pair (the same name and front; a directory that never ran a job is left out)."""
    out: list[deployments.Entry] = []
    for e in entries:
        plan = read_json(runner, posixpath.join(e.job_dir, "plan.json")) if e.front else None
        renew = plan.get("renew") if isinstance(plan, dict) else None
        if not renew:
            out.append(e)
            continue
        ids = newest_jobs([e.job_dir, renew["twin_dir"]], runner, {e.job_dir: e.job_id})
        out += [replace(e, job_id=jid, job_dir=d) for d, jid in ids.items()]
    return out


def instance_jobs(front: deployments.Entry, runner) -> list[deployments.Entry]:
    """The front's instance jobs (`hpcserve scale`'s, as the index holds them), each renewing
    pair's as the jobs it runs now, oldest first."""
    return current(deployments.instance_jobs(front), runner)


def newest_jobs(dirs: list[str], runner, known: dict[str, str]) -> dict[str, str]:
    """job directory -> the newest job id that ran it or was submitted into it."""
    ids: dict[str, list[str]] = {d: [known[d]] if d in known else [] for d in dirs}
    for d in dirs:
        st = read_json(runner, posixpath.join(d, "state.json")) or {}
        if st.get("job_id"):
            ids[d].append(str(st["job_id"]))
        sent = st.get("renew") or {}
        if sent.get("successor_job_id") and sent.get("twin_dir") in ids:
            ids[sent["twin_dir"]].append(str(sent["successor_job_id"]))
    return {d: max(v, key=int) for d, v in ids.items() if v}
