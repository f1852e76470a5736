"""The engine instances of the deployment: where each one runs (its nodes, by node rank), its
leader (node rank 0, which serves), its health URL and its logs; and the router's node.

An instance's lifecycle lives here. Today it is placed once, after discovery, and started as one
named step; any failure ends the deployment. The next steps of its lifecycle go here, beside
place() and start():
- replacing one instance: take it out of the router (its worker API), stop its step, start it
  again on its nodes or on a spare, wait for its leader's health, smoke-test it, put it back;
- adding or removing an instance while serving: place it on nodes of a job of its own, start it,
  register it with the router; deregister, stop.
"""

from __future__ import annotations

import os

from .logs import first_line


class Instances:
    def __init__(self, plan: dict, job_dir: str):
        self.plan = plan
        self.dir = job_dir
        self.nodes: dict[str, list[list[str]]] = {}  # instance -> [[rank, name, ip, iface, ib]]
        self.router_node: str | None = None            # known once the router's step starts
        self.router_addr: str | None = None

    @property
    def specs(self) -> list[dict]:
        return self.plan["instances"]

    def spec(self, name: str) -> dict:
        return next((i for i in self.specs if i["name"] == name), {})

    def place(self, found: dict) -> dict[str, str]:
        """Each instance on its share of its component's discovered nodes; run/<name>.nodes is
        what its launch script reads. Returns each instance's leader address."""
        heads = {}
        for inst in self.specs:
            off = inst["node_offset"]
            names = found[inst["component"]][off:off + inst["nodes"]]
            rows = [[str(r), *n] for r, n in enumerate(names)]
            self.nodes[inst["name"]] = rows
            with open(os.path.join(self.dir, "run", f"{inst['name']}.nodes"), "w") as f:
                for row in rows:
                    f.write(" ".join(row) + "\n")
            heads[inst["name"]] = names[0][1]
        return heads

    def start(self, steps, name: str) -> None:
        """The instance's named step, on its nodes."""
        steps.start(name, f"steps/{name}.sh", [r[1] for r in self.nodes[name]])

    def place_router(self, node: list[str]) -> None:
        self.router_node, self.router_addr = node[0], node[1]

    def tasks_per_node(self, name: str) -> int:
        return self.spec(name).get("tasks_per_node", 1)

    def leader_node(self, name: str) -> str | None:
        """Where `name` (an instance or the router) serves: its node rank 0."""
        return self.router_node if name == "router" else self.nodes[name][0][1]

    @staticmethod
    def health_url(heads: dict, inst: dict) -> str:
        return f"http://{heads[inst['name']]}:{inst['port']}{inst['health_path']}"

    def node_names(self) -> list[str]:
        return sorted({r[1] for rows in self.nodes.values() for r in rows})

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

    def log_file(self, name: str, node_rank, node, rank=None) -> str | None:
        """The log a failure of `name` points at: a node's (or an MPI rank's) engine log, the
        router's, or srun's where no node is known."""
        if name == "router":
            return "logs/router.log"
        if node_rank is None:
            return f"logs/{name}.srun.log"
        if self.tasks_per_node(name) > 1:
            base = f"logs/{name}.node{node_rank}.{node}.task"
            if rank is not None:  # the task log whose first line names this rank
                for local in range(64):
                    if f"(rank {rank})" in first_line(os.path.join(self.dir,
                                                                   f"{base}{local}.log")):
                        return f"{base}{local}.log"
            return f"{base}0.log"
        return f"logs/{name}.node{node_rank}.{node}.log"
