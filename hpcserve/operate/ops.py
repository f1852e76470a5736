"""Operating deployments: submit, follow, status, logs, cancel, list.

Everything that runs or reads goes through a Runner (local or SSH), so the same code serves the
login node and a laptop. Slurm is asked once per command (one squeue for all jobs), and the
job's own state.json supplies what Slurm cannot know (phase, endpoint, failed node).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import deployments
from ..errors import HpcserveError
from ..runtime.contract import SCALE_DIR, SERVING_PHASES, TERMINAL_PHASES
from ..runtime.slurm_cluster import config_argv, parse_config
from ..runtime.slurm_jobs import ACTIVE_STATES, fold_het
from ..runtime.slurm_queue import (parse_sacct, parse_squeue_format, sacct_argv, sacct_disabled,
                                  squeue_argv)
from ..runtime.slurm_reasons import reason_in_words
from ..runtime.slurm_scontrol import parse_scontrol_job, scontrol_argv
from ..slurm.client import parse_job_id
from ..slurm.runner import SlurmUnreachable, read_json
from ..author.ports import least_clashing

# Slurm's states of a job that has not ended: the parsers' one list (a job held after a requeue
# or stopped is not over)
ACTIVE_SLURM = ACTIVE_STATES
# View.ended of a job that Slurm no longer lists, in its queue or its accounting
GONE = "Slurm no longer lists the job"


def runner_for(remote: str | None, **ssh: Any):
    if not remote:
        from ..slurm.runner import LocalRunner
        return LocalRunner()
    from ..slurm.ssh import SSHRunner
    return SSHRunner(remote, **{k: v for k, v in ssh.items() if v is not None})


# ------------------------------------------------------------------------------------- submit

@dataclass
class Submitted:
    job_id: str
    job_dir: str
    name: str
    remote: str | None
    entry: deployments.Entry
    driver: Any = None   # --in-allocation: the driver process started here (in_allocation.py)
    api_key_file: str | None = None  # the deployment's API key that submit made (plan.json)


def submit(file: str, sets: tuple[str, ...], *, runner, remote: str | None, out: str | None,
           dry_run: bool, check: bool, warn: Callable[[str], None] = lambda _w: None,
           preflight_only: bool = False, in_allocation: bool = False,
           stage_only: bool = False) -> Submitted | str:
    from ..author import config, plan as planner
    from ..author.render import write_job
    cfg = with_user(config.load(file, sets), runner, remote)
    if stage_only:
        cfg = planner.with_stage(cfg)

    def shape(q):
        """The kind of job asked for; applied again to a plan rebuilt with its ports moved."""
        if preflight_only:
            q = planner.preflight_only(q)
        if stage_only:
            q = planner.stage_only(q)
        return planner.in_allocation(q) if in_allocation else q

    p = shape(planner.build(cfg))
    if in_allocation and not dry_run:
        return _submit_in_allocation(p, cfg, runner=runner, remote=remote, out=out,
                                     check=check, warn=warn, preflight_only=preflight_only,
                                     shape=shape)
    p, job_dir, files = _rendered(p, cfg, runner=runner, remote=remote, out=out, warn=warn,
                                  preflight_only=preflight_only, live=not (dry_run or check),
                                  shape=shape)
    if dry_run:
        if remote is None:
            write_job(files, job_dir)
            return job_dir
        return str(write_job(files, os.path.join(tempfile.mkdtemp(prefix="hpcserve-render-"),
                                                 "job")))
    if check:
        # Slurm only reads the script: ask it without leaving a job directory behind.
        with tempfile.TemporaryDirectory(prefix="hpcserve-check-") as tmp:
            target = local = str(write_job(files, os.path.join(tmp, "job")))
            if remote is not None:
                # into a directory of mktemp's (0700, its name unknown beforehand): never
                # one whose name was visible, free, before the upload
                scratch = runner.run(["mktemp", "-d"]).out.strip()
                target = posixpath.join(scratch, "job")
                runner.put_tree(local, target)
            try:
                res = runner.run(["sbatch", "--test-only", posixpath.join(target, "job.sbatch")])
            finally:
                if remote is not None:
                    runner.run(["rm", "-rf", "--", scratch], check=False)
        return (res.err or res.out).strip()
    sub = submit_files(p.name, files, job_dir, runner=runner, remote=remote)
    sub.api_key_file = _api_key_file(p, job_dir)
    return sub


def _api_key_file(p, job_dir: str) -> str | None:
    from ..author.plan_json import api_key
    return (api_key(p, job_dir) or {}).get("file")


def submit_files(name: str, files: dict, job_dir: str, *, runner, remote: str | None,
                 front: str | None = None) -> Submitted:
    """Write a rendered job directory where the runner runs, sbatch it, and record it in the
    index (`front`: the front job directory of the deployment an instance job joins)."""
    write_files(files, job_dir, runner=runner, remote=remote)
    script = posixpath.join(job_dir, "job.sbatch")
    res = runner.run(["sbatch", "--parsable", script])
    job_id = parse_job_id(res.out)
    try:
        cluster = cluster_name(runner)
    except SlurmUnreachable:
        cluster = None  # the job is queued: record it all the same, as a cluster not named
    entry = deployments.new_entry(job_id, name, job_dir, remote, cluster, front=front)
    deployments.record(entry)
    return Submitted(job_id, job_dir, name, remote, entry)


def write_files(files: dict, job_dir: str, *, runner, remote: str | None) -> None:
    """A rendered job directory written where the runner runs (here, or copied over SSH)."""
    from ..author.render import write_job
    if remote is None:
        write_job(files, job_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="hpcserve-render-") as tmp:
            runner.put_tree(str(write_job(files, os.path.join(tmp, "job"))), job_dir)


def _rendered(p, cfg, *, runner, remote: str | None, out: str | None,
              warn: Callable[[str], None], preflight_only: bool, live: bool, shape):
    """(plan, job directory, its files) for a submission; a live one (not --dry-run or --check)
    is first moved clear of this user's other deployments' ports and has its router's python
    checked. The plan's warnings are said once it is known to go ahead."""
    from ..author.render import render_files
    if live and not cfg.site.slurm.exclusive:
        p = shape(clear_of_my_other_deployments(p, cfg, runner, remote, warn))
    job_dir = _job_dir(p, runner, out, preflight_only)
    files = render_files(p, job_dir)
    if live:
        check_router_python(p, runner)  # refused: one line, no warnings before it
    for w in p.warnings:
        warn(w)
    return p, job_dir, files


