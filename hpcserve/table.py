"""`hpcserve plan`: the plan as a table a person reads before spending GPU hours."""

from __future__ import annotations

from .plan import Plan
from .words import show


def plan_table(p: Plan) -> str:
    out = [f"deployment {p.name}: {'simulated ' if p.simulate else ''}{p.engine_title} {p.version}, "
           f"profile {p.profile}, {p.total_nodes} nodes, time limit {p.time_limit}"]
    rows = [("comp", "node", "role", "instance", "rank", "ports", "command")]
    for c in p.components:
        for n in range(c.nodes):
            here = [i for i in p.instances_of(c.index)
                    if i.node_offset <= n < i.node_offset + i.nodes]
            if not here and not (p.router and p.router.component == c.index and n == 0):
                rows.append((str(c.index), str(n), c.name, "-", "-", "-", "(idle)"))
            for i in here:
                rank = n - i.node_offset
                vals = {"NODE_RANK": str(rank), "NODE_IP": f"<{c.name}{n}>",
                        "LEADER_IP": f"<{c.name}{i.node_offset}>",
                        "IB_DEVICES": "<ib>", "NODE_IFACE": "<iface>"}
                ports = ",".join([str(i.port)] + [f"{k}={v}" for k, v in i.port_labels if k != "http"])
                cmd = " ".join(show(w, vals) for w in i.argv + (i.rank_argv[rank]
                                                                if i.rank_argv else ()))
                rows.append((str(c.index), str(n), i.role, str(i.index), str(rank),
                             ports if rank == 0 else "-", cmd))
            if p.router and p.router.component == c.index and n == p.router.node_offset:
                vals = {f"{i.role.upper()}_{i.index}_IP": f"<{i.role}{i.node_offset}>"
                        for i in p.instances}
                rows.append((str(c.index), str(n), "router", "-", "-", str(p.router.port),
                             p.router.name + " " + " ".join(show(w, vals) for w in p.router.argv)))
    widths = [max(len(r[k]) for r in rows) for k in range(6)]
    for r in rows:
        out.append("  ".join(r[k].ljust(widths[k]) for k in range(6)) + "  " + r[6])
    for n in p.notes:
        out.append(f"note: {n}")
    return "\n".join(out)
