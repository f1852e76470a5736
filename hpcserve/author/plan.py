"""The planner: roles -> het-job components -> instances -> nodes, ports and argv.

Pure: takes a validated `Resolved` config, returns an immutable `Plan`. Every number the job
needs (node counts, ranks per instance, ports, parallel sizes) is computed here in Python, so the
templates only loop over the plan and the batch shell does no arithmetic. What is specific to
the engine (its parallel layout, ports, argv, environment, router) comes from its adapter
(hpcserve/engines/); this module names none.
"""

from __future__ import annotations

import getpass
import hashlib
import posixpath
import re
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

from . import bench_sweep, fit
from .. import engines
from .autoscale import with_slots
from .compile_caches import plan_caches, user_root
from .config import Resolved, merged_settings
from ..engines.base import EngineAdapter, Layout, Net, RoleContext, gpus_from
from ..engines.bench_clients import CLIENTS, BenchPoint
from ..engines.flags import FlagError, Release
from ..errors import ConfigError
from .ports import clear_ports, plan_ports
from ..runtime.contract import API_KEY_VAR, RENEW_SIGNAL_NUMBER
from .values import FromEnv
from .words import Var, Word
from .yamlsrc import format_path

# #SBATCH options the plan itself writes: an extra directive repeating one would silently win.
OWNED_DIRECTIVES = {
    "job-name": "name", "output": "the job directory's logs/", "error": "the job directory's logs/",
    "signal": "site.slurm.signal_grace", "open-mode": "(append: a requeue keeps the log)", "requeue": "requeue", "no-requeue": "requeue",
    "time": "time_limit", "nodes": "roles.<role>.nodes and instances",
    "ntasks": "one task per node", "ntasks-per-node": "one task per node (per GPU for MPI engines)",
    "partition": "site.slurm.partition", "account": "site.slurm.account",
    "qos": "site.slurm.qos", "constraint": "site.slurm.constraint",
    "reservation": "site.slurm.reservation", "exclusive": "site.slurm.exclusive",
    "gres": "site.slurm.gres", "gpus-per-node": "site.node.gpus and site.slurm.request_gpus",
    "gpus": "site.node.gpus", "mem": "site.slurm.mem", "hetjob": "the roles",
    "packjob": "the roles", "export": "(the job relies on the submitting environment)",
    "no-kill": "(instance recovery: a lost node takes out the instances on it, not the job)",
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
    ports: tuple[tuple[str, int], ...]         # kind -> first port, e.g. ("http", 30000)
    port_labels: tuple[tuple[str, int], ...]   # the ones people see in the topology comment
    parallel: tuple[tuple[str, int], ...]      # e.g. ("tp", 16), ("attn_dp", 16), ("ep", 16)
    argv: tuple[Word, ...]                     # every node's
    rank_argv: tuple[tuple[Word, ...], ...]    # what each node rank adds (empty: nothing)
    env: tuple[tuple[str, Word], ...]
    tasks_per_node: int = 1
    mpi: str | None = None
    cpus_per_task: int | None = None
    srun_args: tuple[str, ...] = ()
    fault: Any = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def port(self) -> int:
        """The HTTP port of the instance's leader (node rank 0)."""
        return self.port_of("http")

    def port_of(self, kind: str) -> int | None:
        return dict(self.ports).get(kind)

    def size(self, name: str) -> int | None:
        return dict(self.parallel).get(name)


@dataclass(frozen=True)
class RouterPlan:
    component: int
    node_offset: int
    port: int
    prometheus_port: int
    command: tuple[Word, ...]
    argv: tuple[Word, ...]
    env: tuple[tuple[str, Word], ...]
    pd: bool
    name: str                      # the router program, for people
    readiness_path: str            # GET answers 200 once it routes to every worker: the sum
    readiness_count: tuple[str, ...]  # of these (dotted) JSON fields reaches their number
    workers_api: str               # how recovery changes its workers (runtime/contract.py WORKERS_APIS)
    files: tuple[tuple[str, tuple[Word, ...]], ...] = ()  # run/<name>, one Word per line
    api_key_env: str | None = None
    metrics_path: str | None = None  # its Prometheus text on prometheus_port; None: none
    package: str | None = None     # the Python package its python must import; None: none


@dataclass(frozen=True)
class BenchPlan:
    """benchmark: the client's run per point, where it runs, and what the gate asks."""

    client: str            # bench_clients.CLIENTS key
    title: str
    python: str
    tokenizer: str
    component: int         # the client runs on this component's node `node_offset`: the
    node_offset: int       # router's, or the one instance's leader
    points: tuple[tuple[BenchPoint, tuple[Word, ...]], ...]   # each point with its argv
    env: tuple[tuple[str, Word], ...]
    spec: dict             # plan.json's benchmark block


@dataclass(frozen=True)
class Plan:
    name: str
    engine: str
    engine_title: str
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
    engine_command: tuple[Word, ...]   # the real engine's program (simulate: the stand-in's)
    health_path: str
    metrics: Any           # engines.base.Metrics or None
    probe: tuple[str, bool]   # the liveness probe's path, whether its 200 proves generation
    hung_after: dict          # role -> seconds without progress before failed probes mean hung
    smoke: tuple[str, str]  # how a restarted instance is checked alone (instance_smoke)
    stop_signal: str
    scratch: bool
    readiness: Any
    liveness: Any
    jobs_dir: str
    requeue: int
    recovery: dict = field(default_factory=dict)  # role -> plan.json's recovery block
    secret_env: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()   # job-dir path -> text: the engine's own files
    fits: tuple = ()                          # fit.RoleFit per role (hpcserve plan shows them)
    preflight: dict = field(default_factory=dict)  # plan.json's preflight block, less the image
    benchmark: BenchPlan | None = None
    in_allocation: bool = False  # steps of an allocation the user holds (allocation.py)
    file_sd_dir: str | None = None  # site.metrics.file_sd_dir: Prometheus file SD while serving
    stage: dict | None = None  # plan.json's stage block (model.stage), None when off
    caches: tuple = ()              # compile_caches.CachePlan: compile caches kept between jobs
    user: str = ""                  # the cluster user: <cache>/<user>/ of the per-user caches
    cache_dir: str | None = None    # site.paths.cache_dir (mounted into containers)
    cache_storage: str = "shared"   # site.paths.cache_storage: node-local or shared
    sim: dict = field(default_factory=dict)
    # the engine release's start-up lines: (weights_loaded, regex or None), (ready, ...)
    startup_lines: tuple = ()
    # an instance job (`hpcserve scale`): plan.json's attach, the running router it joins
    attach: dict | None = None
    # roles.<role>.autoscale: role -> autoscale.RoleScaling (its bounds and its slots' plans)
    autoscale: dict = field(default_factory=dict)
    # a renewing instance job: plan.json's renew, its twin's directory and the margin
    renew: dict | None = None
    # the variable of the deployment's API key (_with_api_key), which job.sbatch exports and the
    # runtime's own requests send; None where neither the engine nor its router takes a key
    api_key_env: str | None = None
    # the deployment's source document (config.SOURCE_FILE), kept in the job directory; written
    # out only by the render (a plan is built many times over when its ports are moved)
    source: dict = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def pd(self) -> bool:
        return any(i.role in ("prefill", "decode") for i in self.instances) or \
            bool(self.router and self.router.pd)

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

    def take(self, component: int, nodes: range, preferred: int, stride: int = 1,
             width: int = 1) -> int:
        port = preferred
        while any(p in self.taken.get((component, n), ()) for n in nodes
                  for p in range(port, port + width)):
            port += stride
        for n in nodes:
            self.taken.setdefault((component, n), set()).update(range(port, port + width))
        return port


def _err(cfg: Resolved, path: tuple, message: str) -> ConfigError:
    o = cfg.positions.lookup(path)
    return ConfigError(message, file=o.file if o else cfg.deploy_file, line=o.line if o else None,
                       field=format_path(path))


def _directives(cfg: Resolved, name: str, nodes: int, first: bool, job_dir_out: str,
                engine: tuple = ()) -> tuple:
    """The #SBATCH lines of one component; `engine`: what its engine adds (the CPUs it
    computes on), unless the site's extra directives say otherwise."""
    s = cfg.site.slurm
    d: list[tuple[str, str | None]] = []
    if first:
        d += [("job-name", cfg.deployment.name),
              ("output", job_dir_out),
              # a requeued job appends to its batch log instead of truncating the earlier tries'
              ("open-mode", "append"),
              ("signal", f"B:TERM@{s.signal_grace}")]
        d.append(("requeue", None) if cfg.deployment.requeue else ("no-requeue", None))
    for key, val in (("partition", s.partition), ("account", s.account), ("qos", s.qos),
                     ("constraint", s.constraint), ("reservation", s.reservation)):
        if val:
            d.append((key, val))
    mine = dict(engine)
    # one task per node, or the engine's (one per GPU) so that its step fits the allocation
    d += [("time", cfg.deployment.time_limit), ("nodes", str(nodes)),
          ("ntasks-per-node", mine.pop("ntasks-per-node", "1"))]
    if s.exclusive:
        d.append(("exclusive", None))
    # A lost node must not end the job: its instances are replaced while the others serve
    # (Slurm's default kills the whole allocation on a node failure).
    d.append(("no-kill", None))
    if s.gres and name != "router":
        d.append(("gres", s.gres))
    elif s.request_gpus and name != "router":
        d.append(("gpus-per-node", str(cfg.site.node.gpus)))
    if s.mem is not None:
        d.append(("mem", s.mem))
    d += [(k, v) for k, v in mine.items() if k not in s.extra_directives]
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
    if is_dataclass(obj):
        return [n for f in fields(obj) for n in _secret_names(getattr(obj, f.name))]
    return []


# ------------------------------------------------------------------------------------- the steps

@dataclass
class _Draft:
    """What the steps of `build` fill in, in order."""

    cfg: Resolved
    adapter: EngineAdapter
    rel: Release
    pd: bool
    roles: list[str]
    served_name: str
    net: Net
    ports: PortRegistry = field(default_factory=PortRegistry)
    components: list[Component] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    router_component: int | None = None
    prometheus_port: int | None = None
    router_words: list = field(default_factory=list)   # what the instances need of the router
    files: dict[str, str] = field(default_factory=dict)  # job-dir path -> text
    fits: list = field(default_factory=list)             # fit.RoleFit per role
    port_shift: int = 0
    shift_set_ports: bool = False   # an instance job: the ports the file sets move too
    router_port: int | None = None
    recovery: dict[str, dict] = field(default_factory=dict)  # role -> plan.json's block
    caches: tuple = ()                                   # compile_caches.CachePlan
    api_key_env: str | None = None   # the deployment's API key's variable (_with_api_key)


# On nodes other jobs share, `hpcserve submit` moves a deployment's ports by a multiple of
# this, clear of this user's other deployments' ports; the HTTP ports stay below Linux's
# ephemeral range (32768+) at the largest shift.
PORT_SHIFT_STEP = 20
PORT_SHIFTS = 64
TWIN_SUFFIX = "b"   # <role>-<seq>b/: a renewing instance job's twin


def build(cfg: Resolved, port_shift: int = 0) -> Plan:
    """The plan of a deployment; `port_shift` moves every port the deployment does not set."""
    d = _start(cfg)
    d.port_shift = port_shift
    _reserve_router_ports(d)
    for role in d.roles:
        if _front_holds(d, role):
            _plan_role(d, len(d.components), role)
    router = _plan_router(d)
    _check_node_limit(d)
    return with_slots(cfg, _finish(d, router), _err, instance_plans)


def instance_job(cfg: Resolved, role: str, count: int, seq: int, port_shift: int,
                 attach: dict, renew: dict | None = None) -> Plan:
    """An instance job of a running deployment (`hpcserve scale --add`): only `role`, `count`
    instances of it, no router of its own (plan.json's attach names the front's), named
    <name>-<role>-<seq>. It may land on nodes the front's or another instance job's engines
    use, so every port moves by `port_shift`, those the file sets as well. No benchmark: the
    deployment's is the front's. `renew` (plan.json's, runtime/renew.py): the job renews into
    its twin before its time limit, renew.time_limit its own."""
    dep = cfg.deployment
    r = dep.roles[role]
    # recovery.min_serving counts the deployment's instances of the role: an instance job of
    # fewer holds it for its own, at most all of them
    roles = {role: replace(r, instances=count, recovery=replace(
        r.recovery, min_serving=min(r.recovery.min_serving, count)))}
    limit = (dep.renew.time_limit or dep.time_limit) if renew and dep.renew else dep.time_limit
    cfg = replace(cfg, deployment=replace(dep, name=f"{dep.name}-{role}-{seq}", roles=roles,
                                          benchmark=None, time_limit=limit))
    d = _start(cfg)
    d.roles, d.port_shift, d.shift_set_ports = [role], port_shift, True
    _plan_role(d, 0, role)
    _check_node_limit(d)
    p = replace(_finish(d, None), attach=attach, renew=renew)
    return _renew_signal(p) if renew else p


def instance_plans(cfg, role: str, count: int, seq: int, attach: dict, taken: set[int],
                   label: str | None = None) -> list[tuple[str, object]]:
    """(directory name, plan.Plan) of the instance job of `count` instances of `role`, named
    <role>-<label> (label: seq unless given) and its Slurm job <name>-<role>-<label>: one, or
    with the deployment's renew: the pair of it and its twin <role>-<label>b, each plan's renew
    naming the other's directory by its name under scale/ (with_twin_dir makes it absolute as
    it is rendered), the twin's ports clear of the first's too (both run on one node while they
    overlap). Pure: `hpcserve scale` and the autoscale slots (autoscale.py) plan here."""
    from .config import duration_s
    first = f"{role}-{label or seq}"
    names = [first, first + TWIN_SUFFIX] if cfg.deployment.renew else [first]
    out = []
    for k, name in enumerate(names):
        renew = {"twin_dir": names[1 - k], "margin_s": duration_s(cfg.deployment.renew.margin)} \
            if len(names) == 2 else None
        p = clear_ports(lambda shift: instance_job(cfg, role, count, label or seq, shift,
                                                   attach, renew), seq + k, taken,
                        PORT_SHIFT_STEP, PORT_SHIFTS)
        taken = taken | plan_ports(p)
        out.append((name, p))
    return out


def with_twin_dir(p, scale_root: str):
    """`p` with its renew's twin named by its absolute directory under `scale_root`."""
    if not p.renew:
        return p
    return replace(p, renew={**p.renew, "twin_dir": posixpath.join(scale_root,
                                                                   p.renew["twin_dir"])})


def _renew_signal(p: Plan) -> Plan:
    """A renewing job asks Slurm for contract.RENEW_SIGNAL (by its number) `margin_s` before its
    limit instead of TERM `signal_grace` before it (one --signal per job): the trigger of last
    resort for submitting its successor. Its runtime stops itself signal_grace before the limit
    (runtime/renew.py)."""
    sig = ("signal", f"B:{RENEW_SIGNAL_NUMBER}@{int(p.renew['margin_s'])}")
    comps = tuple(replace(c, directives=tuple(sig if k == "signal" else (k, v)
                                              for k, v in c.directives)) for c in p.components)
    return replace(p, components=comps)


def _with_api_key(cfg: Resolved, adapter: EngineAdapter, pd: bool) -> tuple[Resolved, str | None]:
    """`cfg` with the deployment's API key given, by name ({from_env}), to its router and to
    every engine that checks it, and the key's variable (None: nothing here takes a key).
    The key is contract.API_KEY_VAR, made at submit, unless router.args.api-key names another
    variable: that one then keys the engines too, as the router hands its key to them. An
    engine behind a router that cannot hand a key on (keys_workers) takes none: it would turn
    the router's requests away. A key the file sets for an engine stays its own."""
    dep = cfg.deployment
    router = adapter.router_for(pd) if dep.router.enabled else None
    own = dep.router.args.get(router.api_key_flag) if router and router.api_key_flag else None
    var = own.from_env if isinstance(own, FromEnv) else API_KEY_VAR
    key = FromEnv(from_env=var)
    engines_keyed = adapter.api_key_flag and (router is None or router.keys_workers(pd))
    if not engines_keyed and not (router and router.api_key_flag):
        return cfg, None
    rc = dep.router
    if router and router.api_key_flag and own is None:
        rc = replace(rc, args={router.api_key_flag: key, **rc.args})
    roles = dict(dep.roles)
    if engines_keyed:
        flag = adapter.api_key_flag
        roles = {n: r if flag in r.args else replace(r, args={flag: key, **r.args})
                 for n, r in roles.items()}
    return replace(cfg, deployment=replace(dep, router=rc, roles=roles)), var


def _start(cfg: Resolved) -> _Draft:
    """The engine, its release and the roles: prefill + decode (PD) or worker (plain)."""
    dep, site = cfg.deployment, cfg.site
    adapter = engines.get(dep.engine.name)
    version = dep.engine.version or adapter.matrix.known_versions()[-1]
    try:
        rel = adapter.release(version, dep.engine.check_flags_as)
    except FlagError as e:
        raise _err(cfg, e.key, e.message) from None
    pd = "worker" not in dep.roles
    if pd and not dep.router.enabled:
        raise _err(cfg, ("router", "enabled"), "prefill/decode disaggregation needs the router: "
                                               "it pairs each request's prefill and decode")
    cfg, key_env = _with_api_key(cfg, adapter, pd)
    dep = cfg.deployment
    ib = site.network.ib_devices
    ib_word: Word | None = ((Var("IB_DEVICES"),) if ib == "auto" else ",".join(ib) if ib
                            else None)
    d = _Draft(cfg=cfg, adapter=adapter, rel=rel, pd=pd,
               roles=["prefill", "decode"] if pd else ["worker"],
               # One name everywhere: the engines', the router's, the smoke request's.
               served_name=dep.model.served_name or cfg.profile.name,
               net=Net(ib_word=ib_word, has_ib=bool(ib),
                       iface=((Var("NODE_IFACE"),) if site.network.interface == "auto"
                              else site.network.interface)),
               api_key_env=key_env)
    d.caches = plan_caches(site.paths.cache_dir, user_of(cfg), dep.model.path, adapter.name,
                           adapter, rel, site.node.gpu_type)
    if rel.note:
        d.warnings.append(rel.note)
    if not dep.engine.version:
        d.notes.append(f"engine.version is not set: flags are spelled for {adapter.title} "
                       f"{version}, the newest release hpcserve knows")
    return d


def _front_holds(d: _Draft, role: str) -> bool:
    """Whether the front job runs engines of `role`: `instances: 0` leaves the role to its
    autoscale slot jobs (autoscale.py), which the front submits at once (min of them)."""
    r = d.cfg.deployment.roles[role]
    if r.instances:
        return True
    if r.autoscale is None or r.autoscale.min < 1:
        raise _err(d.cfg, ("roles", role, "instances"),
                   "0 instances in the front job needs roles." + role + ".autoscale with min "
                   "at least 1: its slot jobs are then the role's only instances")
    return False


def router_own(cfg: Resolved) -> bool:
    """The router on a het-job component of its own: asked for, or the first role (the
    component it would share) has no engine in the front job."""
    dep = cfg.deployment
    first = "worker" if "worker" in dep.roles else "prefill"
    return dep.router.placement == "own" or dep.roles[first].instances == 0


def _reserve_router_ports(d: _Draft) -> None:
    """The router takes its user-given ports first so engines never land on them."""
    r = d.cfg.deployment.router
    if r.enabled:
        d.router_component = (len([x for x in d.roles if d.cfg.deployment.roles[x].instances])
                              if router_own(d.cfg) else 0)
        d.router_port = d.ports.take(d.router_component, range(1),
                                     r.port + _shift_unless_set(d, ("router", "port")))
        d.prometheus_port = d.ports.take(
            d.router_component, range(1),
            r.prometheus_port + _shift_unless_set(d, ("router", "prometheus_port")))


def _shift_unless_set(d: _Draft, path: tuple) -> int:
    """The port shift, for a port the deployment file does not name."""
    return 0 if path in d.cfg.positions.table and not d.shift_set_ports else d.port_shift


def _role_context(d: _Draft, role: str) -> tuple[RoleContext, int, int]:
    """The adapter's view of a role, plus (instances per node, nodes of its component)."""
    cfg, r = d.cfg, d.cfg.deployment.roles[role]
    node_gpus = cfg.site.node.gpus
    rp = ("roles", role)
    if r.gpus is not None:
        if r.nodes != 1:
            raise _err(cfg, rp + ("gpus",), "gpus (a share of one node) cannot be combined "
                                            f"with nodes: {r.nodes}")
        if node_gpus % r.gpus:
            raise _err(cfg, rp + ("gpus",), f"gpus {r.gpus} (per instance) does not divide "
                                            f"the {node_gpus} GPUs of a node (site.node.gpus)")
        per_node = node_gpus // r.gpus
        gpus_inst, inst_nodes = r.gpus, 1
        comp_nodes = -(-r.instances // per_node)
    else:
        per_node = 1
        gpus_inst, inst_nodes = node_gpus * r.nodes, r.nodes
        comp_nodes = r.instances * r.nodes
    section = getattr(cfg.profile, d.adapter.name)
    settings = merged_settings(d.adapter.settings, section.common, getattr(section, role), r)
    own = frozenset(n for n in settings if n not in ("args", "env") and getattr(r, n) is not None)
    ctx = RoleContext(role=role, pd=d.pd, settings=settings, own=own, gpus=gpus_inst,
                      nodes=inst_nodes, shared=per_node > 1,
                      architecture=cfg.profile.architecture, node=cfg.site.node)
    return ctx, per_node, comp_nodes


def _check_model_fits(d: _Draft, ctx: RoleContext, layout: Layout) -> None:
    """Experts divide over expert parallelism; the weights leave each GPU a KV cache (the fit
    report: refused when they do not, a warning when it is tight)."""
    cfg, rp = d.cfg, ("roles", ctx.role)
    arch = ctx.architecture
    redundant = ctx.settings.get("redundant_experts")
    if arch and arch.experts and layout.ep:
        physical = arch.experts + (redundant or 0)
        if physical % layout.ep:
            raise _err(cfg, rp + (("redundant_experts",) if redundant else ()),
                       f"{arch.experts} experts (model profile) + {redundant or 0} redundant "
                       f"= {physical} do not divide over the {layout.ep} expert-parallel ranks "
                       f"of {ctx.role}'s layout ({_layout_words(layout)})")
    if not arch:
        return
    gpu = cfg.site.node.gpu_memory_gb
    f = fit.role_fit(role=ctx.role, arch=arch, gpus=ctx.gpus, gpu_gb=gpu,
                     parallel=dict(layout.parallel), ep=layout.ep, redundant=redundant or 0,
                     host_bytes=layout.host_weight_bytes, workload=cfg.deployment.workload,
                     context=ctx.settings.get("context_length"),
                     budget_of=lambda w: d.adapter.memory_budget(dict(layout.settings), layout,
                                                                 gpu * fit.GIB, w))
    d.fits.append(f)
    r = cfg.deployment.roles[ctx.role]
    if f.verdict == "does not fit" or f.weights_gb > gpu:
        raise _err(cfg, rp + (("nodes",) if r.gpus is None else ("gpus",)),
                   f"{cfg.profile.name} weights ({f.weights_gb:.1f} GiB per GPU in {ctx.role}'s "
                   f"layout, {arch.weight_bytes / fit.GIB:.0f} GiB in all) do not fit "
                   f"{ctx.gpus} x {gpu:g} GiB GPUs ({gpus_from(ctx)}) with room for a KV cache "
                   f"({f.budget.how if f.budget else 'weights alone'}): give the instance "
                   "more GPUs")
    if f.verdict == "tight":
        d.warnings.append(f"{ctx.role}: tight fit: {f.why}")


def _layout_words(layout: Layout) -> str:
    """The parallel sizes of a layout, as the plan derived them: "tp 16, attn_dp 16, ep 16"."""
    return ", ".join(f"{k} {v}" for k, v in layout.parallel)


def _engine_directives(cfg: Resolved, layout: Layout) -> tuple:
    """What the engine needs of each node beyond the site's request: a task per GPU (MPI),
    the CPUs it computes on, host memory where the site asks for none."""
    d = []
    if layout.tasks_per_node > 1:
        d.append(("ntasks-per-node", str(layout.tasks_per_node)))
    if layout.cpus_per_task:
        d.append(("cpus-per-task", str(layout.cpus_per_task)))
    if layout.mem_gb and cfg.site.slurm.mem is None:
        d.append(("mem", f"{layout.mem_gb}G"))
    return tuple(d)


def _fabric_directives(d: _Draft, role: str, inst_nodes: int, total: int) -> tuple:
    """Keep each instance of the role (its expert-parallel group) inside one NVLink domain.
    topology/block: --segment=<nodes per instance>, each segment inside one block (sbatch(1),
    Slurm 24.05+). topology/tree: --switches=1 asks for one leaf switch for the whole component,
    so it is given only where the role's nodes fit one domain. A one-node instance needs
    neither."""
    fab, rp = d.cfg.site.fabric, ("roles", role)
    if fab is None:
        return ()
    if inst_nodes > fab.nvlink_domain_nodes:
        raise _err(d.cfg, rp + ("nodes",), f"an instance of {inst_nodes} nodes does not fit one "
                                           f"NVLink domain of {fab.nvlink_domain_nodes} nodes "
                                           "(site.fabric.nvlink_domain_nodes)")
    if inst_nodes == 1 or fab.topology == "none":
        return ()
    if fab.topology == "block":
        if total % inst_nodes:
            # sbatch(1) --segment: the node count must be a multiple of the segment size
            raise _err(d.cfg, rp + ("spares",), f"Slurm allocates {role}'s nodes in segments of "
                                                f"{inst_nodes} (--segment, site.fabric.topology "
                                                f"block): its {total} nodes must be a multiple "
                                                f"of {inst_nodes}; give spares in multiples of "
                                                f"{inst_nodes}")
        return (("segment", str(inst_nodes)),)
    if total <= fab.nvlink_domain_nodes:
        return (("switches", "1"),)
    d.notes.append(f"{role}: its {total} nodes span more than one NVLink domain of "
                   f"{fab.nvlink_domain_nodes}; topology/tree has no per-instance placement "
                   "(--switches counts the whole component's leaf switches), so Slurm may split "
                   "an instance over two domains" + (": the preflight's fabric check refuses that"
                                                     if fab.check else ""))
    return ()


def _hung_after(cfg, adapter) -> dict:
    """Each role's hung threshold: roles.<role>.hung_after, else liveness.hung_after, else the
    engine's default (longer than its longest legitimate step)."""
    dep = cfg.deployment
    default = dep.liveness.hung_after or adapter.hung_after
    return {role: r.hung_after or default for role, r in dep.roles.items()}


def _check_recovery(d: _Draft, role: str, ci: int, comp_nodes: int) -> None:
    """The role's recovery policy for plan.json: its restarts, its minimum, its spare nodes
    (the component's nodes from `first_spare` on)."""
    r = d.cfg.deployment.roles[role]
    rec = r.recovery
    if rec.min_serving > r.instances:
        raise _err(d.cfg, ("roles", role, "recovery", "min_serving"),
                   f"{rec.min_serving} instances of {role} must serve, but the role has "
                   f"{r.instances}")
    if r.spares and r.gpus is not None and r.instances > 1:
        d.notes.append(f"{role}: a spare node takes the place of a lost node for every "
                       "instance that shared it")
    d.recovery[role] = {"restart": rec.restart, "max_restarts": rec.max_restarts,
                        "backoff_s": rec.backoff_s, "min_serving": rec.min_serving,
                        "spares": r.spares, "component": ci, "first_spare": comp_nodes}


def _plan_role(d: _Draft, ci: int, role: str) -> None:
    """One het-job component for the role, and its instances."""
    cfg, a = d.cfg, d.adapter
    rp = ("roles", role)
    r = cfg.deployment.roles[role]
    ctx, per_node, comp_nodes = _role_context(d, role)
    try:
        layout = a.layout(d.rel, ctx)
    except FlagError as e:
        raise _err(cfg, rp + e.key, e.message) from None
    _check_model_fits(d, ctx, layout)
    _check_recovery(d, role, ci, comp_nodes)
    # Spare nodes follow the instances' nodes in the component: discovered with them, idle.
    d.components.append(Component(ci, role, comp_nodes + r.spares,
                                  _engine_directives(cfg, layout) +
                                  _fabric_directives(d, role, ctx.nodes, comp_nodes + r.spares)))
    for i in range(r.instances):
        off = i // per_node if r.gpus else i * ctx.nodes
        span = range(off, off + ctx.nodes)
        ports, labels = {}, []
        for req in a.ports(ctx, layout):
            own = getattr(r, req.field) if req.field else None
            first = ((own + d.port_shift if d.shift_set_ports else own) if own
                     else req.preferred + d.port_shift)
            ports[req.kind] = d.ports.take(ci, span, first, stride=req.stride, width=req.width)
            if req.label:
                labels.append((req.label, ports[req.kind]))
        try:
            ln = a.launch(d.rel, ctx, layout, ports, model_path=engine_model_path(cfg),
                          served_name=d.served_name, net=d.net)
        except FlagError as e:
            raise _err(cfg, rp + e.key, e.message) from None
        if i == 0:
            d.warnings += [f"{role}: {w}" for w in ln.warnings]
        for path, text in ln.files:
            if d.files.setdefault(path, text) != text:  # an adapter's bug, not the user's
                raise AssertionError(f"{a.name}: two different texts for the job file {path}")
        d.router_words += [w for w in ln.router_args if w not in d.router_words]
        slot = i % per_node
        gpu_ids = (",".join(str(g) for g in range(slot * ctx.gpus, (slot + 1) * ctx.gpus))
                   if ctx.shared else None)
        fault = r.sim_fault if (r.sim_fault and (r.sim_fault.instances is None
                                                 or i in r.sim_fault.instances)) else None
        d.instances.append(Instance(
            role=role, index=i, component=ci, node_offset=off, nodes=ctx.nodes,
            gpus_per_node=ctx.gpus // ctx.nodes, gpu_ids=gpu_ids, ports=tuple(ports.items()),
            port_labels=tuple(labels), parallel=layout.parallel, argv=ln.argv,
            rank_argv=ln.rank_argv, env=tuple(_instance_env(cfg, ctx, ln, gpu_ids, d.caches)),
            tasks_per_node=layout.tasks_per_node, mpi=layout.mpi,
            cpus_per_task=layout.cpus_per_task, srun_args=layout.srun_args, fault=fault))
    node_gpus = cfg.site.node.gpus
    if comp_nodes * node_gpus != r.instances * ctx.gpus:
        d.notes.append(f"{role}: {comp_nodes * node_gpus - r.instances * ctx.gpus} GPU(s) of "
                       f"its {comp_nodes} node(s) stay idle")


def _plan_router(d: _Draft) -> RouterPlan | None:
    """The engine's router in front of every instance's leader (node rank 0)."""
    rc = d.cfg.deployment.router
    if not rc.enabled:
        return None
    if router_own(d.cfg):
        d.components.append(Component(len(d.components), "router", 1, ()))
    heads = {i.name: ("http://", Var(f"{i.role.upper()}_{i.index}_IP"), f":{i.port}")
             for i in d.instances}
    router = d.adapter.router_for(d.pd)
    urls = dict(pd=d.pd,
                prefill=[(heads[i.name], i.port_of("bootstrap")) for i in d.instances
                         if i.role == "prefill"],
                decode=[heads[i.name] for i in d.instances if i.role == "decode"],
                workers=[heads[i.name] for i in d.instances if i.role == "worker"],
                port=d.router_port)
    try:
        argv = router.argv(**urls, prometheus_port=d.prometheus_port, policy=rc.policy,
                           args=rc.args,
                           start_timeout=d.cfg.deployment.readiness.engine_timeout)
        argv += d.router_words
        files = router.config_files(**urls)
    except FlagError as e:
        raise _err(d.cfg, ("router",) + e.key, e.message) from None
    if d.cfg.deployment.engine.simulate and router.stand_in is not None:
        # The real router is part of the engine: the stand-in runs in its place.
        command = [_engine_python(d), (Var("JOB_DIR"), "/hpcserve_sim.py"), *router.stand_in]
        package = None
    else:
        package = router.package
        command = router.command(rc.python or d.cfg.site.paths.router_python
                                 or _engine_python(d))
    return RouterPlan(component=d.router_component, node_offset=0, port=d.router_port,
                      prometheus_port=d.prometheus_port, command=tuple(command),
                      argv=tuple(argv),
                      env=tuple((k, _env_word(v)) for k, v in
                                {"PYTHONUNBUFFERED": "1", **rc.env}.items()),
                      pd=d.pd, name=router.name, readiness_path=router.readiness(d.pd).path,
                      readiness_count=router.readiness(d.pd).count,
                      workers_api=router.workers_api(d.pd), package=package,
                      files=tuple((name, tuple(lines)) for name, lines in files.items()),
                      api_key_env=getattr(rc.args.get("api-key"), "from_env", None),
                      metrics_path=router.metrics_path)


def _engine_python(d: _Draft) -> str:
    """The python that runs the engine. A stand-in (engine.simulate) needs only the standard
    library, not the engine's environment: the site's engine python is for the real one."""
    e = d.cfg.deployment.engine
    site = None if e.simulate else d.cfg.site.paths.engine_python.get(d.adapter.name)
    return e.python or site or "python3"


def _check_node_limit(d: _Draft) -> None:
    total = sum(c.nodes for c in d.components)
    max_nodes = d.cfg.site.slurm.max_nodes
    if max_nodes is not None and total > max_nodes:
        parts = " + ".join(f"{c.nodes} {c.name}" for c in d.components)
        raise _err(d.cfg, ("roles",), f"the deployment needs {total} nodes ({parts}), "
                                      "instances x nodes (+ spares) of each role, but the "
                                      f"site's partition allows {max_nodes} "
                                      "(site.slurm.max_nodes)")


def _image(cfg: Resolved) -> str | None:
    """The engine image, and a model path the container runtime can mount."""
    dep, site = cfg.deployment, cfg.site
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
    return image


def _finish(d: _Draft, router: RouterPlan | None) -> Plan:
    cfg, a = d.cfg, d.adapter
    dep, site, prof = cfg.deployment, cfg.site, cfg.profile
    components = tuple(Component(c.index, c.name, c.nodes,
                                 _directives(cfg, c.name, c.nodes, c.index == 0, "@OUTPUT@",
                                             c.directives))
                       for c in d.components)
    image = _image(cfg)
    return Plan(
        name=dep.name, engine=a.name, engine_title=a.title, version=d.rel.version,
        simulate=dep.engine.simulate, profile=prof.name, model_path=dep.model.path,
        served_name=d.served_name, components=components,
        instances=tuple(d.instances), router=router, time_limit=dep.time_limit,
        signal_grace=site.slurm.signal_grace, container=site.container, image=image,
        interface=site.network.interface, ib_devices=site.network.ib_devices,
        site_python=site.paths.python, engine_python=_engine_python(d),
        engine_command=tuple(a.command(_engine_python(d))), health_path=a.health_path,
        metrics=a.metrics, probe=a.liveness(d.pd), hung_after=_hung_after(cfg, a),
        smoke=a.instance_smoke(d.pd),
        stop_signal=a.stop_signal, scratch=a.scratch and not dep.engine.simulate,
        readiness=dep.readiness, liveness=dep.liveness,
        jobs_dir=dep.jobs_dir or site.paths.jobs_dir, requeue=dep.requeue,
        recovery=dict(d.recovery),
        secret_env=tuple(dict.fromkeys(_secret_names(dep) + _secret_names(site)
                                       + _secret_names(prof))),
        files=tuple(sorted(d.files.items())), fits=tuple(d.fits),
        preflight=_preflight(d, router),
        benchmark=_benchmark(d, router),
        file_sd_dir=site.metrics.file_sd_dir, stage=_stage(cfg),
        caches=d.caches, cache_dir=site.paths.cache_dir if d.caches else None,
        user=user_of(cfg), api_key_env=d.api_key_env,
        cache_storage=site.paths.cache_storage,
        sim={"startup_delay": dep.engine.sim_startup_delay,
             "prefill_s_per_token": dep.engine.sim_prefill_s_per_token,
             "decode_s_per_token": dep.engine.sim_decode_s_per_token},
        startup_lines=tuple(a.startup_lines(d.rel).items()),
        source=cfg.source,
        warnings=tuple(d.warnings), notes=tuple(d.notes))


def user_of(cfg: Resolved) -> str:
    """The user the deployment's jobs run as: the one its per-user caches belong to."""
    return cfg.user or getpass.getuser()


def staged_name(model_path: str) -> str:
    """The model's directory in the stage cache: its own name, and a hash of its full path so
    that two models of one name (two revisions side by side) never share a copy."""
    base = posixpath.basename(model_path.rstrip("/")) or "model"
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", base)[:80]
    return f"{safe}-{hashlib.sha256(model_path.encode()).hexdigest()[:10]}"


def engine_model_path(cfg: Resolved) -> str:
    """The path the engines load: the node-local copy where the model is staged."""
    dep, site = cfg.deployment, cfg.site
    if not dep.model.stage:
        return dep.model.path
    if not site.paths.stage_dir:
        raise _err(cfg, ("model", "stage"), "the site declares no node-local directory to stage "
                                            "into (site.paths.stage_dir)")
    return posixpath.join(stage_root(cfg), staged_name(dep.model.path))


def stage_root(cfg: Resolved) -> str:
    """<stage_dir>/<user>: the user's own part of the site's stage directory, where their
    staged models are (a copy is code the engines may import: nobody else's is ever used)."""
    return user_root(cfg.site.paths.stage_dir, user_of(cfg))


def _stage(cfg: Resolved) -> dict | None:
    """plan.json's stage block: from where, to where, and the cache's bound on every node."""
    if not cfg.deployment.model.stage:
        return None
    paths = cfg.site.paths
    return {"source": cfg.deployment.model.path, "dir": stage_root(cfg),
            "name": staged_name(cfg.deployment.model.path), "path": engine_model_path(cfg),
            "max_bytes": int(paths.stage_max_gb * 1e9), "only": False}


BENCH_DIR = "bench"   # in the job directory: each point's results file, the summary, metrics


def _benchmark(d: _Draft, router: RouterPlan | None) -> BenchPlan | None:
    """The serving benchmark: the same workload at every point of the sweep, against the router
    (or the one instance there is), run from the node the router runs on."""
    dep = d.cfg.deployment
    b = dep.benchmark
    if b is None:
        return None
    if router is None and len(d.instances) > 1:
        raise _err(d.cfg, ("benchmark",), f"the benchmark needs one address to measure: enable "
                                          f"the router (there are {len(d.instances)} instances)")
    client, python = _bench_client(d)
    inp = b.input_tokens or dep.workload.input_tokens
    out = b.output_tokens or dep.workload.output_tokens
    where = ((router.component, router.node_offset) if router else
             (d.instances[0].component, d.instances[0].node_offset))
    tokenizer = b.tokenizer or dep.model.path
    points = bench_sweep.sweep(client, served_name=d.served_name, tokenizer=tokenizer,
                               input_tokens=inp, output_tokens=out, warmup=b.warmup,
                               concurrency=b.concurrency, rates=b.request_rate,
                               prompts_per_point=b.prompts_per_point)
    d.notes.extend(client.notes)
    spec = bench_sweep.spec(client, points, bench_dir=BENCH_DIR, input_tokens=inp,
                            output_tokens=out, warmup=b.warmup,
                            point_timeout_s=b.point_timeout_s, min_success=b.min_success,
                            output_tolerance=b.output_tolerance,
                            metrics_interval_s=b.metrics_interval_s, then=b.then)
    env = {"PYTHONUNBUFFERED": "1", **{k: _env_word(v) for k, v in dep.env.items()}}
    if d.api_key_env:  # both clients send it as a bearer token (bench_clients.CLIENTS)
        env["OPENAI_API_KEY"] = (Var(d.api_key_env),)
    return BenchPlan(client=client.name, title=client.title, python=python, tokenizer=tokenizer,
                     component=where[0], node_offset=where[1], points=tuple(points),
                     env=tuple(env.items()), spec=spec)


def _bench_client(d: _Draft) -> tuple:
    """The benchmark's client, and the python that has it: benchmark.python, else the
    site's python for that client's engine, else the engine's own (when it is the engine's
    client and the engine is real), else the container's (or the node's) python3."""
    dep = d.cfg.deployment
    b = dep.benchmark
    client = CLIENTS[d.adapter.bench_client if b.client == "auto" else b.client]
    own = None if dep.engine.simulate or client.name != d.adapter.bench_client else (
        dep.engine.python)
    return client, (b.python or d.cfg.site.paths.engine_python.get(client.name) or own
                    or "python3")


PREFLIGHT_TIME = "00:10:00"


def preflight_only(p: Plan) -> Plan:
    """`hpcserve preflight`: the same allocation (components, nodes, directives), for ten
    minutes and without requeues, whose job runs the preflight checks and ends."""
    return replace(_short_job(p, PREFLIGHT_TIME),
                   preflight={**p.preflight, "enabled": True, "only": True})


def with_stage(cfg: Resolved) -> Resolved:
    """The configuration with model.stage on, whatever the file says (`hpcserve stage`)."""
    dep = cfg.deployment
    return replace(cfg, deployment=replace(dep, model=replace(dep.model, stage=True)))


def stage_only(p: Plan) -> Plan:
    """`hpcserve stage`: the same allocation, without requeues, whose job stages the model on
    every node and ends: nodes warmed ahead of time (a plan of with_stage's configuration)."""
    return replace(_short_job(p, p.time_limit), stage={**p.stage, "only": True})


def _short_job(p: Plan, time_limit: str) -> Plan:
    """The plan's allocation for a job that runs no engine: its time limit, no requeue."""
    swap = {"time": ("time", time_limit), "requeue": ("no-requeue", None)}
    comps = tuple(replace(c, directives=tuple(swap.get(k, (k, v)) for k, v in c.directives))
                  for c in p.components)
    return replace(p, components=comps, time_limit=time_limit, requeue=0, benchmark=None)


def in_allocation(p: Plan) -> Plan:
    """`--in-allocation`: the same job, run as steps of an allocation the user already holds
    (hpcserve_runtime/allocation.py maps the components onto its nodes), never requeued: the
    allocation is the user's, not the deployment's."""
    return replace(p, in_allocation=True, requeue=0)


# What a site's node.gpu_type says when its nodes have no NVIDIA GPU (the local test cluster).
NO_GPU_TYPES = ("simulated", "cpu", "none")


def _preflight(d: _Draft, router: RouterPlan | None) -> dict:
    """What the preflight checks on every node (the runtime adds each node's own ports)."""
    dep, site = d.cfg.deployment, d.cfg.site
    pf = dep.preflight
    simulate = dep.engine.simulate
    gpus_why = ("the engine is simulated" if simulate else
                f"site node.gpu_type is {site.node.gpu_type}: no GPUs to check"
                if site.node.gpu_type.lower() in NO_GPU_TYPES else None)
    tools = ["ip"]  # address discovery reads `ip -j addr`
    if site.container.runtime in ("enroot", "apptainer"):
        tools.append(site.container.runtime)
    elif site.container.runtime == "none":
        # the programs the steps start on the host: the engine's and the router's
        progs = [_engine_python(d) if simulate else d.adapter.command(_engine_python(d))[0]]
        if router is not None:
            progs.append(router.command[0])
        if dep.benchmark is not None:
            progs.append(_bench_client(d)[1])
        tools += [p for p in dict.fromkeys(progs) if isinstance(p, str) and p not in tools]
    return {"enabled": pf.enabled, "only": False,
            "mpi": pf.mpi == "pmix" or (pf.mpi == "auto" and
                                        any(i.mpi == "pmix" for i in d.instances)),
            "waive": list(pf.waive), "max_clock_skew_s": pf.max_clock_skew_s,
            "min_shm_bytes": int(pf.min_shm_gb * 1024 ** 3),
            "min_gpu_free_fraction": pf.min_gpu_free_fraction,
            "gid_index": site.network.gid_index, "gpus": {"why": gpus_why},
            "fabric": ({"domain_nodes": site.fabric.nvlink_domain_nodes}
                       if site.fabric and site.fabric.check else None),
            "model_optional": "the simulated engine reads no weights" if simulate else None,
            "tools": tools}


def _instance_env(cfg: Resolved, ctx: RoleContext, launch, gpu_ids: str | None,
                  caches: tuple = ()) -> list:
    """Derived fabric settings, the engine's defaults and caches, then site/deployment/role
    env."""
    interface, ib = cfg.site.network.interface, cfg.site.network.ib_devices
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
    env.update(launch.env)
    env.update((c.var, c.path) for c in caches)
    env.update(site_env)
    for k, v in cfg.deployment.env.items():
        env[k] = _env_word(v)
    for k, v in ctx.settings["env"].items():
        env[k] = _env_word(v)
    for k, v in launch.late_env:
        env.setdefault(k, v)
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = gpu_ids
    return list(env.items())
