"""`hpcserve scale`: a serving deployment's capacity, changed while it serves.

A deployment as submitted is its front job (the router, the orchestrator, its own instances).
`--add N` submits an instance job: the same deployment (rebuilt from the front's
deployment.yaml, config.SOURCE_FILE) with only one role, N instances and no router, whose
plan.json `attach` names the front's running router; its orchestrator registers each instance
there once the instance answered its smoke request (runtime/contract.py, spec 9). `--remove N`
writes a drain request into the job directory that runs each instance picked; that job's
orchestrator takes the instance out of the router, lets its requests finish, then stops it.
Everything goes through the runner, so it works on the login node and over --remote alike.
"""

from __future__ import annotations

import json
import posixpath
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import deployment_jobs, deployments, ops
from ..errors import HpcserveError
from ..runtime.contract import (CANNOT_ADD, CONTROL_DIR, SCALE_DIR, SERVING_PHASES,
                                drain_request_path)
from ..slurm.runner import read_json

WAIT_MARGIN_S = 30           # --wait: the drain's own timeout, and this for the stop after it


@dataclass(frozen=True)
class Front:
    """A deployment's front job as `hpcserve scale` needs it: its entry, plan.json, and where
    Slurm and its state.json say it stands."""

    entry: deployments.Entry
    spec: dict
    view: ops.View

    @property
    def roles(self) -> list[str]:
        return sorted({i["role"] for i in self.spec.get("instances", [])})


@dataclass(frozen=True)
class Drain:
    """One instance picked to drain, and the job that runs it."""

    entry: deployments.Entry
    instance: str

    @property
    def request(self) -> str:
        return drain_request_path(self.entry.job_dir, self.instance)


def front(job: str, remote: str | None, runner, role: str | None) -> Front:
    """The serving front of JOB's deployment (an instance job named leads to its front), once
    it is known to have `role` (None: any); refused in one line otherwise."""
    e = ops.resolve(job, remote, runner)
    spec = read_json(runner, posixpath.join(e.job_dir, "plan.json"))
    att = spec.get("attach") if isinstance(spec, dict) else None
    if att:  # an instance job: its plan names its front (which the index may not hold)
        e = deployments.find(att["front_job_dir"], e.remote) or deployments.Entry(
            att["front_job_id"], att["deployment"], att["front_job_dir"], e.remote)
        spec = read_json(runner, posixpath.join(e.job_dir, "plan.json"))
    if not isinstance(spec, dict) or "instances" not in spec:
        raise HpcserveError(f"job {e.job_id} is not an hpcserve deployment: no plan.json in "
                            f"{e.job_dir}")
    (v,) = ops.status([e], lambda _r: runner)
    f = Front(e, spec, v)
    if role is not None and role not in f.roles:
        raise HpcserveError(f"deployment {spec.get('name', e.name)} (job {e.job_id}) has no role "
                            f"{role!r}: its roles are {', '.join(f.roles)}")
    if v.summary_phase not in SERVING_PHASES or not v.endpoint:
        raise HpcserveError(f"job {e.job_id} ({e.name}) does not serve ({ops.describe(v)}): "
                            "a deployment scales once its router serves")
    return f


# ---------------------------------------------------------------------------------------- add

def add(f: Front, runner, remote: str | None, role: str, count: int,
        cfg=None) -> ops.Submitted:
    """Render the instance job of `count` instances of `role` under the front's scale/ and
    submit it as `hpcserve submit` does (with renew:, the first of its pair; its own job
    submits the twin); `cfg`: the deployment to render it from (default: as submitted;
    `hpcserve upgrade` gives its new release)."""
    cfg = cfg or source_config(f, runner)
    seq = next_seq(runner, f.entry.job_dir, role)
    taken = ops.ports_in_use(runner, remote) | ops.spec_ports(f.spec) | \
        scale_ports(runner, f.entry.job_dir)
    (name, job_dir, files), *twin = instance_job(cfg, role, count, seq, attach_of(f),
                                                 f.entry.job_dir, taken)
    for _, d, fs in twin:
        ops.write_files(fs, d, runner=runner, remote=remote)
    return ops.submit_files(name, files, job_dir, runner=runner, remote=remote,
                            front=f.entry.job_dir)


def instance_job(cfg, role: str, count: int, seq: int, attach: dict, front_dir: str,
                 taken: set[int], label: str | None = None) -> list[tuple[str, str, dict]]:
    """(job name, job directory, files) of the instance job of `count` instances of `role`,
    <front>/scale/<role>-<label>/ (label: seq unless given; seq picks its port block): one
    directory, or with the deployment's renew: the pair of it and its twin <role>-<label>b/
    (plan.instance_plans). Every caller that renders an instance job plans it there."""
    from ..author import plan as planner
    from ..author.render import render_files
    root = posixpath.join(front_dir, SCALE_DIR)
    out = []
    for name, p in planner.instance_plans(cfg, role, count, seq, attach, taken, label):
        d = posixpath.join(root, name)
        out.append((p.name, d, render_files(planner.with_twin_dir(p, root), d)))
    return out


def scale_ports(runner, front_dir: str) -> set[int]:
    """The ports of every instance job rendered under the front's scale/: a renewing job's
    twin runs under a job id the index does not hold."""
    root = posixpath.join(front_dir, SCALE_DIR)
    used: set[int] = set()
    for n in runner.list_dir(root):
        try:
            used |= ops.spec_ports(read_json(runner, posixpath.join(root, n, "plan.json")) or {})
        except ValueError:
            continue  # not a plan we can read: nothing known about its ports
    return used


