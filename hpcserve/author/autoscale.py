"""roles.<role>.autoscale: a role's spare capacity, rendered ahead of time.

The job runs no hpcserve (only its own runtime), so every instance job it may submit later is
planned here, at submit: per autoscaled role, one instance job of one instance ("slot") for each
instance the role may have beyond the front's own (max - instances), each with a port block
clear of the front's and of the other slots', rendered under <front job dir>/scale/<role>-s<k>/
(render.py). The front's orchestrator (runtime/autoscale.py) submits a slot with sbatch when the
load asks for one and drains it when the load no longer does. A slot's attach names the front's
router by the front's state.json: the router's address is known only once the front serves.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, replace

from .ports import plan_ports
from ..runtime.contract import AUTOSCALE_SIGNALS, CANNOT_ADD, SCALE_DIR

SLOT_PREFIX = "s"   # <role>-s<k>: a slot, beside `hpcserve scale`'s <role>-<seq>


@dataclass(frozen=True)
class RoleScaling:
    """One autoscaled role of a plan: its bounds, what it reads, and its slots' plans."""

    min: int
    max: int
    signal: str                  # runtime.contract.AUTOSCALE_SIGNALS
    metrics: tuple[str, ...]     # the engine's metric names of that signal
    target: float
    cool_down_s: float
    interval_s: float
    drain_timeout_s: float
    slots: tuple = ()            # (slot name, plan.Plan) each
    twins: tuple = ()            # with renew: each slot's twin (<slot name>b, plan.Plan)


def slot_name(role: str, k: int) -> str:
    return f"{role}-{SLOT_PREFIX}{k}"


def slot_dir(front_dir: str, name: str) -> str:
    """A slot's job directory: <front job dir>/scale/<name>."""
    return posixpath.join(front_dir.rstrip("/") or "/", SCALE_DIR, name)


def signal_metrics(metrics, signal: str) -> tuple[str, ...]:
    """The engine's metric names for `signal` (engines.base.Metrics; () where it has none)."""
    if metrics is None:
        return ()
    # the Metrics fields in AUTOSCALE_SIGNALS' order: queued, running (pending), kv_usage
    return tuple(dict(zip(AUTOSCALE_SIGNALS, (metrics.queued, metrics.pending,
                                               metrics.kv_usage)))[signal])


def with_slots(cfg, front, err, instance_plans):
    """`front` (plan.Plan of the deployment) with its autoscaled roles' slots planned (each by
    the planner's `instance_plans`, as `hpcserve scale` plans an instance job: with renew:, a
    pair); the front itself unchanged where no role autoscales. Refuses (`err`: a ConfigError
    at the role's autoscale key) bounds the role's instances break, a signal the engine does
    not expose and a router that cannot take a worker while it runs."""
    from .config import duration_s
    scaled = {r: v.autoscale for r, v in cfg.deployment.roles.items() if v.autoscale}
    if not scaled:
        return front
    taken = plan_ports(front)
    out = {}
    for role, a in sorted(scaled.items()):
        _check(cfg, front, role, a, err)
        slots, twins = [], []
        for k in range(1, a.max - cfg.deployment.roles[role].instances + 1):
            (first, *twin) = instance_plans(cfg, role, 1, k, slot_attach(front), taken,
                                            label=f"{SLOT_PREFIX}{k}")
            for _, p in (first, *twin):
                taken |= plan_ports(p)
            slots.append(first)
            twins += twin
        out[role] = RoleScaling(a.min, a.max, a.signal, signal_metrics(front.metrics, a.signal),
                                a.target, duration_s(a.cool_down), a.interval,
                                a.drain_timeout, tuple(slots), tuple(twins))
    return replace(front, autoscale=out)


def slot_attach(front) -> dict:
    """plan.json attach of a slot: the router's address and the front's job id and directory
    are filled in later (front_job_dir by the render, the others by the slot's runtime from
    the front's state.json)."""
    r = front.router
    return {"router_url": None, "workers_api": r.workers_api, "api_key_env": r.api_key_env,
            "front_job_id": None, "front_job_dir": None, "deployment": front.name}


def _check(cfg, front, role: str, a, _err) -> None:
    n = cfg.deployment.roles[role].instances
    at = ("roles", role, "autoscale")
    # instances 0: the slots are the role's only instances (plan._front_holds: min >= 1)
    if n and not a.min <= n <= a.max:
        key, bound = ("min", "at most") if a.min > n else ("max", "at least")
        raise _err(cfg, at + (key,), f"must be {bound} roles.{role}.instances ({n}), got "
                                     f"{getattr(a, key)}")
    if not signal_metrics(front.metrics, a.signal):
        raise _err(cfg, at + ("signal",), f"{front.engine_title} exposes no {a.signal} metric "
                                          "hpcserve reads; this engine's signals: " + (", ".join(
                                              s for s in AUTOSCALE_SIGNALS
                                              if signal_metrics(front.metrics, s)) or "none"))
    r = front.router
    if r is None:
        raise _err(cfg, at, "autoscaled instances join the deployment's router: "
                            "router.enabled must be true")
    if r.workers_api in CANNOT_ADD:
        raise _err(cfg, at, f"{r.name} cannot add a worker while it runs ({r.workers_api}: "
                            f"{CANNOT_ADD[r.workers_api]})")