def _job_dir(p, runner, out: str | None, preflight_only: bool) -> str:
    """--out, or <jobs_dir>/<name>[-preflight]-<timestamp>."""
    if out:
        # the parent resolved, never the directory itself: a link there is a path that
        # exists, and is refused as one
        parent, name = posixpath.split(posixpath.normpath(out))
        return posixpath.join(runner.expand_path(parent or "."), name)
    kind = "-preflight" if preflight_only else "-stage" if (p.stage or {}).get("only") else ""
    return posixpath.join(runner.expand_path(p.jobs_dir),
                          f"{p.name}{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


def _submit_in_allocation(p, cfg, *, runner, remote: str | None, out: str | None, check: bool,
                          warn: Callable[[str], None], preflight_only: bool, shape):
    """The job started as a background process of the allocation this shell is in, once it is
    known to fit there (in_allocation.py)."""
    from . import in_allocation as ia
    from ..author.plan_json import job_spec
    from ..author.render import write_job
    from ..runtime.spec import Spec
    if remote is not None:
        raise HpcserveError("--in-allocation runs in the allocation's own shell, not with --remote")
    alloc = ia.allocation_here()
    spec = Spec(job_spec(p, ""))   # the runtime's view, as the job will read it
    held = ia.check_fits(spec, alloc, runner)
    if check:
        return ia.fits_words(spec, held)
    ia.refuse_second(alloc, runner, deployments.entries())
    p, job_dir, files = _rendered(p, cfg, runner=runner, remote=remote, out=out, warn=warn,
                                  preflight_only=preflight_only, live=True, shape=shape)
    write_job(files, job_dir)
    driver = ia.start_driver(job_dir, alloc)
    entry = deployments.new_entry(alloc, p.name, job_dir, None, cluster_name(runner), alloc)
    deployments.record(entry)
    return Submitted(alloc, job_dir, p.name, None, entry, driver, _api_key_file(p, job_dir))


def cluster_name(runner) -> str | None:
    """Slurm's ClusterName where the runner runs (None where scontrol does not say)."""
    res = runner.run(config_argv(), check=False)
    return parse_config(res.out).get("ClusterName") if res.rc == 0 else None


def job_state(runner, job_dir: str) -> dict:
    """The job's state.json ({} where there is none)."""
    return read_json(runner, posixpath.join(job_dir, "state.json")) or {}


def ports_in_use(runner, remote: str | None) -> set[int]:
    """Every port of this user's hpcserve deployments that Slurm still runs or queues on this
    cluster (from their plan.json files)."""
    mine = [e for e in deployments.entries() if e.remote == remote and e.job_dir]
    if not mine:
        return set()
    queue = _squeue(runner)
    here = _listed_here(runner, mine)
    used: set[int] = set()
    for e in mine:
        q = queue.get(e.job_id) if e in here else None
        text = runner.read_text(posixpath.join(e.job_dir, "plan.json")) if q and \
            q.state in ACTIVE_SLURM else None
        try:
            used |= spec_ports(json.loads(text) if text else {})
        except ValueError:
            continue  # not a plan we can read: nothing known about its ports
    return used


def spec_ports(spec: dict) -> set[int]:
    """The ports a plan.json binds: its engines' and its router's (ValueError: not a plan)."""
    try:
        used = set()
        for i in spec.get("instances", []):
            used |= {int(i["port"]), *map(int, i.get("ports", {}).values())}
        r = spec.get("router") or {}
        return used | {int(r[k]) for k in ("port", "prometheus_port") if r.get(k)}
    except (TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"not a plan: {e}") from None


def clear_of_my_other_deployments(p, cfg, runner, remote: str | None, warn):
    """On nodes other jobs may share, two of this user's deployments with the same ports
    would clash on a node both get. Move this one's ports (those its file does not set) by the
    smallest multiple of PORT_SHIFT_STEP that clears the ports the others use (or most of them,
    where the file itself sets one that is taken)."""
    from ..author import plan as planner
    shifts = [k * planner.PORT_SHIFT_STEP for k in range(planner.PORT_SHIFTS)]
    best, best_shift = least_clashing(
        ((s, planner.build(cfg, port_shift=s) if s else p) for s in shifts),
        ports_in_use(runner, remote))
    if best_shift:
        warn(f"ports moved by +{best_shift} (those the file does not set), clear of your other "
             "deployments on these shared nodes")
    # a port the file sets that another deployment holds remains: the job names that clash
    return best


def check_router_python(p, runner) -> None:
    """Outside containers the router runs from its Python package (RouterPlan.package) with
    the environment sbatch exports from this shell: a python here that cannot import it would
    fail in the job, after the queue and the engines' start. Say what to install before
    submitting instead."""
    if p.container.runtime != "none" or not p.router or not p.router.package or \
            not isinstance(p.router.command[0], str):
        return
    python, module = p.router.command[0], p.router.package
    try:
        why = "" if runner.run([python, "-c", f"import {module}"], check=False).rc == 0 else \
            f"cannot import {module}"
    except HpcserveError:  # no such program
        why = "is not found"
    if why:
        raise HpcserveError(
            f"the router runs from {python}'s {module} package, and {python} here {why}: "
            f"install {module} into that python (pip install {p.router.name}; "
            "`pip install 'hpcserve[dev]'` brings the routers hpcserve is tested with, for the "
            "local test cluster), or point router.python / site.paths.router_python at a "
            "python that has it")


# ------------------------------------------------------------------------------------- status

@dataclass
class View:
    job_id: str
    name: str
    job_dir: str | None
    remote: str | None
    slurm_state: str | None = None
    reason: str | None = None
    nodes: str | None = None
    components: list = field(default_factory=list)
    phase: str | None = None
    endpoint: str | None = None
    failure: dict | None = None
    engines: str | None = None
    health: str | None = None
    allocation: str | None = None  # in an allocation the user holds: its job id
    front: str | None = None       # an instance job: its deployment's front job directory
    kind: str | None = None        # deployment_jobs' kind: front, instance, slot (None: not asked)
    successor_of: str | None = None  # a renewal's successor: the job its pair was recorded as
    driver: str | None = None      # its driver process: running, gone, elsewhere
    state: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        # recovery's record as state.json has it (always present, so scripts need no guard)
        return {k: v for k, v in self.__dict__.items() if k != "state"} | {
            "history": self.state.get("history", []), "instances": self.instances,
            "excluded_nodes": self.state.get("excluded_nodes", []),
            "startup": self.state.get("startup")}

    @property
    def instances(self) -> dict:
        """state.json's instances (recovery's record of each), {} where the runtime wrote none."""
        inst = self.state.get("instances")
        return inst if isinstance(inst, dict) else {}

    @property
    def ended(self) -> str | None:
        """How a job ended that never wrote a final phase: Slurm's state for it (killed, node
        failure...), or GONE; None for a job that still runs, waits, or wrote its final phase.
        Derived from slurm_state and phase, so it holds whenever either is set (status fills
        slurm_state in from accounting after the queue)."""
        if self.phase in TERMINAL_PHASES:
            return None
        if self.driver == "gone":  # in an allocation, which outlives the deployment
            return "its driver process is gone"
        if self.slurm_state in ("PENDING", "RUNNING", "COMPLETING"):
            return None
        if self.slurm_state is None:
            # Gone from the queue (and from accounting) without a final phase: whatever the job
            # last wrote, say "serving at" an endpoint, is no longer true.
            return GONE
        return None if self.slurm_state in ACTIVE_SLURM else self.slurm_state or None

    @property
    def summary_phase(self) -> str:
        """The phase a person should see: state.json's, or Slurm's when the job never started."""
        if self.phase and (self.phase in TERMINAL_PHASES or self.slurm_state in ("RUNNING",
                                                                                 "COMPLETING")
                           and self.driver != "gone"):
            return self.phase
        if self.slurm_state == "PENDING":
            return "pending"
        if self.ended:
            return f"ended ({self.ended})"
        return self.phase or "pending"


def _squeue(runner) -> dict[str, Any]:
    res = runner.run(squeue_argv(), check=True)
    return {j.job_id: j for j in fold_het(parse_squeue_format(res.out))}


def status(entries: list[deployments.Entry], runner_of: Callable[[str | None], Any],
           probe: bool = False) -> list[View]:
    views = []
    by_remote: dict[str | None, list[deployments.Entry]] = {}
    for e in entries:
        by_remote.setdefault(e.remote, []).append(e)
    for remote, es in by_remote.items():
        runner = runner_of(remote)
        queue = _squeue(runner)  # one call for every job on this cluster
        here = _listed_here(runner, es)
        for e in es:
            v = View(e.job_id, e.name, e.job_dir, remote, allocation=e.allocation, front=e.front)
            j = queue.get(e.job_id) if e in here or e.allocation else None
            if j is not None and j.name != e.name and not e.allocation:
                j = None  # the id went to another job of this user's since
            if j is not None:
                v.slurm_state = j.state
                v.reason = j.reason
                v.nodes = ",".join(n for n in j.nodes if n)
                v.components = [{"job_id": c.job_id, "state": c.state, "nodes": c.nodes,
                                 "reason": c.reason} for c in j.components]
            if e.job_dir:
                text = runner.read_text(posixpath.join(e.job_dir, "state.json"))
                if text:
                    try:
                        v.state = json.loads(text)
                    except ValueError:
                        v.state = {}
                    v.phase = v.state.get("phase")
                    v.endpoint = v.state.get("endpoint")
                    v.failure = v.state.get("failure")
                    if v.state.get("engines_total"):
                        v.engines = f"{v.state.get('engines_ready_count', 0)}/{v.state['engines_total']}"
            if e.allocation and v.phase not in TERMINAL_PHASES:
                from .in_allocation import driver_state
                v.driver = driver_state(runner, e.job_dir)
            if probe and v.summary_phase in SERVING_PHASES:  # degraded answers too
                v.health = _probe(runner, v.endpoint, v.state.get("health_urls") or {})
            views.append(v)
        _from_accounting(runner, [v for v in views if v.remote == remote])
    return views


def _listed_here(runner, es: list[deployments.Entry]) -> set[deployments.Entry]:
    """The entries that may be the job Slurm lists under their id on the runner's cluster: the
    newest submission of each id, of this cluster where the entries name several (asked only
    then: one login host may reach several clusters)."""
    newest = deployments.newest_per_job(es)
    if len({e.cluster for e in newest if e.cluster}) > 1:
        here = cluster_name(runner)
        newest = {e for e in newest if e.cluster in (None, here)}
    return newest


def _from_accounting(runner, views: list[View]) -> None:
    """Jobs Slurm no longer lists (past MinJobAge) whose state.json has no final phase: ask sacct
    once for all of them. Without accounting sacct exits 1; nothing more is known then."""
    missing = [v for v in views if v.slurm_state is None and v.phase not in TERMINAL_PHASES]
    if not missing:
        return
    res = runner.run(sacct_argv([v.job_id for v in missing]), check=False)
    if res.rc != 0 or sacct_disabled(res):
        return
    by_id = {j.job_id: j for j in fold_het(parse_sacct(res.out))}
    for v in missing:
        j = by_id.get(v.job_id)
        if j is not None:
            v.slurm_state = j.state


def _probe(runner, endpoint: str | None, instances: dict[str, str]) -> str:
    """The router's /health and every instance leader's health URL (as the job's own runtime
    probes them), in one curl run where the endpoints are: the login node's network, or over
    SSH. Each answer: ok, HTTP <code>, or no answer (refused, or nothing within 5 s)."""
    targets = ([("router", endpoint + "/health")] if endpoint else []) + list(instances.items())
    if not targets:
        return ""
    argv = ["curl", "-s", "--noproxy", "*", "-w", "%{http_code}\\n", "--max-time", "5"]
    for _, url in targets:
        argv += ["-o", "/dev/null", url]
    codes = runner.run(argv, check=False).out.split()
    codes += ["000"] * (len(targets) - len(codes))
    words = {"200": "ok", "000": "no answer"}
    return ", ".join(f"{name} {words.get(c, f'HTTP {c}')}" for (name, _), c in zip(targets, codes))


REASONS = {"cancelled": "cancelled", "time_limit": "stopped at the time limit"}


def describe(v: View) -> str:
    ph = v.summary_phase
    if ph == "pending":
        words = reason_in_words(v.reason or "")
        return f"pending: {words}" if words else "pending"
    if ph == "starting" and v.engines:
        return f"starting: engines {v.engines} ready"
    if ph in ("engines_ready", "router_ready"):
        return ph.replace("_", " ")
    if ph in SERVING_PHASES:
        where = f"at {v.endpoint}" if v.endpoint else "(no router: see each instance's node 0)"
        down = _instances_down(v)
        return f"{ph} {where}" + (f" ({down})" if down else "") + \
            (f" ({v.health})" if v.health else "")
    if ph == "failed" and v.failure:
        f = v.failure
        where = " ".join(str(x) for x in (
            f.get("role"), f.get("instance") if f.get("instance") is not None else None,
            f"node {f['node']}" if f.get("node") else None,
            f"rank {f['node_rank']}" if f.get("node_rank") is not None else None) if x is not None)
        code = f", exit code {f['exit_code']}" if f.get("exit_code") is not None else ""
        return f"failed: {v.state.get('reason', '')} [{where}{code}]"
    if ph == "cancelled":
        return REASONS.get(v.state.get("reason"), "cancelled")
    if ph in ("done", "failed"):
        return f"{ph}: {v.state.get('reason', '')}"
    return ph


def _instances_down(v: View, most: int = 2) -> str:
    """The instances not serving, for the one-line summary: the first `most` with why and what
    is done about it, then a count (the instance lines below the row name every one)."""
    down = [_instance_down(n, i) for n, i in v.instances.items() if i.get("status") != "serving"]
    more = [f"{len(down) - most} more not serving"] if len(down) > most else []
    return "; ".join(down[:most] + more)


def _instance_down(name: str, i: dict) -> str:
    why = f": {i['why']}" if i.get("why") else ""
    if i.get("status") == "restarting":
        return f"{name} out{why}, restarting as attempt {i.get('attempt')}"
    return f"{name} {i.get('status')}{why}"


def instance_lines(v: View, now: float | None = None) -> list[str]:
    """One row per instance while the deployment serves (status, restarts, its last recovery's
    time, nodes), then the nodes recovery keeps out. Nothing once it ended: the record then says
    what was, not what is."""
    if v.summary_phase not in SERVING_PHASES or not v.instances:
        return []
    now = time.time() if now is None else now
    rows = [("INSTANCE", "STATUS", "RESTARTS", "LAST RECOVERY", "NODES")] + [
        (n, instance_status(i, now), str(i.get("restarts", 0)), _seconds(i.get("recover_s")),
         ",".join(i.get("nodes") or [])) for n, i in v.instances.items()]
    excluded = v.state.get("excluded_nodes") or []
    return [f"  {r}" for r in _columns(rows)] + (
        [f"  excluded nodes: {','.join(excluded)}"] if excluded else [])


def instance_status(i: dict, now: float) -> str:
    """serving, out (why; next try in N s), restarting (attempt N), failed (why)."""
    st = i.get("status", "?")
    if st == "restarting":
        return f"restarting (attempt {i.get('attempt')})"
    said = [i["why"]] if i.get("why") and st != "serving" else []
    if st == "out" and i.get("next_try_at") is not None:
        said.append(f"next try in {max(0, round(i['next_try_at'] - now))} s")
    return f"{st} ({'; '.join(said)})" if said else st


def _seconds(s: float | None) -> str:
    return "-" if s is None else f"{s:.1f} s" if s < 10 else f"{s:.0f} s"


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows with every column but the last padded to its widest cell."""
    w = [max(len(r[k]) for r in rows) for k in range(len(rows[0]) - 1)]
    return ["  ".join([c.ljust(w[k]) for k, c in enumerate(r[:-1])] + [r[-1]]) for r in rows]


def startup_line(v: View) -> str | None:
    """The start-up once the job has measured it (state.json's startup, runtime/startup.py):
    its total and the slowest instance with its slowest phase; None before."""
    st = v.state.get("startup") if isinstance(v.state, dict) else None
    if not isinstance(st, dict) or "total_s" not in st:
        return None
    queue = st.get("queue_wait_s")
    words = [f"  start-up {_seconds(st['total_s'])}" +
             (f" (after {_seconds(queue)} in the queue)" if queue is not None else "")]
    slow = st.get("slowest")
    if slow:
        words.append(f"slowest instance {slow['instance']} {_seconds(slow['total_s'])}, most in "
                     f"{slow['phase']} {_seconds(slow['phase_s'])}")
    return "; ".join(words)


def write_failures_line(v: View) -> str | None:
    """Where the job could not write its state.json while it served (runtime/state.py: it
    served on): how often, the last time and error; None where every write succeeded. The
    file holds what was true at its last write, so the job's log says the rest."""
    wf = v.state.get("write_failures") if isinstance(v.state, dict) else None
    if not isinstance(wf, dict) or not wf.get("count"):
        return None
    last = time.strftime("%H:%M:%S", time.localtime(wf.get("last_at") or 0))
    return (f"  state.json: {wf['count']} write(s) failed while serving, the last at {last} "
            f"({wf.get('error')}); see logs/hpcserve-job.log")


def lapse_line(v: View) -> str | None:
    """A renewing instance job whose renewal lapsed (runtime/renew.py: every successor tried
    failed before it served): its instances end at its time limit; None otherwise."""
    r = v.state.get("renew") if isinstance(v.state, dict) else None
    if not isinstance(r, dict) or not r.get("lapsed") or v.summary_phase not in SERVING_PHASES:
        return None
    return f"  renewal lapsed: {r['lapsed']}"


def caches_line(v: View) -> str | None:
    """Whether the compile caches kept between jobs were warm as the instances first started
    (state.json's caches, runtime/caches.py): how many of every node's caches, and where they
    live; None where the site keeps none or before the instances are up."""
    c = v.state.get("caches") if isinstance(v.state, dict) else None
    if not isinstance(c, dict) or not c.get("instances"):
        return None
    verdicts = [w for nodes in c["instances"].values() for caches in nodes.values()
                for w in caches.values()]
    return (f"  compile caches ({c['storage']} {c['dir']}): {verdicts.count('warm')} of "
            f"{len(verdicts)} warm")


def failure_detail(v: View, lines: int = 10) -> str:
    """For a failed deployment: which log holds the cause, and its last lines."""
    f = v.failure or {}
    tail = f.get("log_tail") or []
    if v.summary_phase != "failed" or not tail:
        return ""
    where = posixpath.join(v.job_dir, f["log"]) if v.job_dir and f.get("log") else "its log"
    error = [f"job {v.job_id}: last error in {where}: {f['error']}"] if f.get("error") else []
    return "\n".join(error + [f"job {v.job_id}: last lines of {where}:"] +
                      [f"  {ln}" for ln in tail[-lines:]])


def _slurm_cell(v: View) -> str:
    """Slurm's state of the job; for a deployment in an allocation, the allocation's."""
    return f"alloc {v.slurm_state or '-'}" if v.allocation else v.slurm_state or "-"


def grouped(views: list[View]) -> list[tuple[View, bool]]:
    """The views with each deployment's instance jobs (`hpcserve scale`) right under its front,
    marked True; an instance job whose front is not among them stays where it was."""
    under: dict[str, list[View]] = {}
    for v in views:
        if v.front:
            under.setdefault(v.front.rstrip("/"), []).append(v)
    out = []
    for v in views:
        if not v.front:
            out += [(v, False)] + [(w, True) for w in under.pop((v.job_dir or "").rstrip("/"), [])]
    left = {id(w) for ws in under.values() for w in ws}
    return out + [(v, False) for v in views if id(v) in left]


def _kind_words(v: View) -> str:
    """A slot job or a renewal's successor said beside its name: its indented row alone reads
    as an instance job `hpcserve scale` submitted."""
    words = (["slot"] if v.kind == "slot" else []) + (
        [f"successor of {v.successor_of}"] if v.successor_of else [])
    return f" ({', '.join(words)})" if words else ""


def status_table(views: list[View], instances: bool = False) -> str:
    """One row per job, a deployment's instance, slot and successor jobs indented under its
    front (a slot's and a successor's name marked so); with `instances`, each serving job's
    instance lines under its row."""
    order = grouped(views)
    views = [v for v, _ in order]
    rows = [("JOB", "NAME", "SLURM", "PHASE")] + [
        (("  " if sub else "") + v.job_id, v.name + _kind_words(v), _slurm_cell(v), describe(v))
        for v, sub in order]
    head, *lines = _columns(rows)
    out = [head]
    for v, line in zip(views, lines):
        more = [w for w in (startup_line(v), caches_line(v)) if w] if instances else []
        said = [w for w in (write_failures_line(v), lapse_line(v)) if w]
        out += [line] + said + more + (instance_lines(v) if instances else [])
    return "\n".join(out)


# ------------------------------------------------------------------------------------- follow

def follow(entry: deployments.Entry, runner, *, echo: Callable[[str], None], quiet: bool = False,
           interval: float = 1.0, until_serving: bool = True) -> int:
    """Print each phase change with the elapsed time; 0 once serving (or done), 1 on failure.
    Degraded and recovering count as serving: the endpoint answers while an instance is
    replaced, and a deployment seen first in them has served already."""
    t0 = entry.submitted_at or time.time()
    last = None
    while True:
        (v,) = status([entry], lambda _r: runner)
        line = describe(v)
        if line != last and not quiet:
            echo(f"[{time.time() - t0:7.1f}s] {line}")
        last = line
        ph = v.summary_phase
        if ph in SERVING_PHASES and until_serving:
            if quiet:
                echo(line)
            return 0
        if ph in TERMINAL_PHASES or v.ended:
            if quiet:
                echo(line)
            return 0 if ph in ("done", "cancelled") else 1
        time.sleep(interval)


# --------------------------------------------------------------------------------------- logs

# logs/<base>[.attemptN][.node<R>.<host>[.task<T>]].log and <base>[.attemptN].srun.log: an
# instance's first start (attempt 0) has no .attemptN., each restart's logs do.
_LOG_NAME = re.compile(r"(?P<base>[^.]+)(?:\.attempt(?P<attempt>\d+))?"
                       r"(?:\.node(?P<rank>\d+)\.(?P<host>.+?)(?:\.task(?P<task>\d+))?)?"
                       r"\.(?:srun\.)?log")


@dataclass(frozen=True)
class LogName:
    base: str                 # decode-0 / router / batch-123 / hpcserve-job / discover-0
    attempt: int = 0          # which start of the instance (0 for the job's own logs)
    rank: int | None = None   # node rank, for an engine's per-node log
    host: str | None = None
    task: int | None = None   # MPI engines: one log per task

    @classmethod
    def of(cls, name: str) -> "LogName":
        m = _LOG_NAME.fullmatch(name)
        if not m:  # batch-123.out, import-image.log...: only the base is known
            return cls(name.split(".")[0])
        num = {k: int(m[k]) if m[k] else None for k in ("attempt", "rank", "task")}
        return cls(m["base"], num["attempt"] or 0, num["rank"], m["host"], num["task"])

    def matches(self, role, instance, node, attempt) -> bool:
        r, _, i = self.base.rpartition("-")
        return ((not role or role in (self.base, r))
                and (instance is None or (i.isdigit() and int(i) == instance))
                and (node is None or self.rank is not None and node in (
                    str(self.rank), self.host, self.host.split(".")[0]))  # n3 of n3.cluster
                and (attempt is None or self.attempt == attempt))

    def order(self) -> tuple:
        # decode-2 before decode-10, each instance's attempts in turn, a step's nodes by rank
        # with its srun log last
        r, _, i = self.base.rpartition("-")
        who = (r, int(i)) if i.isdigit() else (self.base, -1)
        return (*who, self.attempt, self.rank is None, self.rank or 0, self.task or 0)


def log_files(runner, entry: deployments.Entry, role: str | None, instance: int | None,
              node: str | None, attempt: int | None = None) -> list[str]:
    """The job's logs that match, each instance's attempts oldest first (so the newest ends the
    output, as tail's would); `attempt` keeps one start of the instances. A front's deployment
    is one: the logs of every instance job under its scale/ follow its own (scale, renewal and
    autoscale submit them; a renewing pair's two directories each)."""
    out = []
    for d in [entry.job_dir] + ([] if entry.front else instance_job_dirs(runner, entry.job_dir)):
        logs = posixpath.join(d, "logs")
        named = [(LogName.of(n), n) for n in runner.list_dir(logs)]
        picked = [(ln, n) for ln, n in named if ln.matches(role, instance, node, attempt)]
        picked.sort(key=lambda p: (p[0].order(), p[1]))
        out += [posixpath.join(logs, n) for _, n in picked]
    return out


def instance_job_dirs(runner, front_dir: str) -> list[str]:
    """The job directories under a front's scale/ (contract.SCALE_DIR), in name order."""
    root = posixpath.join(front_dir, SCALE_DIR)
    return [posixpath.join(root, n) for n in sorted(runner.list_dir(root))]


def cancel(entry: deployments.Entry, runner, *, wait: bool, echo: Callable[[str], None]) -> int:
    """Stop a deployment through its own graceful path; plain scancel where that cannot work."""
    if entry.allocation:  # its steps and its driver, never the allocation
        from . import in_allocation
        return in_allocation.cancel(entry, runner, wait=wait, echo=echo)
    (v,) = status([entry], lambda _r: runner)
    if v.slurm_state not in ACTIVE_SLURM:
        # Gone from the queue or ended: say how it ended rather than claim a cancel.
        echo(f"job {entry.job_id} ({entry.name}) had already ended: {describe(v)}; "
             "nothing to cancel")
        return 0
    if v.slurm_state == "RUNNING":
        # Only the batch shell (hpcserve_runtime) gets USR1: it tears down router first, then the
        # engines rank 0 first, and records `cancelled`. A plain scancel would signal every step
        # at once.
        runner.run(["scancel", "--batch", "--signal=USR1", entry.job_id])
        echo(f"cancelling job {entry.job_id} ({entry.name}): orderly teardown requested")
    else:
        runner.run(["scancel", entry.job_id])  # always the leader id: ID+1 is one component
        when = " before it started" if v.slurm_state == "PENDING" else ""
        echo(f"cancelled job {entry.job_id} ({entry.name}){when}")
        return 0
    if not wait:
        return 0
    grace = 120.0
    text = runner.read_text(posixpath.join(entry.job_dir, "plan.json")) if entry.job_dir else None
    if text:
        try:
            grace = float(json.loads(text)["signal_grace"])
        except (ValueError, KeyError, TypeError):
            pass
    end = time.time() + grace + 30
    while time.time() < end:
        (v,) = status([entry], lambda _r: runner)
        if v.summary_phase in TERMINAL_PHASES or v.slurm_state not in ACTIVE_SLURM | {None}:
            echo(describe(v))
            return 0
        time.sleep(0.5)
    runner.run(["scancel", entry.job_id])
    echo(f"job {entry.job_id} did not finish its teardown in {grace + 30:.0f} s: scancel sent")
    return 2


def whoami(runner) -> str:
    """The user the runner's commands run as (here, or at the SSH target)."""
    return runner.run(["id", "-un"]).out.strip()


def with_user(cfg, runner, remote: str | None):
    """`cfg` for the user its jobs run as: over SSH the remote account (its per-user caches'
    owner), which may be named otherwise than this machine's user (the plan's default)."""
    from dataclasses import replace
    return cfg if remote is None else replace(cfg, user=whoami(runner))


def resolve(job: str, remote: str | None, runner) -> deployments.Entry:
    e = deployments.find(job, remote)
    if e is not None:
        return e
    # Not submitted by this hpcserve: find the job directory from Slurm's record of the job.
    jid = job.split("+")[0]
    if not jid.isdigit():
        raise HpcserveError(f"{job!r} is not a job id")
    res = runner.run(scontrol_argv(jid), check=False)
    if res.rc != 0:
        why = " | ".join((res.err or res.out).strip().splitlines()[-2:])
        raise HpcserveError(f"job {jid} is not in hpcserve's list and Slurm does not know it "
                            f"({why})")
    recs = parse_scontrol_job(res.out)
    others = sorted({r.user for r in recs if r.user} - {me := whoami(runner)})
    if others:
        # its job directory would be theirs: `scale` or `upgrade` would render and submit
        # their deployment file as you, `status` would read what they keep there
        raise HpcserveError(f"job {jid} belongs to {', '.join(others)}, not {me}: hpcserve "
                            "acts on your own jobs only")
    for r in recs:
        if "/logs/batch-" in r.stdout:
            job_dir = r.stdout.rsplit("/logs/", 1)[0]
            return deployments.Entry(jid, r.name, job_dir, remote)
    raise HpcserveError(f"job {jid} was not rendered by hpcserve (no job directory found)")
