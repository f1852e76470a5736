"""`hpcserve plan`: the plan as text a person reads before spending GPU hours.

`plan_text`: the topology (one row per instance) and each instance's command once, in the lines
of its launch script (launch/<instance>.sh: one option per line, what differs per node as the
script's own shell variables, "${NODE_RANK}"), all within WIDTH columns. `plan_argv`: every
node's full command line, one row per node, with the per-node values filled in.
"""

from __future__ import annotations

import re
import textwrap

from .plan import Plan
from .words import Var, argv_lines, show

WIDTH = 100   # a terminal's width the text fits in (tests/unit/test_plan_text.py holds it to it)

# What each variable of a launch script's command holds (the script reads them on the node).
VARIABLES = {
    "NODE_RANK": "the node's rank in its instance (0: the leader)",
    "NODE_IP": "the node's address",
    "LEADER_IP": "the address of the instance's node rank 0",
    "NODE_IFACE": "the network interface of that address",
    "IB_DEVICES": "the node's InfiniBand devices",
    "IB_PORTS": "the same as device:port",
    "JOB_DIR": "the job directory",
}


def _header_parts(p: Plan) -> list[str]:
    return [f"deployment {p.name}: {'simulated ' if p.simulate else ''}{p.engine_title} "
            f"{p.version}", f"profile {p.profile}", f"{p.total_nodes} nodes",
            f"time limit {p.time_limit}"]


def _header(p: Plan) -> str:
    return ", ".join(_header_parts(p))


def _header_lines(p: Plan) -> list[str]:
    """The header within WIDTH, broken between its parts, never inside one."""
    lines = [""]
    for part in _header_parts(p):
        if lines[-1] and len(lines[-1]) + 2 + len(part) > WIDTH:
            lines[-1] += ","
            lines.append("  " + part)
        else:
            lines[-1] += (", " if lines[-1] else "") + part
    return lines


def _span(first: int, count: int) -> str:
    return str(first) if count == 1 else f"{first}-{first + count - 1}"


def _ports(i) -> str:
    return ",".join([str(i.port)] + [f"{k}={v}" for k, v in i.port_labels if k != "http"])


def columns(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows with every column padded to its widest cell, trailing spaces cut."""
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def topology(p: Plan) -> list[str]:
    """One row per instance, the router and each idle node: where it runs and its ports."""
    rows = [("comp", "nodes", "role", "instance", "node ranks", "GPUs/node", "ports")]
    for c in p.components:
        used = set()
        for i in p.instances_of(c.index):
            used.update(range(i.node_offset, i.node_offset + i.nodes))
            rows.append((str(c.index), _span(i.node_offset, i.nodes), i.role, str(i.index),
                         _span(0, i.nodes), str(i.gpus_per_node), _ports(i)))
        if p.router and p.router.component == c.index:
            used.add(p.router.node_offset)
            rows.append((str(c.index), str(p.router.node_offset), "router", "-", "-", "-",
                         f"{p.router.port},metrics={p.router.prometheus_port}"))
        rows += [(str(c.index), str(n), "(idle)", "-", "-", "-", "-")
                 for n in range(c.nodes) if n not in used]
    return columns(rows)


_SHELL_WORD = re.compile(r"""(?:'[^']*'|"(?:[^"\\]|\\.)*"|[^\s'"])+""")


def _fold(line: str, indent: str, last: bool) -> list[str]:
    """One option line of a command block, with its ` \\` continuation; an option whose values
    pass WIDTH continues on lines of its own (a single word longer than that stays whole)."""
    tail = "" if last else " \\"
    if len(indent) + len(line) + len(tail) <= WIDTH:
        return [indent + line + tail]
    # Break only between shell words: a space inside a quoted value ('{"a": 1}') is not a place
    # to put a ` \`, or the command shown could not be copied and run.
    words = _SHELL_WORD.findall(line)
    out, cur = [], indent + words[0]
    for w in words[1:]:
        if len(cur) + 1 + len(w) + 2 > WIDTH:
            out.append(cur + " \\")
            cur = indent + "  " + w
        else:
            cur += " " + w
    return out + [cur + tail]


def command_block(lines: list[str]) -> list[str]:
    """A command as the launch script writes it: the program, then one option per line."""
    out = []
    for k, line in enumerate(lines):
        out += _fold(line, "  " if k == 0 else "    ", k == len(lines) - 1)
    return out


