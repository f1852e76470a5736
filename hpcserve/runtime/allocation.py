"""A deployment inside an allocation the user already holds (`hpcserve submit --in-allocation`
from an `salloc` shell or the user's own batch script): what the allocation holds, whether the
deployment fits in it (nodes per role, GPUs and CPUs per node), and which of its nodes each het component of the plan gets.

Rendered for an allocation (plan.json "in_allocation"), the job runs as steps of that job, not
as a heterogeneous job of its own: component k gets the next `nodes` of the allocation's nodes,
in plan order and in the order Slurm lists them (`scontrol show hostnames`), and every step
names its nodes (`--nodelist`) instead of its het group. Spares of a role are nodes of its
component, so recovery takes them from the allocation's nodes too.

Shared by the operator side (checked before anything starts) and the runtime (checked again
before the first step, for a job directory started by hand): stdlib only.
"""

from __future__ import annotations

from typing import NamedTuple

from .contract import SHAPE_VARS, step_prefix  # noqa: F401 - part of this module's API
from .failures import Stop
from .spec import Component, Spec


class Held(NamedTuple):
    """What Slurm says the allocation holds."""
    job_id: str
    state: str
    nodes: list            # host names, in Slurm's order
    gpus_per_node: int | None  # None: the allocation holds no GPU that Slurm counts
    cpus_per_node: int | None = None  # None: Slurm's record does not say


# gpus_asked() to placement_words() serve `hpcserve submit --in-allocation` too, which reads
# the plan it renders through the same view (spec.Spec of plan_json.job_spec).

def gpus_asked(component: Component) -> int:
    """GPUs per node that the component's #SBATCH directives ask Slurm for (0: none)."""
    for key, value in component.directives:
        if key == "gpus-per-node" and value:
            return int(str(value).rsplit(":", 1)[-1])
        if key == "gres" and value:
            for g in str(value).split(","):
                parts = g.split(":")
                if parts[0] == "gpu" and parts[-1].isdigit():
                    return int(parts[-1])
    return 0


def cpus_asked(component: Component) -> int:
    """CPUs per node that the component's engine asks for (its #SBATCH cpus-per-task times
    ntasks-per-node; 0: none asked): each of its steps asks srun for as many."""
    d = {k: v for k, v in component.directives}
    per_task = int(d.get("cpus-per-task") or 0)
    return per_task * int(d.get("ntasks-per-node") or 1)


def needs(plan: Spec) -> list[tuple[str, int]]:
    """(component name, nodes) in plan order: what the deployment takes of the allocation
    (a role's spare nodes are nodes of its component)."""
    return [(c.name, int(c.nodes)) for c in plan.components]


def misfit(plan: Spec, held: Held) -> str | None:
    """Why the deployment does not fit in the allocation, with the numbers; None when it fits."""
    want = needs(plan)
    total = sum(n for _, n in want)
    per_role = ", ".join(f"{name} {n}" for name, n in want)
    if total > len(held.nodes):
        return (f"the deployment needs {total} node(s) ({per_role}) and allocation "
                f"{held.job_id} holds {len(held.nodes)} ({','.join(held.nodes)})")
    gpus = max((gpus_asked(c) for c in plan.components), default=0)
    if gpus and (held.gpus_per_node or 0) < gpus:
        asked = ", ".join(f"{c.name} {gpus_asked(c)}" for c in plan.components
                          if gpus_asked(c))
        return (f"the deployment needs {gpus} GPU(s) per node ({asked}) and allocation "
                f"{held.job_id} holds {held.gpus_per_node or 0} per node")
    cpus = max((cpus_asked(c) for c in plan.components), default=0)
    if cpus and held.cpus_per_node is not None and held.cpus_per_node < cpus:
        asked = ", ".join(f"{c.name} {cpus_asked(c)}" for c in plan.components
                          if cpus_asked(c))
        return (f"the deployment needs {cpus} CPU(s) per node ({asked}) and allocation "
                f"{held.job_id} holds {held.cpus_per_node} per node")
    return None


def node_map(plan: Spec, hosts: list) -> dict[int, list]:
    """component index -> its nodes: consecutive runs of the allocation's nodes, in plan order.
    The nodes past the deployment's stay unused."""
    out, at = {}, 0
    for c in plan.components:
        out[c.index] = list(hosts[at:at + int(c.nodes)])
        at += int(c.nodes)
    if at > len(hosts):
        raise ValueError(f"{at} node(s) needed, {len(hosts)} held")
    return out


def placement_words(plan: Spec, nodes: dict) -> str:
    """"prefill on node3; decode on node4": where node_map put each component."""
    return "; ".join(f"{c.name} on {','.join(nodes[c.index])}" for c in plan.components)


def own_steps(plan: Spec, ids: dict) -> dict:
    """Slurm's step ids by step name (`squeue --steps`), keeping only the deployment's steps,
    under the names the runtime gives them (without step_prefix)."""
    pre = step_prefix(plan.name, plan.in_allocation)
    return {k[len(pre):]: v for k, v in ids.items() if k.startswith(pre)} if pre else ids


