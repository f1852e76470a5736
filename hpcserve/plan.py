"""The planner: roles -> het-job components -> instances -> nodes, ports and argv.

Pure: takes a validated `Resolved` config, returns an immutable `Plan`. Every number the job
needs (node counts, ranks per instance, ports, parallel sizes) is computed here in Python, so the
templates only loop over the plan and the batch shell does no arithmetic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .config import FromEnv, Resolved, merged_settings
from .engines import sglang
from .errors import ConfigError
from .words import Var, Word
from .yamlsrc import format_path

ENGINE_PORT = 30000
BOOTSTRAP_PORT = 8998
DIST_INIT_PORT = 5757
NCCL_PORT = 31000


# #SBATCH options the plan itself writes: an extra directive repeating one would silently win.
OWNED_DIRECTIVES = {
    "job-name": "name", "output": "the job directory's logs/", "error": "the job directory's logs/",
    "signal": "site.slurm.signal_grace", "requeue": "requeue", "no-requeue": "requeue",
    "time": "time_limit", "nodes": "roles.<role>.nodes and instances",
    "ntasks": "one task per node", "ntasks-per-node": "one task per node",
    "partition": "site.slurm.partition", "account": "site.slurm.account",
    "qos": "site.slurm.qos", "constraint": "site.slurm.constraint",
    "reservation": "site.slurm.reservation", "exclusive": "site.slurm.exclusive",
    "gres": "site.slurm.gres", "gpus-per-node": "site.node.gpus and site.slurm.request_gpus",
    "gpus": "site.node.gpus", "mem": "site.slurm.mem", "hetjob": "the roles",
    "packjob": "the roles", "export": "(the job relies on the submitting environment)",
}


@dataclass(frozen=True)
class Component:
    index: int
    name: str
    nodes: int
    directives: tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class Instance:
    role: str
    index: int
    component: int
    node_offset: int      # first node of the instance within its component
    nodes: int
    gpus_per_node: int    # GPUs the instance uses on each of its nodes
    gpu_ids: str | None   # CUDA_VISIBLE_DEVICES when instances share a node
    port: int
    bootstrap_port: int | None
    dist_init_port: int
    nccl_port: int | None
    tp: int
    attn_dp: int | None
    ep: int | None
    argv: tuple[Word, ...]
    env: tuple[tuple[str, Word], ...]
    fault: Any = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"


@dataclass(frozen=True)
class RouterPlan:
    component: int
    node_offset: int
    port: int
    prometheus_port: int
    argv: tuple[Word, ...]
    env: tuple[tuple[str, Word], ...]
    pd: bool
    api_key_env: str | None = None


@dataclass(frozen=True)
class Plan:
    name: str
    engine: str
    version: str
    simulate: bool
    profile: str
    model_path: str
    served_name: str
    components: tuple[Component, ...]
    instances: tuple[Instance, ...]
    router: RouterPlan | None
    time_limit: str
    signal_grace: int
    container: Any
    image: str | None
    interface: str
    ib_devices: Any
    site_python: str
    engine_python: str
    router_python: str
    readiness: Any
    jobs_dir: str
    requeue: int
    secret_env: tuple[str, ...] = ()
    sim: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def pd(self) -> bool:
        return any(i.role == "prefill" for i in self.instances)

    @property
    def total_nodes(self) -> int:
        return sum(c.nodes for c in self.components)

    def instances_of(self, component: int) -> list[Instance]:
        return [i for i in self.instances if i.component == component]


class PortRegistry:
    """One allocator per plan: a port is handed out once per node, so co-located instances
    (and the router on the prefill head node) never collide."""

    def __init__(self) -> None:
        self.taken: dict[tuple[int, int], set[int]] = {}

    def take(self, component: int, nodes: range, preferred: int, stride: int = 1) -> int:
        port = preferred
        while any(port in self.taken.get((component, n), ()) for n in nodes):
            port += stride
        for n in nodes:
            self.taken.setdefault((component, n), set()).add(port)
        return port


def _err(cfg: Resolved, path: tuple, message: str) -> ConfigError:
    o = cfg.positions.lookup(path)
    return ConfigError(message, file=o.file if o else cfg.deploy_file, line=o.line if o else None,
                       field=format_path(path))


def _directives(cfg: Resolved, name: str, nodes: int, first: bool, job_dir_out: str) -> tuple:
    s = cfg.site.slurm
    d: list[tuple[str, str | None]] = []
    if first:
        d += [("job-name", cfg.deployment.name),
              ("output", job_dir_out),
              ("signal", f"B:TERM@{s.signal_grace}")]
        d.append(("requeue", None) if cfg.deployment.requeue else ("no-requeue", None))
    for key, val in (("partition", s.partition), ("account", s.account), ("qos", s.qos),
                     ("constraint", s.constraint), ("reservation", s.reservation)):
        if val:
            d.append((key, val))
    d += [("time", cfg.deployment.time_limit), ("nodes", str(nodes)), ("ntasks-per-node", "1")]
    if s.exclusive:
        d.append(("exclusive", None))
    if s.gres and name != "router":
        d.append(("gres", s.gres))
    elif s.request_gpus and name != "router":
        d.append(("gpus-per-node", str(cfg.site.node.gpus)))
    if s.mem is not None:
        d.append(("mem", s.mem))
    for k, v in s.extra_directives.items():
        if k in OWNED_DIRECTIVES:
            raise _err(cfg, ("site", "slurm", "extra_directives", k),
                       f"--{k} is set by hpcserve ({OWNED_DIRECTIVES[k]}); it cannot be an extra "
                       "directive")
        if v is False:
            continue
        d.append((k, None if v is True else str(v)))
    return tuple(d)


def _env_word(v: Any) -> Word:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, FromEnv):  # a secret: expanded in the task, never written
        return (Var(v.from_env),)
    return str(v)


def _secret_names(obj: Any) -> list[str]:
    """Every variable a FromEnv value names: they must reach the task's (container) environment."""
    if isinstance(obj, FromEnv):
        return [obj.from_env]
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in _secret_names(v)]
    if isinstance(obj, (list, tuple)):
        return [n for v in obj for n in _secret_names(v)]
    if hasattr(obj, "__dataclass_fields__"):
        return [n for f in obj.__dataclass_fields__ for n in _secret_names(getattr(obj, f))]
    return []


