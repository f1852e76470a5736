"""The engine seam: what every engine adapter provides, and what the planner hands it.

config, plan, render and the in-job runtime call these interfaces and never name an engine; an
engine is one module here (its adapter) plus its simulated stand-in under hpcserve/sim/.

An adapter owns, for its engine:
- its settings vocabulary (a dataclass of named settings; a model profile's section of the same
  name holds its defaults) and its flag matrix per release (engines/flags.py);
- topology validation: from an instance's GPUs and nodes and the merged settings, the parallel
  layout (`layout`), or a FlagError naming the setting that cannot work;
- the ports each role needs (`ports`), handed out by the planner's one registry;
- the launch: tasks per node (one per node, or one per GPU under `srun --mpi=pmix`), the argv
  common to every node and the per-node-rank differences (`--headless`, DP start ranks), all
  computed here, rendered as they are, never computed in shell;
- its environment, the readiness probe, how it stops, and its router (`RouterAdapter`).

TensorRT-LLM runs one task per GPU (Layout.tasks_per_node, Layout.mpi = "pmix"; every task's
log is its own) with an LLM API options file that Launch.files writes into the job directory;
its front server `trtllm-serve disaggregated -c FILE` takes the workers from a file that
RouterAdapter.config_files writes in the task once the addresses are known. KTransformers is
SGLang with `--kt-*` settings and the node's CPUs: a vocabulary, and a layout whose
cpus_per_task and srun_args reach the Slurm request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from .. import package_data
from ..author.schema import doc
from ..author.values import ENV_NAME, FLAG_NAME, check_secrets
from ..author.words import Var, Word
from .flags import FlagError, FlagMatrix, Release, Vocabulary, arg_words, check_not_empty

SIM_DIR = package_data.path("sim")


def args_field(key_pattern: str = FLAG_NAME) -> Any:
    """A vocabulary's raw `args`: more engine flags as they are, each checked against the
    release's flag table."""
    return field(default_factory=dict, metadata=doc(
        "more engine flags, name without dashes -> value (true = bare flag, null = remove a "
        "default, a list = several values)", key_pattern=key_pattern))


def env_field() -> Any:
    return field(default_factory=dict, metadata=doc("environment of the engine processes",
                                                    key_pattern=ENV_NAME))


def gpus_from(ctx: "RoleContext") -> str:
    """What an instance's GPU count comes from, in the deployment's own terms."""
    if ctx.shared:
        return f"gpus: {ctx.gpus}, a share of a node"
    return f"nodes {ctx.nodes} x {ctx.gpus // ctx.nodes} GPUs per node"


def instance_gpus(ctx: "RoleContext") -> str:
    return f"the instance's {ctx.gpus} GPUs ({gpus_from(ctx)})"


def _size(ctx: "RoleContext", name: str, value: int) -> str:
    """A parallel size as the user knows it: written in the role, set by the model profile, or
    hpcserve's default."""
    if ctx.settings.get(name) is None:
        return f"{name} {value} (default)"
    return f"{name} {value}" + ("" if name in ctx.own else " (model profile)")


def _blame(ctx: "RoleContext", names: tuple[str, ...]) -> tuple:
    """The first of `names` the role itself set (an error points at its line), else the role."""
    return next(((n,) for n in names if n in ctx.own), ())


def derived_tp(ctx: "RoleContext", factors: tuple[str, ...] = ("pp",),
               why: str = "") -> tuple[int, dict[str, int]]:
    """tp and the other parallel sizes (`factors`, each 1 when unset) of an instance, whose
    product must use its GPUs exactly: tp defaults to GPUs / (the product of the others).
    A refusal names the sizes the user wrote, which were defaults, and what tp derives from."""
    st = ctx.settings
    sizes = {n: st[n] or 1 for n in factors}
    product = math.prod(sizes.values())
    if st["tp"]:
        tp = st["tp"]
        if tp * product != ctx.gpus:
            terms = [_size(ctx, n, v) for n, v in [("tp", tp), *sizes.items()]
                     if n == "tp" or st[n]]
            total = f" = {tp * product}" if len(terms) > 1 else ""
            raise FlagError(_blame(ctx, ("tp", *factors)),
                            f"{' x '.join(terms)}{total} must equal {instance_gpus(ctx)}{why}")
        return tp, sizes
    if ctx.gpus % product:
        set_ = [n for n in factors if st[n]]
        terms = " x ".join(_size(ctx, n, sizes[n]) for n in set_)
        raise FlagError(_blame(ctx, factors),
                        f"{terms}{f' = {product}' if len(set_) > 1 else ''} does not divide "
                        f"{instance_gpus(ctx)}: tp is derived as GPUs / "
                        f"({' x '.join(factors)}), so set tp too or choose "
                        f"{' x '.join(factors)} dividing {ctx.gpus}{why}")
    return ctx.gpus // product, sizes


