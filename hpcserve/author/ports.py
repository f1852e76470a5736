"""The ports a plan binds, and the choice of a port block clear of others: pure, used by the
submission (ops.py), `hpcserve scale` and the autoscale slots (autoscale.py) alike."""

from __future__ import annotations


def plan_ports(p) -> set[int]:
    """The ports a plan binds: its engines' and its router's."""
    r = {p.router.port, p.router.prometheus_port} if p.router else set()
    return {i.port for i in p.instances} | {port for i in p.instances for _, port in i.ports} | r


def least_clashing(candidates, used: set[int]) -> tuple:
    """(plan, shift) of the first (shift, plan) of `candidates` (a lazy iterable: each plan is
    built only if asked for) whose ports clear `used`, or else of the one that clashes least."""
    best = None
    for shift, q in candidates:
        left = len(used & plan_ports(q))
        if best is None or left < best[2]:
            best = (q, shift, left)
        if not left:
            break
    return best[0], best[1]


def clear_ports(plan_at, seq: int, taken: set[int], step: int, shifts: int):
    """An instance job's own port block: its deployment's ports moved by seq x `step` (so two
    instance jobs on one node, or one beside the front's engines, differ), or by the next
    multiple (up to `shifts` - 1) that clears every port `taken`; the one that clashes least
    where none clears."""
    n = shifts - 1
    moves = [((seq - 1 + k) % n + 1) * step for k in range(n)]
    return least_clashing(((s, plan_at(s)) for s in moves), taken)[0]
