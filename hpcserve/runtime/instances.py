"""The engine instances of the deployment: where each one runs (its nodes, by node rank), its
leader (node rank 0, which serves), its health URL and its logs; the spare nodes of each role;
and the router's node.

An instance is placed after discovery and started as one named step; recovery (recovery.py)
starts it again as a new attempt, on its nodes or, where one of them is lost, with a spare in that
node's place (move()). Adding or removing instances while serving would go here too.
"""

from __future__ import annotations

import os
import time

from .failures import PORT_TAKEN, Stop, step_identity
from .logs import first_line, read_from
from .spec import Instance, Spec
from .state import now


class Instances:
    def __init__(self, plan: Spec, job_dir: str):
        self.plan = plan
        self.dir = job_dir
        self.nodes: dict[str, list[list[str]]] = {}  # instance -> [[rank, name, ip, iface, ib]]
        self.heads: dict[str, str] = {}               # instance -> its leader's address
        self.spares: dict[str, list[list[str]]] = {}  # role -> its idle nodes [name, ip, ...]
        self.moved: dict[str, str] = {}               # lost node -> the spare in its place
        self._spare_rows: dict[str, list[list[str]]] = {}
        self.tags: dict[str, str] = {}                # instance -> its attempt's tag
        self.router_node: str | None = None            # known once the router's step starts
        self.router_addr: str | None = None

    @property
    def specs(self) -> list[Instance]:
        return self.plan.instances

    def spec(self, name: str) -> Instance | None:
        """The plan's instance `name`; None for a step of no instance (discovery, the router)."""
        return next((i for i in self.specs if i.name == name), None)

    def place(self, found: dict) -> dict[str, str]:
        """Each instance on its share of its component's discovered nodes; run/<name>.nodes is
        what its launch script reads. Returns each instance's leader address."""
        heads = {}
        for inst in self.specs:
            off = inst.node_offset
            names = found[inst.component][off:off + inst.nodes]
            self._write_nodes(inst.name, [[str(r), *n] for r, n in enumerate(names)])
            heads[inst.name] = names[0][1]
        for role, rec in self.plan.recovery.items():
            first = rec.first_spare
            self.spares[role] = [list(n) for n in
                                 found[rec.component][first:first + rec.spares]]
        self._spare_rows = {r: [list(n) for n in v] for r, v in self.spares.items()}
        self.heads = dict(heads)
        return heads

    def _write_nodes(self, name: str, rows: list[list[str]]) -> None:
        """run/<name>.nodes: what its launch script reads (rank, name, address, ...)."""
        self.nodes[name] = rows
        with open(os.path.join(self.dir, "run", f"{name}.nodes"), "w") as f:
            for row in rows:
                f.write(" ".join(row) + "\n")

    def start(self, steps, name: str, attempt: int = 0) -> None:
        """The instance's named step, on its nodes (attempt N >= 1: a restart)."""
        self.tags[name] = f".attempt{attempt}" if attempt else ""
        steps.start(name, f"steps/{name}.sh", [r[1] for r in self.nodes[name]], self.tags[name])

    def move(self, name: str, lost: set[str]) -> str | None:
        """Put a spare of the instance's role in the place of each of its lost nodes (every
        instance that shared a lost node follows it to the same spare). Returns why it cannot,
        or None once run/<name>.nodes names only nodes that are up."""
        role = self.spec(name).role
        rows = [list(r) for r in self.nodes[name]]
        for row in rows:
            node = row[1]
            if node not in lost:
                continue
            if node not in self.moved:
                if not self.spares.get(role):
                    return f"node {node} is lost and {role} has no spare node left"
                self.moved[node] = self.spares[role].pop(0)[0]
            row[1:] = self._found_row(self.moved[node], role)
        self._write_nodes(name, rows)
        self.heads[name] = rows[0][2]
        return None

    def _found_row(self, node: str, role: str) -> list[str]:
        """A node's discovered line [name, ip, iface, ib], from any placement or spare list."""
        for rows in self.nodes.values():
            for r in rows:
                if r[1] == node:
                    return r[1:]
        return next(list(s) for s in self._spare_rows.get(role, []) if s[0] == node)

    def drop_spare(self, node: str) -> None:
        """A spare that is lost itself is no one's replacement."""
        for role in self.spares:
            self.spares[role] = [s for s in self.spares[role] if s[0] != node]

    def place_router(self, node: list[str]) -> None:
        self.router_node, self.router_addr = node[0], node[1]

    def tasks_per_node(self, name: str) -> int:
        inst = self.spec(name)
        return inst.tasks_per_node if inst is not None else 1

    def leader_node(self, name: str) -> str | None:
        """Where `name` (an instance or the router) serves: its node rank 0."""
        return self.router_node if name == "router" else self.nodes[name][0][1]

    def owns_port(self, name: str, wait: float = 0.0) -> bool:
        """Whether the launch script of `name` (an instance or the router) found its own
        process listening on its port (run/ports/NAME). Raises the port clash it found instead:
        another process, another deployment's on a shared node, holds one of its ports."""
        path = os.path.join(self.dir, "run", "ports", name)
        end = now() + wait
        verdict = read_from(path, 0).strip()
        while not verdict and now() < end:
            time.sleep(0.02)
            verdict = read_from(path, 0).strip()
        if not verdict.startswith("taken "):
            return verdict == "ours"
        port, _, holder = verdict[6:].partition(" by ")
        node = self.leader_node(name)
        raise Stop("failed", f"port {port} on node {node} is taken by {holder}: {name} cannot "
                             "serve there (another deployment on a shared node?)",
                   {**step_identity(name), "node": node, "node_rank": 0,
                    "reason": PORT_TAKEN, "port": int(port), "holder": holder,
                    "exit_code": None})

    @staticmethod
    def health_url(heads: dict, inst: Instance) -> str:
        return f"http://{heads[inst.name]}:{inst.port}{inst.health_path}"

    @staticmethod
    def liveness_url(heads: dict, inst: Instance) -> str:
        """What the liveness probe asks while it serves (an engine may prove generation on
        another path than its readiness)."""
        return f"http://{heads[inst.name]}:{inst.port}{inst.liveness.path}"

    def node_names(self) -> list[str]:
        """Every node the instances run on, and the spares."""
        return sorted({r[1] for rows in self.nodes.values() for r in rows} |
                      {s[0] for rows in self.spares.values() for s in rows})

    def on_node(self, node: str | None) -> tuple[str | None, int | None]:
        """(instance, node rank) of the first instance that runs on `node`."""
        for name, rows in self.nodes.items():
            for r in rows:
                if r[1] == node:
                    return name, int(r[0])
        return None, None

    def using(self, node: str) -> list[str]:
        """Every instance with a rank on `node`."""
        return [n for n, rows in self.nodes.items() if any(r[1] == node for r in rows)]

    def leader_log(self, name: str) -> str:
        """The log of the instance's node rank 0 (its first task's, one task per GPU): where
        its engine says how its start-up goes."""
        return self.log_file(name, 0, self.nodes[name][0][1])

    def log_file(self, name: str, node_rank, node, rank=None) -> str | None:
        """The log a failure of `name` points at: a node's (or an MPI rank's) engine log, the
        router's, or srun's where no node is known."""
        if name == "router":
            return "logs/router.log"
        tag = self.tags.get(name, "")
        if node_rank is None:
            return f"logs/{name}{tag}.srun.log"
        if self.tasks_per_node(name) > 1:
            base = f"logs/{name}{tag}.node{node_rank}.{node}.task"
            if rank is not None:  # the task log whose first line names this rank
                for local in range(64):
                    if f"(rank {rank})" in first_line(os.path.join(self.dir,
                                                                   f"{base}{local}.log")):
                        return f"{base}{local}.log"
            return f"{base}0.log"
        return f"logs/{name}{tag}.node{node_rank}.{node}.log"