# `hpcserve preflight --in-allocation`: as long as a preflight job of its own (plan.py
# PREFLIGHT_TIME), not the allocation's time limit.
PREFLIGHT_SECONDS = 600
# How often the supervisor asks the allocation's time limit again: allocations held for days are
# often extended (`scontrol update JobId=... TimeLimit=...`) while the deployment serves.
REREAD_SECONDS = 300


# --------------------------------------------------------------------- what Slurm says it holds

def gpus_per_node(rec: dict) -> int | None:
    """GPUs per node from the record's TRES (gres/gpu=N over NumNodes); None without GPUs."""
    return _per_node(rec, "gres/gpu")


def cpus_per_node(rec: dict) -> int | None:
    """CPUs per node from the record's TRES (cpu=N over NumNodes; the record gives only the
    total: where the nodes got different counts, their mean)."""
    return _per_node(rec, "cpu")


def _per_node(rec: dict, key: str) -> int | None:
    tres = dict(kv.split("=", 1) for kv in (rec.get("TRES") or rec.get("AllocTRES") or
                                            "").split(",") if "=" in kv)
    total = tres.get(key)
    nodes = int(rec.get("NumNodes", "0").split("-")[0] or 0)
    if not total or not total.isdigit() or not nodes:
        return None
    return int(total) // nodes


def held(job_id: str, ask) -> Held:
    """What Slurm says allocation `job_id` holds: its state, nodes (`scontrol show hostnames`,
    in Slurm's order) and GPUs per node. `ask(argv)` runs a Slurm command and returns its
    output (it raises with Slurm's words where the command fails)."""
    # here, not at the top: the renderer imports this module for its names alone, and the
    # parsers cost every `hpcserve render` their import time for nothing
    from .slurm_scontrol import parse_scontrol_fields
    recs = parse_scontrol_fields(ask(["scontrol", "-o", "show", "job", job_id]))
    if len(recs) != 1:
        raise ValueError(f"job {job_id} is a heterogeneous job ({len(recs)} components): a "
                         "deployment runs inside an allocation of one component")
    rec = recs[0]
    hosts = ask(["scontrol", "show", "hostnames", rec.get("NodeList", "")]).split()
    return Held(job_id, rec.get("JobState", "?"), hosts, gpus_per_node(rec), cpus_per_node(rec))


# ------------------------------------------------------------------------------ in the job

class InAllocation:
    """The job's side: its components' nodes in the allocation, and the allocation's end (no
    --signal=B:TERM@grace reaches a process the user started: the job stops itself in time)."""

    def __init__(self, job):
        self.job = job
        self.active = bool(job.plan.in_allocation)
        self.nodes: dict[int, list] = {}   # component index -> its nodes
        self.end: float | None = None       # when the allocation's time limit ends it
        self.cap: float | None = None       # a preflight's own end (PREFLIGHT_SECONDS)
        self.asked = 0.0                    # when the time limit was last asked

    def place(self, now: float) -> None:
        """Each component's share of the allocation's nodes, checked to fit first (again: a
        job directory may be started by hand)."""
        if not self.active:
            return
        job = self.job
        try:
            have = held(job.job_id, job.slurm.run)
            left = job.slurm.time_left()
        except Exception as e:  # noqa: BLE001 - Slurm's words, whatever failed
            raise Stop("failed", f"allocation {job.job_id or '(none)'}: {e}") from None
        plan = job.plan
        why = misfit(plan, have)
        if why:
            raise Stop("failed", why)
        self.nodes = node_map(plan, have.nodes)
        if job.plan.preflight.only:
            self.cap = now + PREFLIGHT_SECONDS
        self._set_end(now, left)
        job.log(f"in allocation {job.job_id}: {placement_words(plan, self.nodes)}")

    def env(self, component: int) -> dict:
        """The environment a step script of `component` needs (its nodes), {} in a het job."""
        return {"NODELIST": ",".join(self.nodes[component])} if self.active else {}

    def srun_args(self, component: Component) -> list:
        """How a step the runtime spells itself finds its component's nodes."""
        if self.active:
            return [f"--jobid={self.job.job_id}",
                    f"--nodelist={','.join(self.nodes[component.index])}"]
        return [f"--het-group={component.index}"] if len(self.job.plan.components) > 1 \
            else []

    def _set_end(self, now: float, left: int | None) -> None:
        self.asked = now
        end = now + left if left is not None else None
        self.end = min(e for e in (end, self.cap) if e is not None) \
            if end is not None or self.cap is not None else None

    def time_is_up(self, now: float) -> bool:
        """Whether the allocation (or a preflight's ten minutes) ends within the plan's
        signal_grace: time to stop. The time limit is asked again every REREAD_SECONDS (an
        extension moves the end; a failed ask keeps the last answer)."""
        if not self.active:
            return False
        if now - self.asked >= REREAD_SECONDS:
            try:
                self._set_end(now, self.job.slurm.time_left())
            except Exception as e:  # noqa: BLE001 - Slurm's words; the last end holds
                self.asked = now
                self.job.log(f"asking allocation {self.job.job_id}'s time limit failed: {e}")
        return self.end is not None and now >= self.end - float(self.job.plan.signal_grace)
