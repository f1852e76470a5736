"""`hpcserve upgrade`: a serving deployment moved to another engine release (or image) one
instance at a time, without a failed request.

Built on `hpcserve scale` (scale.py): for every instance that serves at the old release, the
front's own and every instance job's, in turn:

  surge:  an instance job of one instance of its role, rendered from the deployment with the
          new release (scale.add), is submitted; it joins the front's router only after its
          readiness and smoke request, and its state.json says "serving" then;
  drain:  the old instance gets a drain request (scale.request): out of the router, its
          in-flight requests finished, then stopped; the upgrade waits until it is "removed".

A surge job that fails, or does not serve in time, is cancelled and the upgrade stops there,
the old instance still serving. Instances already at the new release are skipped, so running
the same upgrade again goes on where it stopped. At the end the front's deployment.yaml holds
the new release, so a later `scale --add` starts it too.

PD: while it runs, old and new prefill and decode instances serve side by side and hand KV
caches to each other, so a change of release is refused unless the engine adapter lists the two
as working together (EngineAdapter.pd_release_groups, which says why it is empty today).
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from typing import Callable

from ..author import config
from . import deployment_jobs, deployments, ops, scale
from .. import engines
from ..errors import HpcserveError
from ..engines.flags import vkey
from ..runtime.contract import SERVING_PHASES, TERMINAL_PHASES
from ..slurm.runner import read_json

SETTABLE = ("engine.version", "engine.image")
POLL_S = 1.0    # s between two looks at a surge job's state


@dataclass(frozen=True)
class Old:
    """One serving instance to replace, and the job that runs it."""

    entry: deployments.Entry
    instance: str
    role: str


def check_sets(sets: tuple[str, ...]) -> None:
    """Only a new release or image: anything else would make the new instances another
    deployment than the one they join."""
    if not sets:
        raise HpcserveError("give the new release: --set engine.version=X (and/or --set "
                            "engine.image=...)")
    for s in sets:
        key = s.partition("=")[0].strip()
        if key not in SETTABLE:
            raise HpcserveError(f"--set {key}: an upgrade changes only {' and '.join(SETTABLE)}"
                                " (everything else stays as the deployment was submitted)")


def release(cfg: config.Resolved) -> tuple[str, str | None]:
    """(engine release, image) a configuration runs."""
    e = cfg.deployment.engine
    return (e.version or engines.get(e.name).matrix.known_versions()[-1],
            e.image or cfg.site.container.image)


def target(f: scale.Front, runner, sets: tuple[str, ...]) -> config.Resolved:
    """The deployment at its new release: refused (one line) for a release the engine adapter
    does not know, no change, or prefill and decode releases that cannot talk to each other."""
    from ..author import plan as planner
    old, new = scale.source_config(f, runner), scale.source_config(f, runner, sets)
    adapter = engines.get(new.deployment.engine.name)
    (v_old, i_old), (v_new, i_new) = release(old), release(new)
    if v_new not in adapter.matrix.known_versions():
        raise HpcserveError(f"{adapter.title} {v_new} is not a release hpcserve knows "
                            f"({adapter.matrix.nearest(v_new)}): an upgrade goes to a release "
                            "whose flags it can check")
    if (v_old, i_old) == (v_new, i_new):
        raise HpcserveError(f"deployment {f.entry.name} (job {f.entry.job_id}) runs "
                            f"{adapter.title} {v_new}{_image(i_new)} already: nothing to upgrade")
    if f.spec.get("autoscale"):
        raise HpcserveError(f"deployment {f.entry.name} (job {f.entry.job_id}) autoscales: its "
                            "slots were rendered at submit at its release and its front submits "
                            "them, so an upgrade cannot replace them; submit a new deployment "
                            "at the new release instead")
    if "prefill" in f.roles and not adapter.pd_talks(v_old, v_new):
        raise HpcserveError(pd_refusal(adapter, v_old, v_new))
    planner.build(new)  # the new release's flags are checked before anything is submitted
    return new


def pd_refusal(adapter, v_old: str, v_new: str) -> str:
    groups = [", ".join(sorted(g, key=vkey)) for g in adapter.pd_release_groups]
    pairs = ("; ".join(f"within {{{g}}}" for g in groups) + ", or " if groups else "") + \
        "one release with itself"
    return (f"a rolling upgrade of a prefill/decode deployment serves {adapter.title} {v_old} "
            f"and {v_new} side by side, and their prefill and decode instances would hand KV "
            f"caches to each other: {adapter.title} supports {pairs} (its docs promise no "
            "transfer across releases); submit a new deployment at the new release instead, "
            "or change only engine.image")


def _image(image: str | None) -> str:
    return f" ({image})" if image else ""


def olds(f: scale.Front, runner, new: config.Resolved) -> list[Old]:
    """Every serving instance of the deployment not at the new release: the front's own first,
    then each instance job's, oldest first."""
    # a renewing instance job's pair: whichever job runs each of its directories now
    jobs = [f.entry] + [j.entry for j in deployment_jobs.jobs_of(f.entry, runner).instances]
    views = {v.job_dir: v for v in ops.status(jobs[1:], lambda _r: runner)} if jobs[1:] else {}
    views[f.entry.job_dir] = f.view
    want = release(new)
    found = []
    for e in jobs:
        v = views[e.job_dir]
        if v.summary_phase not in SERVING_PHASES or _runs(runner, e) == want:
            continue
        mine = sorted((i.get("role", ""), i.get("index", 0), n) for n, i in v.instances.items()
                      if i.get("status") == "serving")
        found += [Old(e, n, role) for role, _, n in mine]
    return found