def _engine(p: Plan) -> list:
    if p.simulate:
        return [p.engine_python, (Var("JOB_DIR"), "/hpcserve_sim.py")]
    return list(p.engine_command)


def _used_vars(words) -> list[str]:
    seen: dict[str, None] = {}
    for w in words:
        for part in w if isinstance(w, tuple) else ():
            if isinstance(part, Var):
                seen.setdefault(part.name)
    return list(seen)


def _legend(names: list[str]) -> list[str]:
    """What the commands' variables hold, known only on the node (the launch script sets them)."""
    head = "commands, as launch/<instance>.sh runs them on each node of the instance"
    if not names:
        return [head + ":"]
    rows = []
    for n in names:
        role, _, k = n.partition("_")
        per_role = n.endswith("_IP") and k[:-3].isdigit()
        rows.append((f"  ${n}", VARIABLES.get(n) or (
            f"the address of {role.lower()}-{k[:-3]}'s node rank 0" if per_role
            else "set by the launch script")))
    return [head + ", which sets:", *columns(rows)]


def commands(p: Plan) -> list[str]:
    """Each instance's command once, and the router's, with a legend of their variables."""
    blocks, words = [], []
    for i in p.instances:
        cmd = _engine(p)
        words += [*cmd, *i.argv]
        blocks.append(f"\n{i.name} (component {i.component}, node{'s' if i.nodes > 1 else ''} "
                      f"{_span(i.node_offset, i.nodes)}):")
        blocks += _command(cmd, i.argv, i.name)
        for rank, extra in enumerate(i.rank_argv):
            words += list(extra)
            added = " ".join(show(w) for w in extra) or "(nothing)"
            blocks += _fold(f"node rank {rank} adds: {added}", "    ", True)
    if p.router:
        r = p.router
        words += [*r.command, *r.argv]
        blocks.append(f"\nrouter: {r.name} (component {r.component}, node {r.node_offset}):")
        blocks += _command(list(r.command), r.argv, r.name)
    return _legend(_used_vars(words)) + blocks


def _command(cmd: list, argv: tuple, what: str) -> list[str]:
    """The command as its launch script runs it: a secret argument is off its command line
    (render.secret_argv), and said under it by its variable's name."""
    from .render import secret_words
    kept, named = secret_words(argv, what)
    secrets = [f"    {flag}: ${{{var}}}, handed to it in the process, not on its command line"
               for flag, var in zip(named[::2], named[1::2])]
    return command_block(argv_lines(cmd, kept)) + secrets


def _wrapped(prefix: str, items) -> list[str]:
    out = []
    for it in items:
        out += textwrap.wrap(f"{prefix}{it}", WIDTH, subsequent_indent="  ",
                             break_on_hyphens=False)
    return out


def fit_lines(p: Plan) -> list[str]:
    from .fit import fit_table
    out = []
    for line in fit_table(list(p.fits)) if p.fits else []:
        lead = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, WIDTH, subsequent_indent=lead + "    ",
                             break_on_hyphens=False)
    return out


def plan_text(p: Plan) -> str:
    """`hpcserve plan`: topology, each instance's command once, notes, the fit (the warnings
    go to stderr first, before it)."""
    return "\n".join([*_header_lines(p), *topology(p), "", *commands(p), "",
                      *_wrapped("note: ", p.notes),
                      *fit_lines(p)]).rstrip("\n")


def plan_argv(p: Plan) -> str:
    """`hpcserve plan --argv`: one row per node with its whole command line, the per-node
    values filled in (<role><node> for an address known only at run time)."""
    from .fit import fit_table
    out = [_header(p)]
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
                cmd = " ".join(show(w, vals) for w in i.argv + (i.rank_argv[rank]
                                                                if i.rank_argv else ()))
                rows.append((str(c.index), str(n), i.role, str(i.index), str(rank),
                             _ports(i) if rank == 0 else "-", cmd))
            if p.router and p.router.component == c.index and n == p.router.node_offset:
                vals = {f"{i.role.upper()}_{i.index}_IP": f"<{i.role}{i.node_offset}>"
                        for i in p.instances}
                rows.append((str(c.index), str(n), "router", "-", "-", str(p.router.port),
                             p.router.name + " " + " ".join(show(w, vals) for w in p.router.argv)))
    out += columns(rows)
    out += [f"note: {n}" for n in p.notes]
    out += fit_table(list(p.fits)) if p.fits else []
    return "\n".join(out)