def tp_words(ctx: "RoleContext", tp: int, factors: tuple[str, ...] = ("pp",)) -> str:
    """tp in a message: as written, or how hpcserve derived it."""
    if ctx.settings.get("tp"):
        return _size(ctx, "tp", tp)
    sizes = " x ".join(f"{n} {ctx.settings.get(n) or 1}" for n in factors)
    return f"tp {tp} (derived: {ctx.gpus} GPUs / {sizes if len(factors) == 1 else f'({sizes})'})"


def tp_pp(ctx: "RoleContext", why: str = "") -> tuple[int, int]:
    """(tp, pp) of an instance: tp defaults to its GPUs / pp, and tp x pp must use them all."""
    tp, sizes = derived_tp(ctx, ("pp",), why)
    return tp, sizes["pp"]


class SettingsBase:
    """Mixin of every engine's settings dataclass: secrets only by name, in args and env."""

    def validate(self) -> None:
        check_secrets(getattr(self, "args"), "args", args=True)
        check_secrets(getattr(self, "env"), "env", args=False)


def setting_names(settings_cls: type) -> tuple[str, ...]:
    """The named settings of a vocabulary (everything but the raw `args` and `env`)."""
    return tuple(f.name for f in fields(settings_cls) if f.name not in ("args", "env"))


@dataclass(frozen=True)
class PortRequest:
    """A port an instance needs on each of its nodes, from the plan's one registry.

    `width` consecutive ports are reserved when the engine derives more from the one it is given
    (a side channel per local rank); `field` names the role setting that moves the preferred port;
    `label` shows it in the job script's topology comment (None: not shown)."""

    kind: str
    preferred: int
    field: str | None = None
    stride: int = 1
    width: int = 1
    label: str | None = None


@dataclass(frozen=True)
class RoleContext:
    """One role of the deployment as the adapter sees it: the planner's topology facts and the
    settings merged from the profile's section and the role."""

    role: str                     # prefill, decode or worker
    pd: bool                      # prefill/decode disaggregation
    settings: dict[str, Any]      # named settings (None when unset), args, env
    own: frozenset                # the names the role itself set (errors point there)
    gpus: int                     # GPUs per instance
    nodes: int                    # nodes per instance
    shared: bool                  # several instances share a node
    architecture: Any = None      # the model profile's architecture, if any
    node: Any = None              # the site's node facts (GPUs, CPU cores, NUMA, memory)


@dataclass(frozen=True)
class Layout:
    """The parallel layout the adapter chose for every instance of a role."""

    parallel: tuple[tuple[str, int], ...]   # e.g. (("tp", 16), ("attn_dp", 16), ("ep", 16))
    ep: int | None = None                   # effective expert-parallel size (experts check)
    settings: Mapping[str, Any] = field(default_factory=dict)  # settings as they are spelled
    tasks_per_node: int = 1                 # >1: one task per GPU
    mpi: str | None = None                  # "pmix": srun --mpi=pmix
    cpus_per_task: int | None = None        # CPUs the engine computes on (sbatch and srun)
    host_weight_bytes: float = 0.0          # weights kept in host memory, not on the GPUs
    mem_gb: int | None = None               # host memory per node, when the site asks none
    srun_args: tuple[str, ...] = ()         # e.g. --cpu-bind=none: the engine pins itself

    def size(self, name: str) -> int | None:
        return dict(self.parallel).get(name)


@dataclass(frozen=True)
class MemoryBudget:
    """What the engine leaves for the KV cache on one GPU, and the rule with its numbers."""

    kv_bytes: float
    how: str                        # "mem_fraction_static 0.904 x 141 GB - weights"
    kv_dtype_bytes: float = 2.0     # the KV cache's element size (BF16 unless set to FP8)