def attach_of(f: Front) -> dict:
    """plan.json's attach of an instance job of this front (runtime/contract.py)."""
    r = f.spec.get("router")
    if not r:
        raise HpcserveError(f"job {f.entry.job_id} ({f.entry.name}) runs no router: instances "
                            "of a job of their own have no router to join")
    why = CANNOT_ADD.get(r["workers_api"])
    if why:
        raise HpcserveError(f"the router of job {f.entry.job_id}, {r['name']}, cannot add "
                            f"workers while it runs ({r['workers_api']}: {why}); --add needs a "
                            "router with a worker API that adds, --remove still works")
    return {"router_url": f.view.endpoint, "workers_api": r["workers_api"],
            "api_key_env": r.get("api_key_env"), "front_job_id": f.entry.job_id,
            "front_job_dir": f.entry.job_dir,
            "deployment": f.spec.get("name", f.entry.name)}


def source_config(f: Front, runner, sets: tuple[str, ...] = ()):
    """The deployment as submitted, rebuilt from the front's deployment.yaml (`sets`: --set
    values applied to it)."""
    from ..author import config
    where = posixpath.join(f.entry.job_dir, config.SOURCE_FILE)
    text = runner.read_text(where)
    if text is None:
        raise HpcserveError(f"job {f.entry.job_id} has no {where} (rendered by an hpcserve "
                            "older than `hpcserve scale`): the deployment cannot be rebuilt")
    with tempfile.TemporaryDirectory(prefix="hpcserve-scale-") as tmp:
        local = Path(tmp) / config.SOURCE_FILE
        local.write_text(text, encoding="utf-8")
        return ops.with_user(config.load(local, sets), runner, f.entry.remote)


def next_seq(runner, front_dir: str, role: str) -> int:
    """1 + the highest <role>-<seq> under the front's scale/ (1 for the first)."""
    seqs = [int(n.rpartition("-")[2]) for n in runner.list_dir(
        posixpath.join(front_dir, SCALE_DIR)) if n.rpartition("-")[0] == role
        and n.rpartition("-")[2].isdigit()]
    return max(seqs, default=0) + 1


# ------------------------------------------------------------------------------------- remove

def pick(f: Front, runner, role: str, count: int) -> list[Drain]:
    """`count` serving instances of `role` to drain: the newest instance job's first, the
    front's own last; one with a drain request pending is not picked again."""
    # instance jobs only: the slots are the autoscaler's to drain
    jobs = [j.entry for j in reversed(deployment_jobs.jobs_of(f.entry, runner).instances)] + \
        [f.entry]
    views = {v.job_dir: v for v in ops.status(jobs[:-1], lambda _r: runner)}
    views[f.entry.job_dir] = f.view
    found = []
    for e in jobs:
        v = views[e.job_dir]
        if v.summary_phase not in SERVING_PHASES:
            continue
        pending = set(runner.list_dir(posixpath.join(e.job_dir, CONTROL_DIR)))
        mine = [(i.get("index", 0), n) for n, i in v.instances.items()
                if i.get("role") == role and i.get("status") == "serving"
                and posixpath.basename(drain_request_path("", n)) not in pending]
        found += [Drain(e, n) for _, n in sorted(mine, reverse=True)]
    if len(found) < count:
        raise HpcserveError(f"--remove {count}: only {len(found)} {role} instance(s) of "
                            f"{f.entry.name} serve")
    return found[:count]


def request(runner, drains: list[Drain], timeout_s: float) -> None:
    """Write each drain request (runtime/contract.py): a temporary file renamed into place, so
    the orchestrator never reads half of one."""
    for d in drains:
        body = json.dumps({"timeout_s": timeout_s, "requested_at": time.time(),
                           "job_id": d.entry.job_id.split("+")[0]})
        write_atomically(runner, d.request, body + "\n")


def write_atomically(runner, path: str, text: str) -> None:
    """`text` into `path` where the runner runs (here or over SSH): its directory made, then a
    temporary file beside it renamed over it."""
    tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.tmp")
    script = 'mkdir -p -- "$1" && printf %s "$2" > "$3" && mv -f -- "$3" "$4"'
    runner.run(["sh", "-c", script, "sh", posixpath.dirname(path), text, tmp, path])


def wait_removed(runner, drains: list[Drain], timeout_s: float,
                 echo: Callable[[str], None], interval: float = 0.5) -> int:
    """0 once every instance drained is "removed" in its job's state.json; 1 past the drain's
    timeout + WAIT_MARGIN_S, naming those that were not."""
    left = list(drains)
    end = time.time() + timeout_s + WAIT_MARGIN_S
    while left:
        for d in list(left):
            inst = (ops.job_state(runner, d.entry.job_dir).get("instances") or {}).get(d.instance)
            if isinstance(inst, dict) and inst.get("status") == "removed":
                echo(f"{d.instance} of job {d.entry.job_id}: removed")
                left.remove(d)
        if left and time.time() >= end:
            echo("not removed within {:.0f} s: {}".format(timeout_s + WAIT_MARGIN_S, ", ".join(
                f"{d.instance} of job {d.entry.job_id}" for d in left)))
            return 1
        if left:
            time.sleep(interval)
    return 0
