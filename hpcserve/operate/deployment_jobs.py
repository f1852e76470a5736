"""The jobs of one deployment, for every operator command that treats a deployment as one
(status, list, cancel, scale, upgrade).

A deployment is its front job (as submitted) and the jobs that joined it:

- instance jobs, `hpcserve scale --add`'s (and `upgrade`'s surges): in the local index, each
  entry naming its front's job directory;
- slot jobs, autoscale's: submitted by the front's orchestrator while it serves, so in no
  index; the front's state.json `autoscale` names each slot's job id and directory
  (runtime/autoscale.py);
- successors, of a renewing instance or slot job (`renew:`, runtime/renew.py): submitted from
  inside the job into its twin directory, so in no index either. Each directory's state.json
  names the job that last ran it, and a job's renew record names the successor it submitted
  into its twin, which may not have started yet; a directory's current job is the newest of
  those ids (Slurm gives ids out in increasing order).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from . import deployments, ops
from ..slurm.runner import read_json

FRONT, INSTANCE, SLOT = "front", "instance", "slot"


@dataclass(frozen=True)
class Job:
    """One job of a deployment: its entry (job id and directory), what it is to its front, and
    for a successor the job id it follows (the one the index or the front's state.json
    recorded for its pair)."""

    entry: deployments.Entry
    kind: str                        # FRONT, INSTANCE or SLOT
    successor_of: str | None = None  # a renewal's successor: the job its pair was recorded as


@dataclass(frozen=True)
class DeploymentJobs:
    """A front and every job that joined it, each renewing pair's as the jobs it runs now."""

    front: Job
    instances: tuple[Job, ...] = ()  # `hpcserve scale`'s, oldest first
    slots: tuple[Job, ...] = ()      # autoscale's that have not ended, in slot order

    @property
    def members(self) -> tuple[Job, ...]:
        """Every job but the front: its instance jobs, then its slot jobs."""
        return self.instances + self.slots

    @property
    def jobs(self) -> tuple[Job, ...]:
        """The front first, then its members."""
        return (self.front,) + self.members

    @property
    def successors(self) -> tuple[Job, ...]:
        return tuple(j for j in self.members if j.successor_of)


def jobs_of(front: deployments.Entry, runner,
            index: Iterable[deployments.Entry] | None = None) -> DeploymentJobs:
    """The deployment whose front is `front`, its files read through `runner` (`index`: the
    index's entries when the caller holds them already)."""
    inst = [Job(e, INSTANCE) for e in deployments.instance_jobs(front, index)]
    slots = _slots(front, runner)
    return DeploymentJobs(Job(front, FRONT), _now(inst, runner), _now(slots, runner))


def pair_now(entry: deployments.Entry, runner, kind: str = INSTANCE) -> list[Job]:
    """The jobs a named instance or slot job's pair runs now (a job without renew: itself)."""
    return list(_now([Job(entry, kind)], runner))


def of_entries(entries: Iterable[deployments.Entry], runner_of: Callable[[str | None], Any],
               index: Iterable[deployments.Entry] | None = None) -> list[Job]:
    """Every job of the deployments among `entries` (`status`, `list`): each front followed by
    its members; an instance job whose front is not among them (its pair as it runs now) where
    it was. A job reached twice is listed once."""
    entries = list(entries)
    index = list(deployments.entries() if index is None else index)  # read once
    fronts = {(e.remote, e.job_dir.rstrip("/")) for e in entries if not e.front}
    out: list[Job] = []
    seen: set[tuple] = set()
    for e in entries:
        if e.front and (e.remote, e.front.rstrip("/")) in fronts:
            continue  # listed under its front
        runner = runner_of(e.remote)
        for j in pair_now(e, runner) if e.front else jobs_of(e, runner, index).jobs:
            key = (j.entry.remote, j.entry.job_dir, j.entry.job_id)
            if key not in seen:
                seen.add(key)
                out.append(j)
    return out


def views(jobs: list[Job], runner_of: Callable[[str | None], Any],
          probe: bool = False) -> list[ops.View]:
    """ops.status of `jobs`, each view carrying its job's kind (the table marks slot jobs and
    successors by it: their ids and names alone do not say so)."""
    vs = ops.status([j.entry for j in jobs], runner_of, probe=probe)
    by = {(j.entry.remote, j.entry.job_dir, j.entry.job_id): j for j in jobs}
    for v in vs:
        j = by.get((v.remote, v.job_dir, v.job_id))
        if j is not None:
            v.kind, v.successor_of = j.kind, j.successor_of
    return vs


def _slots(front: deployments.Entry, runner) -> list[Job]:
    """The slot jobs the front's state.json `autoscale` records that have not ended (a slot
    that is "free" runs none)."""
    got = ops.job_state(runner, front.job_dir).get("autoscale") or {}
    out = []
    for role in got.values():
        for name, s in sorted((role.get("slots") or {}).items()):
            if s.get("job_id") and s.get("status") != "free":
                out.append(Job(deployments.new_entry(
                    str(s["job_id"]), f"{front.name}-{name}", s["dir"], front.remote,
                    front.cluster, front=front.job_dir), SLOT))
    return out


def _now(jobs: Iterable[Job], runner) -> tuple[Job, ...]:
    """`jobs`, each renewing one's replaced by the current job of each directory of its pair (a
    directory that never ran a job is left out); a job newer than the one recorded is its
    successor."""
    out: list[Job] = []
    for j in jobs:
        e = j.entry
        plan = read_json(runner, posixpath.join(e.job_dir, "plan.json")) if e.front else None
        renew = plan.get("renew") if isinstance(plan, dict) else None
        if not renew:
            out.append(j)
            continue
        ids = _newest_jobs([e.job_dir, renew["twin_dir"]], runner, {e.job_dir: e.job_id})
        out += [Job(replace(e, job_id=jid, job_dir=d), j.kind,
                    e.job_id if _newer(jid, e.job_id) else None)
                for d, jid in ids.items()]
    return tuple(out)


def _newer(a: str, b: str) -> bool:
    return a.isdigit() and b.isdigit() and int(a) > int(b)


def _newest_jobs(dirs: list[str], runner, known: dict[str, str]) -> dict[str, str]:
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