def kv_dtype_bytes(value: Any) -> float:
    """fp8, fp8_e4m3, FP8 ... are one byte; anything else (auto: the model's BF16) two."""
    return 1.0 if value and str(value).lower().startswith("fp8") else 2.0


@dataclass(frozen=True)
class Net:
    """What the launch needs of the site's network: the IB device word for the engine's own
    flag (a Var when discovered on the node), whether there are HCAs at all."""

    ib_word: Word | None
    has_ib: bool
    iface: Word | None = None  # the interface engines bind (site.network.interface, resolved)


@dataclass(frozen=True)
class Launch:
    argv: tuple[Word, ...]                      # the same on every node of the instance
    rank_argv: tuple[tuple[Word, ...], ...] = ()  # per node rank: what that rank adds
    env: tuple[tuple[str, Word], ...] = ()      # engine defaults the user's env may override
    late_env: tuple[tuple[str, Word], ...] = ()  # set last unless the user set them
    router_args: tuple[Word, ...] = ()          # what the router needs for this instance
    warnings: tuple[str, ...] = ()
    # Files the engine reads, by path relative to the job directory -> text, written at render
    # time (an options file, fixed by the plan; what needs addresses is written in the task).
    files: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RouterReadiness:
    """How the orchestrator knows the router routes to every worker: GET `path` answers 200 and
    the JSON numbers at the dotted paths `count` add up to at least the expected workers."""

    path: str
    count: tuple[str, ...]


@dataclass(frozen=True)
class CacheVar:
    """A compile or JIT cache that the engine's release reads from an environment variable.
    hpcserve points `var` at <cache_dir>/<model>/<engine>-<release>/<gpu type>/<name> so that it
    outlives the job; `since` is the release whose source was read for it (older releases do not
    get it), `probe` the part of the directory only compiled artifacts fill ("" the whole of it):
    the cache is warm when the probe holds a file as the engine starts."""

    name: str
    var: str
    since: str
    probe: str = ""


@dataclass(frozen=True)
class Metrics:
    """The engine's Prometheus metrics, read while serving to tell a hung engine from a busy
    one: `progress` counters move while it works; `pending` gauges count the requests it
    holds. A drain (`hpcserve scale --remove`) waits for those and for the `queued` gauges:
    requests it holds that wait (for memory, or for their KV), which its stop would fail.
    Autoscaling (roles.<role>.autoscale.signal) reads `pending` as running, `queued` as queued
    and `kv_usage` (the KV cache's used share, 0 to 1) per instance."""

    path: str
    progress: tuple[str, ...]
    pending: tuple[str, ...]
    queued: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()
    # Where the gauges (pending, queued, kv_usage) are read, where not at `path`: an engine
    # whose /metrics sees only some of its schedulers reports every one's load there. Each of
    # its label sets is one scheduler (one DP rank): they add up.
    gauges_path: str | None = None


