"""The slot jobs of a deployment (roles.<role>.autoscale): submitted by its front job while it
serves, so the login node's index never saw them; `hpcserve status` and `cancel` read them from
the front's state.json (runtime/autoscale.py)."""

from __future__ import annotations

from . import deployments, ops, renewals


def slot_jobs(front, runner) -> list:
    """The slot jobs the front's orchestrator submitted that have not ended
    (deployments.Entry each, with `front` set), from its state.json autoscale record; a
    renewing slot's by the jobs its pair runs now (renewals.current: a successor submitted
    since the front last wrote its state.json too)."""
    got = (ops.job_state(runner, front.job_dir).get("autoscale") or {})
    out = []
    for role in got.values():
        for name, s in sorted((role.get("slots") or {}).items()):
            if s.get("job_id") and s.get("status") != "free":
                out.append(deployments.new_entry(
                    s["job_id"], f"{front.name}-{name}", s["dir"], front.remote,
                    front.cluster, front=front.job_dir))
    return renewals.current(out, runner)


def with_slot_jobs(entries: list, runner_of) -> list:
    """`entries` and, after each front among them, its slot jobs not listed already."""
    out = list(entries)
    dirs = {e.job_dir for e in entries}
    for e in entries:
        if not e.front:
            out += [s for s in slot_jobs(e, runner_of(e.remote)) if s.job_dir not in dirs]
    return out