def _runs(runner, e: deployments.Entry) -> tuple[str | None, str | None]:
    """(release, image) a job was rendered with, from its plan.json."""
    spec = read_json(runner, posixpath.join(e.job_dir, "plan.json")) or {}
    return ((spec.get("engine") or {}).get("version"), (spec.get("container") or {}).get("image"))


def run(f: scale.Front, runner, remote: str | None, new: config.Resolved, todo: list[Old], *,
        drain_timeout: float, start_timeout: float, echo: Callable[[str], None]) -> int:
    """Replace each instance in `todo`, one at a time; 0 once all are, 1 at the first that
    could not be (the deployment still serving, the line saying which and why)."""
    title = engines.get(new.deployment.engine.name).title
    to = f"{title} {release(new)[0]}{_image(release(new)[1])}"
    for k, o in enumerate(todo, 1):
        where = f"{o.instance} of job {o.entry.job_id}"
        sub = scale.add(f, runner, remote, o.role, 1, cfg=new)
        echo(f"[{k}/{len(todo)}] {where}: surge job {sub.job_id} at {to} ({sub.job_dir})")
        why = wait_serving(runner, sub, start_timeout)
        if why:
            ops.cancel(sub.entry, runner, wait=False, echo=lambda _l: None)
            echo(f"upgrade stopped at {where}: its surge job {sub.job_id} {why}; {where} "
                 "still serves")
            return 1
        echo(f"[{k}/{len(todo)}] job {sub.job_id} serves: draining {where}")
        d = scale.Drain(o.entry, o.instance)
        scale.request(runner, [d], drain_timeout)
        if scale.wait_removed(runner, [d], drain_timeout, echo):
            echo(f"upgrade stopped at {where}: not drained (job {sub.job_id} serves beside it)")
            return 1
    path = posixpath.join(f.entry.job_dir, config.SOURCE_FILE)
    scale.write_atomically(runner, path, config.source_text(new.source))
    echo(f"upgraded {len(todo)} instance(s) of {f.entry.name} to {to}; {path} records it")
    return 0


def wait_serving(runner, sub: ops.Submitted, timeout_s: float) -> str | None:
    """None once the surge job serves (registered with the router, after its smoke request);
    else what happened instead."""
    end = time.time() + timeout_s
    while True:
        (v,) = ops.status([sub.entry], lambda _r: runner)
        insts = v.instances.values()
        if v.summary_phase == "serving" and insts and \
                all(i.get("status") == "serving" for i in insts):
            return None
        if v.summary_phase in TERMINAL_PHASES or v.ended:
            return f"ended before it served ({ops.describe(v)})"
        if time.time() >= end:
            return f"did not serve within {timeout_s:g} s ({ops.describe(v)}): cancelled"
        time.sleep(POLL_S)