class RouterAdapter:
    name: str               # as shown to people: "sglang-router"
    owned: frozenset        # flags the plan writes; router.args may not repeat them
    refused: Mapping[str, str] = {}  # router.args keys hpcserve cannot honour, and why
    package: str | None = None       # the Python package it runs from (launch_router())
    # Where the real router cannot run without the engine (TensorRT-LLM's front server is part
    # of TensorRT-LLM), a simulated deployment runs the engine's stand-in with these arguments
    # in its place; None: the real router runs in front of simulated engines too.
    stand_in: tuple[str, ...] | None = None
    # Where it serves Prometheus text on its metrics port (plan.json router.prometheus_port);
    # None: it has no Prometheus endpoint, and no scrape target is listed for it.
    metrics_path: str | None = None
    # The router.args key of its API key, which it asks of every client and hands to the
    # workers (the deployment's, plan.py _with_api_key); None: it takes none.
    api_key_flag: str | None = None

    def readiness(self, pd: bool) -> RouterReadiness:
        raise NotImplementedError

    def keys_workers(self, pd: bool) -> bool:
        """Whether each request it sends a worker carries a key the worker can check (its own
        key, or the client's passed on): only then can the engines behind it ask for one."""
        return False

    def workers_api(self, pd: bool) -> str:
        """How the in-job runtime takes a failed instance out of the running router and puts its
        replacement back (runtime/contract.py WORKERS_APIS): the kind of the router's worker API, or
        "restart" where the router cannot change its workers while it runs (the runtime then
        restarts it with the new set)."""
        return "restart"

    def command(self, python: str) -> list[Word]:
        raise NotImplementedError

    # The routers' Python debugging balancer: not a router hpcserve can run (no worker API, no
    # metrics), so a deployment asking for it is refused.
    NO_MINI_LB = {"mini-lb": "(the router's Python debugging balancer) cannot be started by "
                             "hpcserve, which runs the Rust router"}

    def launch_router(self, python: str) -> list[Word]:
        """`python -m <package>.launch_router`, as sglang-router and vllm-router document it."""
        return [python, "-m", f"{self.package}.launch_router"]

    # The address the router listens on (its port and its metrics'): its node's address on the
    # site's interface, which the runtime writes to run/endpoints.env before the router's step,
    # and the deployment's endpoint names. Not every address of the node (0.0.0.0): a
    # node's other networks need not reach it.
    HOST: Word = (Var("ROUTER_IP"),)

    def argv(self, *, pd: bool, prefill: list[tuple[Word, int | None]], decode: list[Word],
             workers: list[Word], port: int, prometheus_port: int, policy: str,
             args: dict[str, Any], start_timeout: int) -> list[Word]:
        """The router's argv; `start_timeout` is how long the engines may take to load (a
        router that waits for its workers at start must wait that long)."""
        raise NotImplementedError

    def config_files(self, *, pd: bool, prefill: list[tuple[Word, int | None]],
                     decode: list[Word], workers: list[Word], port: int) -> dict[str, list[Word]]:
        """Files the router reads, by name under run/, one Word per line: written by its launch
        script in the task, after discovery, so the workers' addresses are known (a front server
        that takes its workers from a config file, as `trtllm-serve disaggregated -c` does)."""
        return {}

    def extra_args(self, args: dict[str, Any]) -> list[Word]:
        """router.args as words, refusing what the plan writes itself."""
        w: list[Word] = []
        for name, value in args.items():
            if name in self.refused:
                raise FlagError(("args", name), f"--{name} {self.refused[name]}")
            if "--" + name in self.owned:
                raise FlagError(("args", name), f"--{name} is set by hpcserve from the plan "
                                                "(router port/policy, worker URLs); use the "
                                                "router's own keys")
            check_not_empty(("args", name), "--" + name, value)
            w += arg_words("--" + name, value)
        return w


class NoRouter(RouterAdapter):
    """For a deployment that cannot have a router: `router.enabled: true` is refused, saying
    why."""

    name = "none"
    owned = frozenset()

    def __init__(self, why: str):
        self.why = why

    def command(self, python: str) -> list[Word]:
        return []

    def readiness(self, pd: bool) -> RouterReadiness:
        return RouterReadiness("/health", ())

    def argv(self, **_) -> list[Word]:
        raise FlagError(("enabled",), f"{self.why}: set router.enabled: false (each instance "
                                      "serves at its leader node's address)")


