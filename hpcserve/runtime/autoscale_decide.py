"""The autoscaler's rule (runtime/autoscale.py), pure: a role's capacity and decide(), what it
adds or removes given the slots' states and the signal read; and signal_value(), that signal as
one instance's Prometheus gauges give it.

Apart from the Autoscaler (the front's loop that submits, drains and records) so that the rule
reads, and is tested, on its own (tests/unit/test_autoscale_decide.py).
"""

from __future__ import annotations

from .contract import KV_USAGE
from .probes import samples, scrape
from .spec import AutoscaleRole


def signal_value(url: str, kind: str, names: list, timeout: float,
                 auth: dict | None = None) -> float | None:
    """The instance's signal from its Prometheus text at `url` (its gauges URL: one label set
    per scheduler), asked with the deployment's key `auth`: the sum of the named gauges over
    every label set (requests), or for kv_usage their largest (a share of each scheduler's
    pool: the fullest decides); None where it does not answer."""
    text = scrape(url, timeout, auth)
    if text is None:  # a bad reply: not read this round
        return None
    got = samples(text, names)
    if kind == KV_USAGE:
        return max(got, default=0.0)
    return sum(got)


COMING = ("submitting", "pending", "starting", "serving")   # a slot's job counted as capacity


def capacity(own: int, slot_statuses: list) -> int:
    """The role's capacity: its own kept instances, plus each slot whose job is on its way or
    serving, once whatever stage it is at (a pending slot is never asked for twice)."""
    return own + sum(1 for st in slot_statuses if st in COMING)


def decide(spec: AutoscaleRole, own: int, slots: list, values: list, at: float,
           last_at: float) -> tuple | None:
    """The role's next step: ("add" | "remove", slot name, why), or None. Pure: `spec` is
    plan.json's autoscale[role], `own` the front's own kept, not failed instances, `slots`
    (name, status, submitted at) in slot order, `values` the signal of each serving instance
    (None where one did not answer), `at` the time now and `last_at` the last decision's.

    Within cool_down_s of the last decision: nothing. Below min: add, whatever the signal (or
    none read). Above target per instance and below max: add. Remove only when one instance
    fewer would still read below target, above min, every instance read (one that did not
    answer may be the busy one), and then the newest serving slot first."""
    if at < last_at + spec.cool_down_s:
        return None
    cap = capacity(own, [st for _, st, _ in slots])
    free = [name for name, st, _ in slots if st == "free"]
    if free and cap < spec.min:
        return "add", free[0], f"{cap} instance(s), below min {spec.min}"
    read = [v for v in values if v is not None]
    if not read:
        return None
    total, kind, target = sum(read), spec.signal.kind, spec.target
    if free and cap < spec.max and total / max(cap, 1) > target:
        return "add", free[0], (f"{kind} {round(total / max(cap, 1), 3):g} per instance > "
                                f"target {target:g}")
    serving = [(t, i, name) for i, (name, st, t) in enumerate(slots) if st == "serving"]
    if serving and len(read) == len(values) and cap > max(spec.min, 1) and \
            total / (cap - 1) < target:
        return "remove", max(serving)[2], (f"{kind} {round(total / (cap - 1), 3):g} per "
                                           f"instance with one fewer < target {target:g}")
    return None