def build(cfg: Resolved) -> Plan:
    dep, site, prof = cfg.deployment, cfg.site, cfg.profile
    warnings: list[str] = []
    notes: list[str] = []
    try:
        rel = sglang.release(dep.engine.version)
    except sglang.FlagError as e:
        raise _err(cfg, e.key, e.message) from None
    if rel.note:
        warnings.append(rel.note)
    pd = "worker" not in dep.roles
    if pd and not dep.router.enabled:
        raise _err(cfg, ("router", "enabled"), "prefill/decode disaggregation needs the router: "
                                               "it pairs each request's prefill and decode")
    role_order = ["prefill", "decode"] if pd else ["worker"]
    node_gpus = site.node.gpus
    ports = PortRegistry()
    components: list[Component] = []
    instances: list[Instance] = []
    router_cfg = dep.router
    # One name everywhere: the engines', the router's, the smoke request's.
    served_name = dep.model.served_name or prof.name

    # The router takes its user-given ports first so engines never land on them.
    router_comp = None
    if router_cfg.enabled:
        router_comp = 0 if router_cfg.placement == "prefill" else len(role_order)
        ports.take(router_comp, range(1), router_cfg.port)
        prom = ports.take(router_comp, range(1), router_cfg.prometheus_port)

    interface = site.network.interface
    ib = site.network.ib_devices
    ib_word: Word | None
    if ib == "auto":
        ib_word = (Var("IB_DEVICES"),)
    elif ib:
        ib_word = ",".join(ib)
    else:
        ib_word = None

    for ci, role in enumerate(role_order):
        r = dep.roles[role]
        rp = ("roles", role)
        layers = [prof.sglang.common, getattr(prof.sglang, role), r]
        st = merged_settings(*layers)
        # topology
        if r.gpus is not None:
            if r.nodes != 1:
                raise _err(cfg, rp + ("gpus",), "gpus (a share of one node) cannot be combined "
                                                f"with nodes: {r.nodes}")
            if node_gpus % r.gpus:
                raise _err(cfg, rp + ("gpus",), f"{r.gpus} GPUs per instance do not divide the "
                                                f"{node_gpus} GPUs of a node")
            per_node = node_gpus // r.gpus
            gpus_inst, inst_nodes = r.gpus, 1
            comp_nodes = -(-r.instances // per_node)
        else:
            per_node = 1
            gpus_inst, inst_nodes = node_gpus * r.nodes, r.nodes
            comp_nodes = r.instances * r.nodes
        pp = st["pp"] or 1
        tp = st["tp"] or gpus_inst // pp
        if tp * pp != gpus_inst:
            raise _err(cfg, rp + (("tp",) if r.tp else ()),
                       f"TP {tp} x PP {pp} must use exactly the {gpus_inst} GPUs of a {role} "
                       f"instance ({inst_nodes} node(s) x {gpus_inst // inst_nodes} GPUs)")
        attn_dp = st["attn_dp"]
        if attn_dp is None and st["dp_attention"]:
            attn_dp = tp
        if attn_dp is not None and tp % attn_dp:
            raise _err(cfg, rp + ("attn_dp",), f"attn_dp {attn_dp} must divide tp {tp}")
        ep = st["ep"]
        deepep = st["moe_a2a_backend"] not in (None, "none")
        if deepep and ep is not None and ep != tp:
            raise _err(cfg, rp + ("ep",), f"with moe_a2a_backend {st['moe_a2a_backend']} SGLang "
                                          f"forces ep to tp ({tp}); ep {ep} cannot be honoured")
        arch = prof.architecture
        ep_eff = tp if deepep else ep
        if arch and arch.experts and ep_eff:
            physical = arch.experts + (st["redundant_experts"] or 0)
            if physical % ep_eff:
                raise _err(cfg, rp + (("redundant_experts",) if st["redundant_experts"] else ()),
                           f"{arch.experts} experts + {st['redundant_experts'] or 0} redundant "
                           f"= {physical} do not divide over EP {ep_eff}")
        if arch:
            have = gpus_inst * site.node.gpu_memory_gb * 1e9
            if arch.weight_bytes > have:
                raise _err(cfg, rp + (("nodes",) if r.gpus is None else ("gpus",)),
                           f"{prof.name} weights ({arch.weight_bytes / 1e9:.0f} GB "
                           f"{arch.weight_dtype}) do not fit in one {role} instance's "
                           f"{gpus_inst} x {site.node.gpu_memory_gb:g} GB of GPU memory")
        settings = dict(st)
        settings["tp"] = tp if tp > 1 or st["tp"] else None
        settings["pp"] = st["pp"]
        settings["attn_dp"] = attn_dp
        settings.pop("dp_attention")

        comp = Component(ci, role, comp_nodes, ())
        components.append(comp)
        for i in range(r.instances):
            off = i // per_node if r.gpus else i * inst_nodes
            span = range(off, off + inst_nodes)
            shared = per_node > 1
            slot = i % per_node
            # SGLang derives more ports from --port (port + 233 and up, one per DP rank), so
            # instances sharing a node get HTTP ports a wide stride apart.
            port = ports.take(ci, span, r.port or ENGINE_PORT, stride=1000 if shared else 1)
            bport = ports.take(ci, span, r.bootstrap_port or BOOTSTRAP_PORT) if role == "prefill" \
                else None
            dport = ports.take(ci, span, r.dist_init_port or DIST_INIT_PORT)
            nport = ports.take(ci, span, NCCL_PORT) if shared else None
            try:
                sa = sglang.server_argv(
                    rel, model_path=dep.model.path, served_name=served_name,
                    mode=role if pd else None, port=port, bootstrap_port=bport,
                    ib_device=ib_word, nnodes=inst_nodes, dist_init_port=dport,
                    nccl_port=nport, settings=settings)
            except sglang.FlagError as e:
                raise _err(cfg, rp + e.key, e.message) from None
            if i == 0:
                warnings += [f"{role}: {w}" for w in sa.warnings]
            gpu_ids = (",".join(str(g) for g in range(slot * gpus_inst, (slot + 1) * gpus_inst))
                       if shared else None)
            env = _instance_env(cfg, settings["env"], interface, ib, pd, gpu_ids)
            fault = r.sim_fault if (r.sim_fault and (r.sim_fault.instances is None
                                                     or i in r.sim_fault.instances)) else None
            instances.append(Instance(
                role=role, index=i, component=ci, node_offset=off, nodes=inst_nodes,
                gpus_per_node=gpus_inst // inst_nodes, gpu_ids=gpu_ids,
                port=port, bootstrap_port=bport, dist_init_port=dport, nccl_port=nport,
                tp=tp, attn_dp=attn_dp, ep=ep_eff, argv=tuple(sa.words), env=tuple(env),
                fault=fault))
        if comp_nodes * node_gpus != r.instances * gpus_inst:
            notes.append(f"{role}: {comp_nodes * node_gpus - r.instances * gpus_inst} GPU(s) of "
                         f"its {comp_nodes} node(s) stay idle")

    total = sum(c.nodes for c in components)
    router = None
    if router_cfg.enabled:
        if router_cfg.placement == "own":
            components.append(Component(len(components), "router", 1, ()))
        heads = {i.name: ("http://", Var(f"{i.role.upper()}_{i.index}_IP"), f":{i.port}")
                 for i in instances}
        try:
            argv = sglang.router_argv(
                pd=pd,
                prefill=[(heads[i.name], i.bootstrap_port) for i in instances
                         if i.role == "prefill"],
                decode=[heads[i.name] for i in instances if i.role == "decode"],
                workers=[heads[i.name] for i in instances if i.role == "worker"],
                port=router_cfg.port, prometheus_port=prom, policy=router_cfg.policy,
                args=router_cfg.args)
        except sglang.FlagError as e:
            raise _err(cfg, ("router",) + e.key, e.message) from None
        router = RouterPlan(component=router_comp, node_offset=0, port=router_cfg.port,
                            prometheus_port=prom, argv=tuple(argv),
                            env=tuple((k, _env_word(v)) for k, v in
                                      {"PYTHONUNBUFFERED": "1", **router_cfg.env}.items()),
                            pd=pd, api_key_env=getattr(router_cfg.args.get("api-key"),
                                                       "from_env", None))
        total = sum(c.nodes for c in components)
    max_nodes = site.slurm.max_nodes
    if max_nodes is not None and total > max_nodes:
        parts = " + ".join(f"{c.nodes} {c.name}" for c in components)
        raise _err(cfg, ("roles",), f"the deployment needs {total} nodes ({parts}) but the "
                                    f"site's partition allows {max_nodes} (site.slurm.max_nodes)")

    jobs_dir = dep.jobs_dir or site.paths.jobs_dir
    out = []
    for c in components:
        out.append(Component(c.index, c.name, c.nodes,
                             _directives(cfg, c.name, c.nodes, c.index == 0, "@OUTPUT@")))
    image = dep.engine.image or site.container.image
    if site.container.runtime != "none" and not image:
        raise _err(cfg, ("engine", "image"), f"container runtime {site.container.runtime} needs "
                                             "an image (engine.image or site.container.image)")
    mp = dep.model.path
    if site.container.runtime != "none":
        # Unless a site mount covers it, the model path is mounted into the container at the
        # same path (containers.mounts), in mount syntax that cannot hold , : or whitespace.
        srcs = [m.split(":")[0].rstrip("/") for m in site.container.mounts]
        covered = any(mp == src or mp.startswith(src + "/") for src in srcs)
        if not mp.startswith("/") or (not covered and re.search(r"[,:\s]", mp)):
            raise _err(cfg, ("model", "path"), f"the model path is mounted into the "
                                               f"{site.container.runtime} container: it must be "
                                               "absolute, without commas, colons or whitespace")
    return Plan(
        name=dep.name, engine=dep.engine.name, version=dep.engine.version,
        simulate=dep.engine.simulate, profile=prof.name, model_path=dep.model.path,
        served_name=served_name, components=tuple(out),
        instances=tuple(instances), router=router, time_limit=dep.time_limit,
        signal_grace=site.slurm.signal_grace, container=site.container, image=image,
        interface=interface, ib_devices=ib, site_python=site.paths.python,
        engine_python=dep.engine.python,
        router_python=router_cfg.python or dep.engine.python,
        readiness=dep.readiness, jobs_dir=jobs_dir, requeue=dep.requeue,
        secret_env=tuple(dict.fromkeys(_secret_names(dep) + _secret_names(site)
                                       + _secret_names(prof))),
        sim={"startup_delay": dep.engine.sim_startup_delay,
             "prefill_s_per_token": dep.engine.sim_prefill_s_per_token,
             "decode_s_per_token": dep.engine.sim_decode_s_per_token},
        warnings=tuple(warnings), notes=tuple(notes))


def _instance_env(cfg: Resolved, role_env: dict, interface: str, ib: Any, pd: bool,
                  gpu_ids: str | None) -> list[tuple[str, Word]]:
    """Site network environment, derived fabric settings, then profile/deployment/role env."""
    env: dict[str, Word] = {"PYTHONUNBUFFERED": "1"}
    site_env = {k: _env_word(v) for k, v in cfg.site.network.env.items()}
    iface: Word = (Var("NODE_IFACE"),) if interface == "auto" else interface
    for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if k not in site_env:
            env[k] = iface
    if ib and "NCCL_IB_HCA" not in site_env:
        env["NCCL_IB_HCA"] = (Var("IB_DEVICES"),) if ib == "auto" else ",".join(ib)
    if ib and "UCX_NET_DEVICES" not in site_env:
        # NIXL/UCX take device:port; an empty UCX_NET_DEVICES would fall back to every HCA,
        # inactive ones included (a failure srt-slurm users hit).
        env["UCX_NET_DEVICES"] = (Var("IB_PORTS"),) if ib == "auto" else ",".join(
            d if ":" in d else f"{d}:1" for d in ib)
    if not ib and pd:
        # No HCAs: Mooncake must use TCP (what SGLang's mooncake_tcp backend sets, in every release).
        env["MC_FORCE_TCP"] = "1"
    env.update(site_env)
    for k, v in cfg.deployment.env.items():
        env[k] = _env_word(v)
    for k, v in role_env.items():
        env[k] = _env_word(v)
    # SGLang advertises this address to peers; on multi-homed nodes it must be the fabric IP.
    env.setdefault("SGLANG_HOST_IP", (Var("NODE_IP"),))
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = gpu_ids
    return list(env.items())