class EngineAdapter:
    name: str                # engine.name in a deployment, and the profile section
    title: str               # "SGLang"
    settings: type           # the settings vocabulary (a dataclass, SettingsBase)
    matrix: FlagMatrix
    vocabulary: Vocabulary
    router: RouterAdapter
    sim_file: str            # the stand-in under hpcserve/sim/, copied as hpcserve_sim.py
    port_fields: dict[str, str] = {}  # role keys that move a port's first value -> their doc
    health_path: str = "/health"   # asked until the instance is ready
    # The engine's facts (engines/facts.py), each proved against its pinned release by
    # tests/facts/: the names it reads, what its health paths prove.
    facts: Mapping[str, Any] | None = None
    # Asked while serving (None: health_path); where it proves generation (facts: "proves"), an
    # answer is progress, and the engine holding requests under still counters is not hung.
    liveness_path: str | None = None
    # Seconds without a sign of progress (a counter moving, a generating health path answering)
    # after which failed probes name an instance hung: longer than the engine's longest
    # legitimate step (docs/operating.md, "Liveness"); roles.<role>.hung_after overrides it.
    hung_after: float = 20
    # Prometheus metrics that show progress (None: the engine exposes none hpcserve reads).
    metrics: Metrics | None = None
    stop_signal: str = "TERM"
    # the engine's own serving benchmark client (bench_clients.CLIENTS), which benchmark: runs
    bench_client: str = "vllm"
    # The engine leaves temporary files behind (IPC sockets, rendezvous files, compile caches):
    # give each task a TMPDIR of the job's own on its node, removed after the job's steps ended.
    scratch: bool = False
    # The caches the engine's releases read (CacheVar), each read in the release it names.
    caches: tuple = ()
    # The args key of the API key its HTTP server asks of every request but health and metrics
    # (the deployment's, plan.py _with_api_key); None: it takes none hpcserve can keep off its
    # command line (docs/security.md).
    api_key_flag: str | None = None

    # Releases whose prefill and decode instances hand KV caches to each other, each group one
    # set (a rolling upgrade of a PD deployment serves old and new ones side by side). Empty:
    # a release talks only to itself. No engine's docs promise a KV transfer across releases:
    # SGLang's PD disaggregation guide and its Mooncake/NIXL backends name none, and vLLM's
    # NixlConnector refuses a peer whose handshake hash differs, which hashes the vLLM version
    # (vllm/distributed/kv_transfer/kv_connector/v1/nixl: compute_nixl_compatibility_hash).
    pd_release_groups: tuple[frozenset[str], ...] = ()

    def liveness(self, pd: bool = False) -> tuple[str, bool]:
        """(path, whether its 200 proves generation) of the probe asked while serving (`pd`: on
        an instance of a disaggregated pair, where the facts may name another)."""
        facts = self.facts or {}
        path = (pd and facts.get("liveness_path_pd")) or self.liveness_path or self.health_path
        proves = (facts.get("health") or {}).get(path, {}).get("proves")
        return path, proves == "generation"

    def pd_talks(self, a: str, b: str) -> bool:
        """Whether prefill at release `a` and decode at `b` (or the other way) work together."""
        return a == b or any({a, b} <= g for g in self.pd_release_groups)

    def cache_vars(self, rel: Release) -> tuple:
        """The caches of `rel`: those read in its release or an earlier one."""
        return tuple(c for c in self.caches if rel.at_least(c.since))

    def release(self, version: str, check_as: str | None = None) -> Release:
        return self.matrix.release(version, check_as)

    def layout(self, rel: Release, ctx: RoleContext) -> Layout:
        raise NotImplementedError

    def ports(self, ctx: RoleContext, layout: Layout) -> list[PortRequest]:
        raise NotImplementedError

    def launch(self, rel: Release, ctx: RoleContext, layout: Layout, ports: dict[str, int], *,
               model_path: str, served_name: str, net: Net) -> Launch:
        raise NotImplementedError

    def command(self, python: str) -> list[Word]:
        """The real engine's program; its argv (Launch.argv) follows."""
        raise NotImplementedError

    def describe(self, parallel: tuple[tuple[str, int], ...]) -> str:
        """The parallel layout for people: "TP 16, DP-attention 16, EP 16"."""
        raise NotImplementedError

    def memory_budget(self, settings: dict, layout: Layout, gpu_bytes: float,
                      weights: float) -> MemoryBudget | None:
        """The KV cache's share of one GPU holding `weights` bytes, by the engine's own memory
        rule (None: not modelled)."""
        return None

    def instance_smoke(self, pd: bool) -> tuple[str, str]:
        """How a restarted instance is checked on its own before it goes back into the router:
        ("chat", path) sends one chat completion that must return tokens; ("get", path) must
        answer 200 (an engine whose health path generates, or a PD half that cannot answer a
        chat alone)."""
        return ("chat", "/v1/chat/completions")

    def router_for(self, pd: bool) -> RouterAdapter:
        """The router in front of the instances (an engine may use another one for PD)."""
        return self.router

    # The engine's start-up lines by release (runtime/startup.py): "weights_loaded" and "ready",
    # each a regex of a line verified in that release's source. A release not listed, or a line
    # it does not print, is None: its start-up phases show as unknown.
    startup_patterns: Mapping[str, Mapping[str, str | None]] = {}

    def startup_lines(self, rel: Release) -> dict[str, str | None]:
        lines = self.startup_patterns.get(rel.version, {})
        return {"weights_loaded": lines.get("weights_loaded"), "ready": lines.get("ready")}

    def sim_source(self) -> Path:
        return SIM_DIR / self.sim_file

    def settings_argv(self, rel: Release, settings: dict[str, Any]) -> tuple[list, list[str]]:
        return self.vocabulary.settings_argv(rel, self.matrix, settings)
