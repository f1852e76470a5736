"""Configuration: the deployment file, the site it names and the model profile, merged and validated.

Three sources, one direction: a site file (cluster facts), a model profile (architecture facts and
engine defaults) and the deployment file (what is specific to this run), plus `--set` overrides.
The result is an immutable, fully validated `Resolved` that the planner consumes.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field, make_dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from .. import engines, package_data
from ..engines.base import setting_names
from ..engines.bench_clients import CLIENTS
from ..errors import ConfigError, echo, escape, shorten
from ..runtime.contract import AUTOSCALE_SIGNALS
from .schema import FieldProblem, Validator, doc, json_schema, schema_ref
from .values import ENV_NAME, FLAG_NAME, NAME, ArgValue, EnvValue, check_secrets, looks_secret
from .yamlsrc import Origin, Positions, check_string, format_path, load_file, load_text

BUNDLED_SITES = package_data.path("site_configs")
BUNDLED_PROFILES = package_data.path("models")

TIME = r"(\d+-)?\d{1,3}:\d{2}:\d{2}"
# A duration: seconds (900, 1.5), with a unit (90s, 15m, 1.5h), or a Slurm time (00:15:00)
DURATION = rf"\d+(\.\d+)?[smh]?|{TIME}"
DURATION_HELP = "seconds, or a duration such as 90s, 15m, 1h or 00:15:00"
# sbatch(1), --signal: "sig_time must have an integer value between 0 and 65535"
SIGNAL_MAX_S = 65535
# Job directories become sbatch's --output: % starts a Slurm filename pattern (%j, %x...) and a
# backslash turns them off, so a path holding either would not be the path written.
JOB_PATH = r"[^%\\]+"
JOB_PATH_HELP = ("a job directory path without % or \\ (sbatch reads them as filename "
                 "patterns in --output)")
# The stage directory reaches the engines' argv and the container's mounts.
STAGE_PATH = r"/[^\s,:%\\]*"
STAGE_PATH_HELP = "an absolute path without whitespace, ',', ':', '%' or '\\'"
VERSION = r"\d+\.\d+(\.\d+){0,2}(rc\d+)?(\.?post\d+)?"
VERSION_HELP = "a release such as 0.5.23, 0.10.1.1, 0.4.9.post6 or 1.2.0rc2"
# Literal[...] of the engines hpcserve has adapters for; the annotation below is evaluated here.
EngineName = Literal[engines.names()]
ROUTER_FLAG = r"[a-z0-9][a-z0-9_-]*"
# int4: 4 bits and a BF16 scale per 32 weights (Kimi-K2-Thinking's compressed-tensors format)
DTYPE_BYTES = {"fp8": 1.0, "int4": 0.5625, "bf16": 2.0, "fp16": 2.0}  # trtllm-serve disaggregated spells its options with _


# ------------------------------------------------------------------------------------------ site

@dataclass(frozen=True)
class SlurmOptions:
    """What sbatch is asked for; repeated in every het-job component."""

    partition: str | None = field(default=None, metadata=doc("Slurm partition (-p)"))
    account: str | None = field(default=None, metadata=doc("Slurm account (-A)"))
    qos: str | None = field(default=None, metadata=doc("Slurm QOS"))
    constraint: str | None = field(default=None, metadata=doc("node features (-C)"))
    reservation: str | None = None
    exclusive: bool = field(default=True, metadata=doc("whole nodes (--exclusive)"))
    request_gpus: bool = field(default=True, metadata=doc(
        "request node.gpus GPUs per node with --gpus-per-node (false on clusters without GRES, "
        "such as the local test cluster)"))
    gres: str | None = field(default=None, metadata=doc(
        "request GPUs with --gres instead, e.g. gpu:h200:8"))
    mem: str | None = field(default=None, metadata=doc("--mem per node, e.g. 0 for all memory"))
    max_nodes: int | None = field(default=None, metadata=doc(
        "the partition's node limit; a deployment needing more is refused before submission",
        ge=1))
    extra_directives: dict[str, EnvValue] = field(default_factory=dict, metadata=doc(
        "more #SBATCH options, option name without dashes -> value (true for a bare flag)",
        key_pattern=FLAG_NAME))
    signal_grace: int = field(default=120, metadata=doc(
        "seconds before the time limit at which the job starts its orderly teardown "
        "(--signal=B:TERM@N)", ge=10, le=3600))


@dataclass(frozen=True)
class NodeFacts:
    gpus: int = field(default=8, metadata=doc("GPUs per node", ge=1, le=64))
    gpu_type: str = field(default="H200", metadata=doc("GPU model, informational"))
    gpu_memory_gb: float = field(default=141.0, metadata=doc(
        "memory per GPU as GPUs are named and nvidia-smi counts it (GiB): 141 for H200, 80 for "
        "H100", ge=1))
    cpu_cores: int | None = field(default=None, metadata=doc(
        "physical CPU cores per node (engines that compute on CPUs, KTransformers, plan their "
        "threads from it)", ge=1, le=4096))
    cpus: int | None = field(default=None, metadata=doc(
        "CPUs per node as Slurm counts them (hardware threads where they are enabled); "
        "default: cpu_cores", ge=1, le=16384))
    numa_nodes: int | None = field(default=None, metadata=doc("NUMA nodes per node", ge=1,
                                                               le=64))
    memory_gb: float | None = field(default=None, metadata=doc(
        "host memory per node in GB (checked against what CPU-side experts need)", ge=1))


# A container image reference; one pinned by digest names it as enroot and Apptainer read it,
# @sha256: and 64 lower-case hex digits (the helpers check the import against it).
IMAGE_REF = r"(?!.*@sha256:(?![0-9a-f]{64}$)).+"
IMAGE_REF_HELP = ("an image path or reference; pinned by digest, it ends in @sha256: and 64 "
                  "lower-case hex digits")


@dataclass(frozen=True)
class ImageCache:
    """A site-wide cache of imported images: every user reads it, its owner alone writes it."""

    dir: str = field(metadata=doc(
        "the directory, on a file system every node mounts, that the owner's jobs import "
        "registry images into (0755, made by the owner's first job where missing)",
        pattern=STAGE_PATH, pattern_help=STAGE_PATH_HELP))
    owner: str = field(metadata=doc(
        "the user who alone imports into it; anyone else's job uses an image there only if it "
        "and its directory are this user's and writable by nobody else, and refuses to start "
        "where it is missing", pattern=r"[a-z_][a-z0-9_.-]{0,31}",
        pattern_help="a Unix user name such as hpcsvc"))


@dataclass(frozen=True)
class Container:
    runtime: Literal["pyxis", "enroot", "apptainer", "none"] = field(
        default="none", metadata=doc("how engines are started on the nodes"))
    image: str | None = field(default=None, metadata=doc(
        "default image: enroot/pyxis URI (nvcr.io#org/img:tag, pinned: ...@sha256:<digest>), "
        ".sqsh or .sif path", pattern=IMAGE_REF, pattern_help=IMAGE_REF_HELP))
    image_cache: ImageCache | None = field(default=None, metadata=doc(
        "a site-wide cache of registry images that one user (owner) imports and everyone "
        "reads; unset: each user imports into their own part of <jobs_dir>/.hpcserve-images"))
    mounts: list[str] = field(default_factory=list, metadata=doc(
        "SRC:DST[:ro] bind mounts; the job directory and the model path are added automatically",
        pattern=r"/[^,:\s]*:/[^,:\s]*(:(ro|rw))?",
        pattern_help="a mount SRC:DST or SRC:DST:ro of absolute paths without commas, colons "
                     "or whitespace (the container runtimes' mount syntax cannot hold them)"))
    workdir: str | None = None
    env: list[str] = field(default_factory=list, metadata=doc(
        "variable names forced from the host into the container even if the image sets them "
        "(pyxis --container-env)", pattern=ENV_NAME,
        pattern_help="an environment variable name such as NCCL_IB_HCA"))


@dataclass(frozen=True)
class Network:
    interface: str = field(default="auto", metadata=doc(
        "the interface whose address engines bind and advertise; auto = default route's",
        pattern=r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]*",
        pattern_help="an interface name such as ib0 or auto (not starting with -)"))
    ib_devices: list[str] | Literal["auto"] | None = field(default=None, metadata=doc(
        "HCAs for KV transfer and NCCL: a list, 'auto' (active ports found on the node), "
        "or null for none (TCP)", pattern=r"[A-Za-z0-9_.-]+(:\d+)?",
        pattern_help="an HCA name such as mlx5_0 (optionally with :port)"))
    env: dict[str, EnvValue] = field(default_factory=dict, metadata=doc(
        "NCCL_/GLOO_/UCX_/NVSHMEM_/MC_ environment for every engine", key_pattern=ENV_NAME))
    gid_index: int | None = field(default=None, metadata=doc(
        "the GID index the fabric uses (RoCE: the one NCCL_IB_GID_INDEX names); the preflight "
        "checks each IB port has a GID there", ge=0, le=255))

    def validate(self) -> None:
        check_secrets(self.env, "env", args=False)


@dataclass(frozen=True)
class Paths:
    jobs_dir: str = field(default="~/hpcserve-jobs", metadata=doc(
        "where job directories are written (must be on a file system the nodes share)",
        pattern=JOB_PATH, pattern_help=JOB_PATH_HELP))
    python: str = field(default="python3", metadata=doc(
        "python3 on the nodes (outside containers), used by the job's runtime helper"))
    engine_python: dict[str, str] = field(default_factory=dict, metadata=doc(
        "per engine name, the python that has it installed on the nodes (or in the image), "
        "e.g. {vllm: /opt/vllm/bin/python}; a deployment's engine.python wins, and a "
        "simulated engine (stdlib only) runs on python3",
        key_pattern=r"[a-z][a-z0-9_-]*"))
    router_python: str | None = field(default=None, metadata=doc(
        "the python that has the routers (default: the engine's)"))
    stage_dir: str | None = field(default=None, metadata=doc(
        "a node-local directory (the same path on every node, e.g. on local NVMe) where "
        "model.stage copies the model's files before the engines start: each user's in "
        "<stage_dir>/<user> (0700), one subdirectory per model, kept between jobs as a cache",
        pattern=STAGE_PATH, pattern_help=STAGE_PATH_HELP))
    stage_max_gb: float | None = field(default=None, metadata=doc(
        "the size bound of each user's part of stage_dir in GB (1e9 bytes): the least "
        "recently used models not in use are removed to keep to it; required with stage_dir",
        ge=0.001))
    cache_dir: str | None = field(default=None, metadata=doc(
        "where the engines' compile and JIT caches (Triton, torch.compile, DeepGEMM, FlashInfer) "
        "outlive the job: <cache_dir>/<user>/ (0700, refused if another user owns it), one "
        "directory per model, engine release and GPU type; null: none is kept (each engine "
        "uses its own default under $HOME)",
        pattern=r"/[^,:\s%\\]*",
        pattern_help="an absolute path without commas, colons, whitespace, % or \\ (it is "
                     "mounted into containers)"))
    cache_storage: Literal["node-local", "shared"] = field(default="shared", metadata=doc(
        "cache_dir is on each node's own disk (every node warms its own copy) or on a file "
        "system every node mounts (the first start warms it for all)"))

    def validate(self) -> None:
        if self.stage_dir and self.stage_max_gb is None:
            raise FieldProblem("stage_dir", "needs stage_max_gb too (the cache's size bound "
                                            "in GB)")


# Slurm's placement directives for NVLink domains: --switches (topology/tree) in every release
# the project supports; --segment (topology/block) from Slurm 24.05 (NEWS: "Add --segment to job
# allocation to be used in topology/block"; topology/block itself came in 23.11).
SEGMENT_SINCE = (24, 5)


@dataclass(frozen=True)
class Fabric:
    """The nodes' NVLink domains (GB200/GB300 NVL72: 18 nodes of 4 GPUs per rack) and how Slurm
    knows them: each instance is asked to stay inside one domain, an instance larger than a
    domain is refused, and the preflight checks that an instance's nodes share one fabric."""

    nvlink_domain_nodes: int = field(metadata=doc(
        "nodes per NVLink domain (GB200 NVL72: 18)", ge=1, le=100_000))
    topology: Literal["block", "tree", "none"] = field(metadata=doc(
        "the site's Slurm TopologyPlugin: block (each NVLink domain a BlockName; hpcserve asks "
        "--segment=<nodes per instance>, Slurm 24.05+), tree (each domain a leaf SwitchName; "
        "--switches=1 for a role whose nodes fit one domain), none (no directive: only the "
        "checks)"))
    slurm_version: str | None = field(default=None, metadata=doc(
        "the site's Slurm release, e.g. 24.11 (topology block needs 24.05 or later)",
        pattern=r"\d{2}\.\d{2}(\.\d+)?", pattern_help="a Slurm release such as 24.11 or 22.05.8"))
    check: bool = field(default=True, metadata=doc(
        "the preflight checks that every node of an instance reports one NVLink fabric "
        "(nvidia-smi -q: Fabric State Completed, Status Success, one ClusterUUID and CliqueId)"))

    def validate(self) -> None:
        if self.topology == "block" and self.slurm_version:
            got = tuple(int(x) for x in self.slurm_version.split(".")[:2])
            if got < SEGMENT_SINCE:
                raise FieldProblem(
                    "slurm_version", "topology block places instances with sbatch --segment, which Slurm 24.05 "
                    f"added; this site runs {self.slurm_version} (use topology: tree, with "
                    "each NVLink domain a leaf switch in topology.conf)")


@dataclass(frozen=True)
class SiteMetrics:
    """How the site's Prometheus finds a deployment's metrics while it serves."""

    file_sd_dir: str | None = field(default=None, metadata=doc(
        "a directory the site's Prometheus reads with file_sd_configs (on a file system the "
        "batch host writes): each job keeps a file there listing its engines' and router's "
        "metrics endpoints while it serves, and removes it at the end; null: none is written",
        pattern=r"[/~][^\x00-\x1f]*",
        pattern_help="an absolute path (or one starting with ~) without control characters"))


@dataclass(frozen=True)
class Site:
    """A cluster: Slurm options, node facts, container runtime, network and paths."""

    name: str = field(default="site", metadata=doc("site name", pattern=NAME))
    description: str = ""
    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    node: NodeFacts = field(default_factory=NodeFacts)
    container: Container = field(default_factory=Container)
    network: Network = field(default_factory=Network)
    paths: Paths = field(default_factory=Paths)
    metrics: SiteMetrics = field(default_factory=SiteMetrics)
    fabric: Fabric | None = field(default=None, metadata=doc(
        "the NVLink domains instances must stay inside (multi-node NVLink racks); unset: none"))


# ----------------------------------------------------------------------------------- deployment

@dataclass(frozen=True)
class SimFault:
    """A fault the simulated engine injects (simulate: true only)."""

    kind: Literal["exit", "hang", "slow", "unhealthy", "empty", "kv_lost"] = field(
        default="exit", metadata=doc(
            "hang: the engine core wedges (each engine's probes answer as the real one's do); "
            "slow: /health answers only after delay seconds while generation goes on; "
            "empty: answers with 0 output tokens; kv_lost: a prefill that hands its KV to no "
            "decode (both after after_requests requests answered as usual)"))
    after: float = field(default=0.0, metadata=doc("seconds after start", ge=0))
    on_signal: bool = field(default=False, metadata=doc(
        "exit, hang, slow: wait for SIGUSR1 to the engine process instead of `after` seconds "
        "(a test fires the fault once the deployment serves, however slow the machine)"))
    after_requests: int = field(default=0, metadata=doc(
        "empty, kv_lost: generation requests answered as usual first", ge=0))
    delay: float = field(default=8.0, metadata=doc("slow: seconds each health probe takes",
                                                   ge=0))
    exit_code: int = field(default=1, metadata=doc("", ge=0, le=255))
    instances: list[int] | None = field(default=None, metadata=doc("instances hit (default all)"))
    attempts: list[int] | None = field(default=None, metadata=doc(
        "attempts hit, 0 the first start and 1.. its restarts (default all)"))
    ranks: list[int] | None = field(default=None, metadata=doc("node ranks hit (default all)"))


@dataclass(frozen=True)
class Recovery:
    """What happens when one instance of the role fails while the deployment serves (its step
    exits, it hangs, its node is lost, its port is taken): it is taken out of the router, its
    steps are stopped, and it starts again (on a spare node where one of its nodes is lost),
    is checked, and put back, while the others serve."""

    restart: bool = field(default=True, metadata=doc(
        "start a failed instance again (false: it stays out)"))
    max_restarts: int = field(default=3, metadata=doc(
        "restarts of one instance before it stays out for good", ge=0, le=1000))
    backoff_s: float = field(default=5.0, metadata=doc(
        "seconds before the first restart; each further restart of the instance waits twice "
        "as long", ge=0, le=3600))
    min_serving: int = field(default=1, metadata=doc(
        "instances of the role that must serve for the deployment to count as serving; the "
        "deployment fails when fewer serve and no restart is left", ge=0, le=100_000))


def duration_s(v: float | str) -> float:
    """Seconds of a DURATION field (a number of seconds, 90s / 15m / 1.5h, or a Slurm time
    [D-]HH:MM:SS, as TIME); whole seconds as an int, so plan.json says 900, not 900.0."""
    if isinstance(v, str) and ":" in v:
        days, _, hms = v.rpartition("-")
        h, m, sec = (int(x) for x in hms.split(":"))
        got: float = int(days or 0) * 86400 + h * 3600 + m * 60 + sec
    elif isinstance(v, str):
        got = float(v.rstrip("smh")) * {"s": 1, "m": 60, "h": 3600}.get(v[-1:], 1)
    else:
        got = float(v)
    return int(got) if got == int(got) else got


@dataclass(frozen=True)
class Autoscale:
    """Instances of the role added and removed on load while the deployment serves: each one an
    instance job of its own, rendered at submit (spare "slots" under the job directory's
    scale/), submitted when the signal per instance is above `target` and drained when one
    fewer would still be below it; never past min/max, never twice within `cool_down`."""

    min: int = field(metadata=doc("fewest instances of the role (a slot is added below it)",
                                  ge=0, le=100_000))
    max: int = field(metadata=doc("most instances of the role, the front's own included",
                                  ge=1, le=100_000))
    signal: Literal[AUTOSCALE_SIGNALS] = field(default="queued", metadata=doc(
        "queued: requests waiting in the engine; running: requests it runs; kv_usage: its "
        "KV-cache usage (0 to 1); per serving instance"))
    target: float = field(default=4.0, metadata=doc(
        "the signal per instance the role is sized for", ge=0, le=1e9))
    cool_down: float | str = field(default="60s", metadata=doc(
        "no decision within this long after the last one", pattern=DURATION,
        pattern_help=DURATION_HELP))
    interval: float = field(default=5.0, metadata=doc("seconds between two readings",
                                                      ge=0.1, le=3600))
    drain_timeout: float = field(default=120.0, metadata=doc(
        "seconds a removed instance's in-flight requests may take", ge=0, le=86400))

    def validate(self) -> None:
        if self.min > self.max:
            raise FieldProblem("min", f"must be at most max ({self.max}), got {self.min}")
        if not isinstance(self.cool_down, str) and self.cool_down < 0:
            raise FieldProblem("cool_down", f"must be at least 0, got {self.cool_down}")
        if self.target <= 0:
            raise FieldProblem("target", "must be above 0")


# The keys every role has whatever its engine; role_type() adds the engine's settings and ports.
ROLE_FIELDS = (
    # Bounds far above any cluster, so a mistyped count is refused before anything is built.
    # 0: the front job holds no engine of the role, its autoscale slots serve it (min >= 1)
    ("instances", int, field(default=1, metadata=doc(
        "engine instances of this role in the front job (0: only its autoscale slot jobs)",
        ge=0, le=100_000))),
    ("nodes", int, field(default=1, metadata=doc("nodes per instance", ge=1, le=100_000))),
    ("gpus", int | None, field(default=None, metadata=doc(
        "GPUs per instance when several instances share a node (must divide node.gpus)", ge=1,
        le=64))),
    ("port", int | None, field(default=None, metadata=doc(
        "first HTTP port (instances sharing a node count up from it)", ge=1024, le=65535))),
    ("spares", int, field(default=0, metadata=doc(
        "spare nodes in the role's het-job component, idle until an instance of the role loses "
        "a node and restarts on one", ge=0, le=10_000))),
    ("hung_after", float | None, field(default=None, metadata=doc(
        "this role's liveness.hung_after: seconds without progress before failed probes name "
        "an instance hung (longer steps: long-context prefill chunks, first-use JIT)", ge=1,
        le=86400))),
    ("recovery", Recovery, field(default_factory=Recovery)),
    ("autoscale", Autoscale | None, field(default=None, metadata=doc(
        "add and remove instances of the role on load (instance jobs of their own)"))),
)


@lru_cache(maxsize=None)
def role_type(engine: str) -> type:
    """A role of a deployment of `engine`: its topology keys, its ports and the engine's
    settings vocabulary, so an unknown key lists exactly what this engine takes."""
    a = engines.get(engine)
    ports = [(name, int | None, field(default=None, metadata=doc(text, ge=1024, le=65535)))
             for name, text in a.port_fields.items()]
    sim = [("sim_fault", SimFault | None, field(default=None))]
    return make_dataclass(f"{a.title}Role", [*ROLE_FIELDS, *ports, *sim], bases=(a.settings,),
                          frozen=True, namespace={"__module__": __name__})


@dataclass(frozen=True)
class ModelRef:
    profile: str = field(metadata=doc("a bundled profile name (hpcserve profiles) or a path"))
    path: str = field(metadata=doc("weights directory as seen on the nodes"))
    served_name: str | None = field(default=None, metadata=doc("the API model name"))
    stage: bool = field(default=False, metadata=doc(
        "copy the model's files to every node's site.paths.stage_dir before the engines start "
        "(the shared path read once per job, the other nodes fed node to node), checked "
        "against a SHA-256 manifest; the engines then read the local copy"))


@dataclass(frozen=True)
class Engine:
    name: EngineName = field(default=engines.DEFAULT, metadata=doc("the inference engine"))
    version: str | None = field(default=None, metadata=doc(
        "the engine release in the image; flags are spelled for it (default: the newest "
        "release hpcserve knows); a release not in hpcserve's flag matrix is refused unless "
        "check_flags_as is set", pattern=VERSION, pattern_help=VERSION_HELP))
    check_flags_as: str | None = field(default=None, metadata=doc(
        "for an engine.version hpcserve's flag matrix lacks: check its flags against the newest "
        "release hpcserve knows (newest) or against a known release named here; a warning says "
        "so before anything else is printed", pattern=f"(newest|{VERSION})",
        pattern_help="newest or " + VERSION_HELP))
    image: str | None = field(default=None, metadata=doc(
        "overrides site.container.image", pattern=IMAGE_REF, pattern_help=IMAGE_REF_HELP))
    simulate: bool = field(default=False, metadata=doc(
        "run hpcserve's stand-in engine with the same plan and argv (no GPU needed)"))
    python: str | None = field(default=None, metadata=doc(
        "python with the engine installed, inside its container (default: "
        "site.paths.engine_python for this engine, else python3)"))
    sim_startup_delay: float = field(default=0.0, metadata=doc("simulated load time, s", ge=0))
    sim_prefill_s_per_token: float = field(default=0.0, metadata=doc("", ge=0))
    sim_decode_s_per_token: float = field(default=0.0, metadata=doc("", ge=0))


@dataclass(frozen=True)
class Router:
    enabled: bool = True
    placement: Literal["prefill", "own"] = field(default="prefill", metadata=doc(
        "on the first prefill node (overlapping it), or on its own het-job component"))
    port: int = field(default=8000, metadata=doc("", ge=1024, le=65535))
    prometheus_port: int = field(default=29000, metadata=doc("", ge=1024, le=65535))
    policy: str = "round_robin"
    python: str | None = field(default=None, metadata=doc(
        "python that has the engine's router (default: site.paths.router_python, else the "
        "engine's python)"))
    args: dict[str, ArgValue] = field(default_factory=dict, metadata=doc(
        "more router flags", key_pattern=ROUTER_FLAG))
    env: dict[str, EnvValue] = field(default_factory=dict, metadata=doc("", key_pattern=ENV_NAME))

    def validate(self) -> None:
        check_secrets(self.args, "args", args=True)
        check_secrets(self.env, "env", args=False)


@dataclass(frozen=True)
class Readiness:
    engine_timeout: int = field(default=5400, metadata=doc(
        "seconds for every instance to answer /health (1T-parameter loads take tens of minutes)",
        ge=1))
    router_timeout: int = field(default=600, metadata=doc("", ge=1))
    poll_interval: float = field(default=1.0, metadata=doc("", ge=0.05, le=60))
    smoke_tokens: int = field(default=4, metadata=doc(
        "tokens the smoke request must return (0 disables the smoke request)", ge=0))


@dataclass(frozen=True)
class Liveness:
    """While serving: every `interval` s all instance leaders and the router are probed at once,
    each probe bounded by `timeout` s, and each engine's progress counters (its Prometheus
    metrics, where it has them) read beside. An instance that fails `failures` rounds in a row
    (refused: unreachable; an error status: unhealthy) is taken out and replaced (roles.<role>
    .recovery); one whose probes time out, or that answers a health path which proves nothing
    of progress while it holds requests, is hung only once it has also shown no sign of
    progress for `hung_after` s: an engine working through a long step, or streaming a long
    answer, is busy, never hung. The router's failure ends the deployment. The defaults name a
    hung engine within about 25 s (hung_after 20 s, then the round that sees it)."""

    interval: float = field(default=3.0, metadata=doc("seconds between probe rounds", ge=0.1,
                                                      le=600))
    timeout: float = field(default=5.0, metadata=doc("seconds one probe may take", ge=0.1,
                                                     le=600))
    failures: int = field(default=3, metadata=doc("rounds failed in a row that take an "
                                                  "instance out", ge=1, le=1000))
    node_interval: float = field(default=10.0, metadata=doc(
        "seconds between asking Slurm whether the job's nodes still respond", ge=1, le=3600))
    hung_after: float | None = field(default=None, metadata=doc(
        "seconds an instance may go without a sign of progress (its counters moving, a "
        "generating health path answering) before failed probes name it hung (default: the "
        "engine's, 20 s, longer than its longest legitimate step; roles.<role>.hung_after "
        "sets one role's)", ge=1, le=86400))


@dataclass(frozen=True)
class Workload:
    """The requests the deployment is sized for: the fit report counts how many fit at once
    (default: the seed guides' benchmark, 2,000 input and 100 output tokens)."""

    input_tokens: int = field(default=2000, metadata=doc("", ge=1, le=10_000_000))
    output_tokens: int = field(default=100, metadata=doc("", ge=1, le=10_000_000))


# The preflight's checks that a deployment may waive (a node that cannot run the job's own
# Python cannot report the others, so that one stands).
WAIVABLE_CHECKS = ("tools", "image", "model", "gpus", "fabric", "ib", "peer_memory", "shm",
                   "memlock", "ports", "clock")


@dataclass(frozen=True)
class Preflight:
    """Checks run on every node at once, in the job's first step, before any engine starts: the
    job's Python and tools, the image, the model's files (the same on every node), GPUs and
    their free memory, the NVLink fabric (one per instance, where site.fabric says), IB ports
    and GIDs, peer memory for RDMA, /dev/shm, the memlock limit, the ports the plan binds, the
    clocks. A failed check ends the job there, naming node and
    check; a waived one is reported and the job goes on."""

    enabled: bool = field(default=True, metadata=doc("run the checks"))
    waive: list[Literal[WAIVABLE_CHECKS]] = field(default_factory=list, metadata=doc(
        "checks that report but do not stop the job"))
    mpi: Literal["auto", "pmix", "none"] = field(default="auto", metadata=doc(
        "run them as one MPI world (srun --mpi=pmix, mpi4py in site.paths.python): clock "
        "offsets measured against rank 0; auto: when the engine itself runs under PMIx"))
    max_clock_skew_s: float = field(default=2.0, metadata=doc(
        "seconds a node's clock may be off the batch host's", ge=0.01, le=3600))
    min_shm_gb: float = field(default=1.0, metadata=doc(
        "GiB /dev/shm must hold (NCCL and the engines' shared memory; docker's default is 64 MiB)",
        ge=0))
    min_gpu_free_fraction: float = field(default=0.9, metadata=doc(
        "the share of each GPU's memory that must be free (another job's leftovers fail it)",
        ge=0, le=1))


BENCH_CLIENTS = tuple(CLIENTS)


@dataclass(frozen=True)
class Benchmark:
    """Once the deployment serves, the engine's own serving benchmark runs against the router
    from inside the allocation: one run per point of the sweep (each concurrency, at each request
    rate), results JSON per point in bench/. A gate refuses results that prove nothing: a point
    with 0 output tokens, fewer successful requests than asked, or output lengths far off the
    requested ones fails the benchmark, and the job says why."""

    input_tokens: int | None = field(default=None, metadata=doc(
        "prompt tokens per request (default: workload.input_tokens)", ge=1, le=10_000_000))
    output_tokens: int | None = field(default=None, metadata=doc(
        "output tokens per request, EOS ignored (default: workload.output_tokens)", ge=1,
        le=10_000_000))
    concurrency: list[int] = field(default_factory=lambda: [1, 16, 64], metadata=doc(
        "the sweep: requests in flight at once, one point each"))
    request_rate: list[float] = field(default_factory=list, metadata=doc(
        "requests/s to sweep at each concurrency (default: all at once, as fast as they finish)"))
    prompts_per_point: int | None = field(default=None, metadata=doc(
        "requests per point (default: 4 x the concurrency, at least 16)", ge=1, le=10_000_000))
    warmup: int = field(default=2, metadata=doc(
        "warm-up requests before each point, not counted", ge=0, le=10_000))
    client: Literal[("auto",) + BENCH_CLIENTS] = field(default="auto", metadata=doc(
        "whose benchmark client runs (auto: the engine's own; all speak OpenAI completions)"))
    python: str | None = field(default=None, metadata=doc(
        "the python that has the client (default: the engine's, or the container's python3)"))
    tokenizer: str | None = field(default=None, metadata=doc(
        "tokenizer directory the client builds prompts with (default: model.path)"))
    point_timeout_s: int = field(default=1800, metadata=doc(
        "a point still running after this long fails the benchmark", ge=10, le=7 * 86400))
    min_success: float = field(default=1.0, metadata=doc(
        "the share of a point's requests that must succeed", ge=0, le=1))
    output_tolerance: float = field(default=0.25, metadata=doc(
        "how far (a share of output_tokens) a point's mean output length may fall short",
        ge=0, le=1))
    metrics_interval_s: float = field(default=5.0, metadata=doc(
        "scrape the engines' and the router's Prometheus metrics this often while it runs "
        "(0: never)", ge=0, le=3600))
    then: Literal["stop", "serve"] = field(default="stop", metadata=doc(
        "after the benchmark: end the job (done, or failed with the gate's reason) or go on "
        "serving"))

    def validate(self) -> None:
        if not self.concurrency:
            raise FieldProblem("concurrency", "give at least one point")
        for name, vals in (("concurrency", self.concurrency), ("request_rate", self.request_rate)):
            bad = [i for i, v in enumerate(vals) if not 0 < v <= 1_000_000]
            if bad:
                raise FieldProblem((name, bad[0]), f"must be above 0 (and at most 1000000), "
                                                   f"not {vals[bad[0]]}")


@dataclass(frozen=True)
class Renew:
    """Instance jobs that outlive their time limit (`hpcserve scale --add`): each is rendered
    twice, and the running one submits its twin `margin` before its limit; once the twin's
    instances serve, the expiring ones drain (docs/operating.md, "Renewal")."""

    margin: str = field(default="15m", metadata=doc(
        "submit the successor this long before the instance job's time limit: its queue wait "
        "and a cold start must fit in it", pattern=DURATION, pattern_help=DURATION_HELP))
    time_limit: str | None = field(default=None, metadata=doc(
        "the instance jobs' own Slurm time limit (default: the deployment's time_limit)",
        pattern=TIME, pattern_help="a time such as 04:00:00 or 1-00:00:00"))


@dataclass(frozen=True)
class Deployment:
    """One deployment: which model, on which site, with which engine and roles."""

    name: str = field(metadata=doc("deployment (and Slurm job) name", pattern=NAME))
    model: ModelRef
    site: str | dict = field(metadata=doc(
        "a site name from site_configs/, a path to a site file, or a mapping: the site inline, "
        "or `base: <name>` plus overrides"))
    engine: Engine = field(default_factory=Engine)
    roles: dict[str, dict] = field(default_factory=dict, metadata=doc(
        "prefill + decode (PD disaggregation) or worker (plain); the keys of a role are the "
        "engine's (validated once the engine is known)"))
    router: Router = field(default_factory=Router)
    time_limit: str = field(default="04:00:00", metadata=doc(
        "Slurm time limit", pattern=TIME, pattern_help="a time such as 04:00:00 or 1-00:00:00"))
    env: dict[str, EnvValue] = field(default_factory=dict, metadata=doc(
        "environment for every engine of this deployment", key_pattern=ENV_NAME))
    readiness: Readiness = field(default_factory=Readiness)
    liveness: Liveness = field(default_factory=Liveness)
    jobs_dir: str | None = field(default=None, metadata=doc(
        "overrides site.paths.jobs_dir", pattern=JOB_PATH, pattern_help=JOB_PATH_HELP))
    workload: Workload = field(default_factory=Workload)
    preflight: Preflight = field(default_factory=Preflight)
    benchmark: Benchmark | None = field(default=None, metadata=doc(
        "run the engine's serving benchmark once the deployment serves (a mapping, {} for the "
        "defaults)"))
    requeue: int = field(default=0, metadata=doc(
        "when the deployment fails (not when it is cancelled), requeue the job up to this many "
        "times", ge=0, le=100))
    renew: Renew | None = field(default=None, metadata=doc(
        "renew every instance job ahead of its time limit (a mapping, {} for the defaults)"))

    def validate(self) -> None:
        check_secrets(self.env, "env", args=False)
        keys = set(self.roles)
        if not keys:
            raise FieldProblem("roles", "no roles: give prefill and decode, or worker")
        bad = keys - {"prefill", "decode", "worker"}
        if bad:
            raise FieldProblem(("roles", sorted(bad)[0]),
                               "unknown role; valid roles: prefill, decode, worker")
        if "worker" in keys and keys != {"worker"}:
            raise FieldProblem("roles", "worker (plain serving) cannot be combined with "
                                        "prefill/decode (PD disaggregation)")
        if "worker" not in keys and keys != {"prefill", "decode"}:
            missing = ({"prefill", "decode"} - keys).pop()
            raise FieldProblem("roles", f"PD disaggregation needs both prefill and decode; "
                                        f"{missing} is missing")
        if self.renew:
            limit = self.renew.time_limit or self.time_limit
            if duration_s(self.renew.margin) > SIGNAL_MAX_S:  # sbatch --signal's bound
                raise FieldProblem(("renew", "margin"), f"{self.renew.margin} is more than "
                                   f"{SIGNAL_MAX_S} s, the most sbatch --signal takes (Slurm's "
                                   "warning signal is sent margin before the limit)")
            if duration_s(self.renew.margin) >= duration_s(limit):
                raise FieldProblem(("renew", "margin"), f"{self.renew.margin} is not shorter "
                                   f"than the instance jobs' time limit {limit}: every job "
                                   "would renew as soon as it serves")


# ---------------------------------------------------------------------------------------- profile

@dataclass(frozen=True)
class Architecture:
    family: str = field(metadata=doc("architecture family, e.g. deepseek_v3"))
    parameters_b: float = field(metadata=doc("total parameters, billions", ge=0))
    active_parameters_b: float = field(metadata=doc("activated parameters per token, billions",
                                                    ge=0))
    layers: int = field(metadata=doc("", ge=1))
    hidden_size: int = field(metadata=doc("", ge=1))
    experts: int = field(metadata=doc("routed experts", ge=0))
    experts_per_token: int = field(metadata=doc("", ge=0))
    shared_experts: int = 0
    attention: Literal["mla", "gqa", "mha"] = "mla"
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    moe_intermediate_size: int | None = field(default=None, metadata=doc(
        "hidden size of one routed expert (config.json moe_intermediate_size)", ge=1))
    dense_layers: int = field(default=0, metadata=doc(
        "leading layers without experts (config.json first_k_dense_replace)", ge=0))
    weight_dtype: Literal["fp8", "int4", "bf16", "fp16"] = field(default="fp8", metadata=doc(
        "the checkpoint's dtype (of everything but the routed experts when expert_dtype is "
        "set)"))
    expert_dtype: Literal["fp8", "int4", "bf16", "fp16"] | None = field(
        default=None, metadata=doc("the routed experts' dtype where it differs (Kimi-K2-"
                                   "Thinking: INT4 experts, BF16 attention)"))
    num_attention_heads: int | None = field(default=None, metadata=doc(
        "attention heads (config.json num_attention_heads)", ge=1))
    qk_nope_head_dim: int = field(default=128, metadata=doc("MLA", ge=1))
    v_head_dim: int = field(default=128, metadata=doc("MLA", ge=1))
    num_kv_heads: int | None = field(default=None, metadata=doc(
        "KV heads (GQA/MHA; config.json num_key_value_heads)", ge=1))
    head_dim: int | None = field(default=None, metadata=doc("per attention head (GQA/MHA)",
                                                            ge=1))
    context_length: int = field(default=131072, metadata=doc("", ge=1))

    @property
    def expert_bytes(self) -> float:
        """The routed experts' bytes (0 when the profile does not give their shape)."""
        return (self.expert_parameters or 0) * DTYPE_BYTES[self.expert_dtype or
                                                           self.weight_dtype]

    @property
    def weight_bytes(self) -> float:
        dense = self.parameters_b * 1e9 - (self.expert_parameters or 0)
        return dense * DTYPE_BYTES[self.weight_dtype] + self.expert_bytes

    @property
    def attention_bytes(self) -> float:
        """MLA's projections of every layer (what DP attention replicates): q (through
        q_lora_rank), the latent kv and its up-projection, o; 0 when the profile lacks them."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.attention != "mla" or not (heads and self.kv_lora_rank and
                                           self.qk_rope_head_dim):
            return 0.0
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        q = (h * self.q_lora_rank + self.q_lora_rank * heads * qk) if self.q_lora_rank \
            else h * heads * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + \
            self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        o = heads * self.v_head_dim * h
        return (q + kv + o) * self.layers * DTYPE_BYTES[self.weight_dtype]

    @property
    def expert_parameters(self) -> float | None:
        """Parameters of all routed experts: gate, up and down projections of every expert of
        every MoE layer (None when the profile lacks moe_intermediate_size)."""
        if not (self.experts and self.moe_intermediate_size):
            return None
        return (self.experts * (self.layers - self.dense_layers) * 3 * self.hidden_size
                * self.moe_intermediate_size)


@lru_cache(maxsize=None)
def defaults_type(engine: str) -> type:
    """A profile's section for `engine`: settings for every role, then per role."""
    a = engines.get(engine)
    sections = [(r, a.settings, field(default_factory=a.settings))
                for r in ("common", "prefill", "decode", "worker")]
    return make_dataclass(f"{a.title}Defaults", sections, frozen=True,
                          namespace={"__module__": __name__})


@dataclass(frozen=True)
class ProfileBase:
    """A model profile: architecture facts and engine defaults ("the model drives the deployment")."""

    name: str = field(metadata=doc("", pattern=NAME))
    hf_id: str = ""
    description: str = ""
    architecture: Architecture | None = None


# One section per engine (named like the engine) with its defaults.
Profile = make_dataclass("Profile", [(n, defaults_type(n), field(default_factory=defaults_type(n)))
                                    for n in engines.names()], bases=(ProfileBase,), frozen=True,
                         namespace={"__module__": __name__})
Profile.__doc__ = ProfileBase.__doc__


# ------------------------------------------------------------------------------------ resolution

@dataclass(frozen=True)
class Resolved:
    """Everything the planner needs, validated; `sources` says where each value came from."""

    deployment: Deployment
    site: Site
    profile: Profile
    deploy_file: str
    site_file: str | None
    profile_file: str
    positions: Positions = field(compare=False, repr=False)
    # The deployment as submitted, as one document that load() rebuilds it from (source_text).
    source: dict = field(default_factory=dict, compare=False, repr=False)
    # The cluster user the jobs run as ("": this machine's user): the per-user caches' owner.
    # `hpcserve submit` over SSH sets it from the remote side (ops.whoami).
    user: str = field(default="", compare=False, repr=False)


# The job directory keeps the deployment it was rendered from (render.py: deployment.yaml), so
# `hpcserve scale` rebuilds the same configuration after the user's file changed or went away.
# Kept as one canonical document rather than the file's text, the --set list and a base
# directory: that document has the --set values applied, the site merged in as a mapping (a site
# file edited since cannot change it) and a profile given as a path made absolute, so it loads
# alone, anywhere. The keys it holds are exactly those the file and the --set gave (no defaults
# filled in), so what the file sets (its ports, say) stays told apart from a default on reload.
# Secrets never reach it: load() refuses a secret value (from_env names a variable instead).
SOURCE_FILE = "deployment.yaml"
SOURCE_HEAD = ("# The deployment this job was rendered from, as submitted (--set applied, the site "
               "merged in):\n# `hpcserve scale` rebuilds instance jobs from it. Not read by the "
               "job itself.\n")


def source_text(source: dict) -> str:
    """The text of SOURCE_FILE: a configuration's source document, which load() reads back.
    YAML (PyYAML's dumper quotes what its loader would read as another type), not JSON, whose
    1e-05 a YAML 1.1 loader reads as a string."""
    import yaml
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return SOURCE_HEAD + yaml.dump(source, Dumper=dumper, sort_keys=False,
                                   default_flow_style=False, allow_unicode=True)


def _source(raw: dict, site_doc: dict, profile_named: str, profile_file: str) -> dict:
    """The deployment's canonical source document (see SOURCE_FILE)."""
    out = copy.deepcopy(raw)
    out["site"] = copy.deepcopy(site_doc)
    if "/" in profile_named or profile_named.endswith((".yaml", ".yml")):
        out["model"]["profile"] = str(Path(profile_file).resolve())
    return out


def set_source(expr: str) -> str:
    """How errors name a --set: as written (bounded, a secret-looking value left out), so the
    user sees which of several it is and that the command line, not the file, holds it. A
    value is secret-looking by its key or by a key inside it (`env={HF_TOKEN: ...}`)."""
    key, eq, raw = expr.partition("=")
    inner_keys = re.findall(r"[\w.-]+(?=\s*:)", raw)
    if eq and any(looks_secret(k) for k in [key.strip().split(".")[-1], *inner_keys]):
        raw = "..."
    return "--set " + shorten(escape(key + eq + raw))


def parse_set(expr: str) -> tuple[tuple, Any, Origin]:
    source = set_source(expr)
    origin = Origin(source)
    if "=" not in expr:
        raise ConfigError(f"expected KEY.PATH=VALUE, got {echo(expr)}", file=source)
    key, raw = expr.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"bad key path {echo(key)}", file=source)
    path = tuple(int(p) if p.isdigit() else p for p in parts)
    try:
        value, _ = load_text(raw, source) if raw.strip() else ("", None)
    except ConfigError as e:
        # The position inside the value's own text is meaningless: point at this --set.
        raise ConfigError(e.message, file=source, field=format_path(path)) from None
    if value == {} and raw.strip() == "":
        value = ""
    if isinstance(value, str):
        check_string(value, path, origin)
    return path, value, origin


def apply_set(doc_: dict, pos: Positions, path: tuple, value: Any, origin: Origin) -> None:
    cur: Any = doc_
    for i, p in enumerate(path[:-1]):
        nxt = cur.get(p) if isinstance(cur, dict) else None
        if nxt is None:
            nxt = {}
            cur[p] = nxt
            pos.table[path[:i + 1]] = origin  # a mapping only the --set names is its own
        elif not isinstance(nxt, dict):
            raise ConfigError(f"{format_path(path[:i + 1])} is not a mapping",
                              file=origin.file, line=origin.line, field=format_path(path))
        cur = nxt
    cur[path[-1]] = value
    pos.table = {k: v for k, v in pos.table.items() if k[:len(path)] != path}
    pos.table[path] = origin
    if isinstance(value, dict):
        for k in _walk_paths(value):
            pos.table[path + k] = origin


def _walk_paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _walk_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _walk_paths(v, prefix + (i,))
    return out


def deep_merge(base: dict, over: dict, bpos: Positions, opos: Positions, prefix: tuple = ()) -> dict:
    """Merge `over` onto `base` (mappings recursively, everything else replaced), with positions."""
    out = dict(base)
    for k, v in over.items():
        p = prefix + (k,)
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v, bpos, opos, p)
        else:
            out[k] = v
            bpos.table = {q: o for q, o in bpos.table.items() if q[:len(p)] != p}
        for q, o in opos.table.items():
            if q[:len(p)] == p and (q == p or not isinstance(v, dict) or q not in bpos.table):
                bpos.table[q] = o
    return out


def site_search_path(deploy_file: Path) -> list[Path]:
    dirs = [Path(d) for d in os.environ.get("HPCSERVE_SITE_PATH", "").split(os.pathsep) if d]
    here = deploy_file.resolve().parent
    return dirs + [here / "site_configs", here.parent / "site_configs", BUNDLED_SITES]


def _is_file(p: Path) -> bool:
    """Whether `p` is a file; a name the OS refuses (too long, NUL) is simply not one."""
    try:
        return p.is_file()
    except (OSError, ValueError):
        return False


def _find_named(name: str, dirs: list[Path], what: str, origin: Origin | None,
                fieldname: str, base: Path) -> Path:
    if "/" in name or name.endswith((".yaml", ".yml")):
        p = Path(name).expanduser()
        p = p if p.is_absolute() else base / p
        if _is_file(p):
            return p
        raise ConfigError(f"{what} file {echo(name)} not found",
                          file=origin.file if origin else None,
                          line=origin.line if origin else None, field=fieldname)
    for d in dirs:
        for ext in (".yaml", ".yml"):
            if _is_file(d / (name + ext)):
                return d / (name + ext)
    known = sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.y*ml")})
    raise ConfigError(f"no {what} named {echo(name)}; known: {', '.join(known) or 'none'}",
                      file=origin.file if origin else None, line=origin.line if origin else None,
                      field=fieldname)


def load_profile(name: str, origin: Origin | None = None, base: Path = Path(".")) -> tuple[Profile, str]:
    path = _find_named(name, [BUNDLED_PROFILES], "model profile", origin, "model.profile", base)
    raw, pos = load_file(path)
    return Validator(pos, "profile").build(Profile, raw, ()), str(path)


def load(deploy_file: str | Path, sets: list[str] | tuple[str, ...] = ()) -> Resolved:
    """Load, merge and validate a deployment file with its site and profile."""
    dpath = Path(deploy_file)
    raw, pos = load_file(dpath)
    if not isinstance(raw, dict):
        raise ConfigError("a deployment file is a mapping (name:, model:, site:, roles: ...)",
                          file=str(dpath), line=1)
    for expr in sets:
        path, value, origin = parse_set(expr)
        if isinstance(raw.get("site"), str) and path[0] == "site" and len(path) > 1:
            raw["site"] = {"base": raw["site"]}  # a named site gets overridden field by field
        apply_set(raw, pos, path, value, origin)

    # The site: a name/path, or a mapping with an optional `base` plus overrides.
    site_raw = raw.get("site")
    site_file = None
    if site_raw is None:
        if "site" in raw:  # `site: null`, at its own line
            raise Validator(pos).error(("site",), "a required key, got null (a site name, a "
                                                  "path or a mapping)")
        raise ConfigError("missing required key 'site'", file=str(dpath), line=1)
    spos = Positions()
    if isinstance(site_raw, str) or (isinstance(site_raw, dict) and "base" in site_raw):
        name = site_raw if isinstance(site_raw, str) else site_raw["base"]
        key = ("site",) if isinstance(site_raw, str) else ("site", "base")
        if not isinstance(name, str):
            raise Validator(pos).error(key, "expected a site name")
        sp = _find_named(name, site_search_path(dpath), "site", pos.lookup(key),
                         format_path(key), dpath.parent)
        site_file = str(sp)
        site_doc, spos = load_file(sp)
        if not isinstance(site_doc, dict):
            raise ConfigError("a site file is a mapping", file=site_file, line=1)
        if isinstance(site_raw, dict):
            over = {k: v for k, v in site_raw.items() if k != "base"}
            opos = Positions({p[1:]: o for p, o in pos.table.items()
                              if p[:1] == ("site",) and p[1:2] != ("base",) and len(p) > 1})
            site_doc = deep_merge(site_doc, over, spos, opos)
    elif isinstance(site_raw, dict):
        site_doc = site_raw
        spos = Positions({p[1:]: o for p, o in pos.table.items() if p[:1] == ("site",)})
    else:
        raise Validator(pos).error(("site",), "expected a site name or a mapping")

    try:
        site = Validator(spos, "site").build(Site, site_doc, ())
    except ConfigError as e:
        # A site value written in the deployment file (or a --set) sits under `site:` there.
        if e.file != site_file and e.field:
            e.field = "site." + e.field if e.field != "<document>" else "site"
        raise
    # Positions of site fields are kept under ("site", ...) for the planner's error messages.
    pos.update_under(("site",), spos)
    dep = Validator(pos).build(Deployment, raw, ())
    # The engine is known now: its roles are validated against its own vocabulary.
    rt = role_type(dep.engine.name)
    dep = replace(dep, roles={
        name: Validator(pos).build(rt, r, ("roles", name)) for name, r in dep.roles.items()})
    profile, profile_file = load_profile(dep.model.profile, pos.lookup(("model", "profile")),
                                         dpath.parent)
    return Resolved(deployment=dep, site=site, profile=profile, deploy_file=str(dpath),
                    site_file=site_file, profile_file=profile_file, positions=pos,
                    source=_source(raw, site_doc, dep.model.profile, profile_file))


def schemas() -> dict[str, dict]:
    return {"deployment": _deployment_schema(),
            "site": json_schema(Site, "hpcserve site"),
            "profile": json_schema(Profile, "hpcserve model profile")}


def _deployment_schema() -> dict:
    """The deployment's schema, whose roles take the keys of the engine engine.name names."""
    out = json_schema(Deployment, "hpcserve deployment")
    defs = out["$defs"]
    rules = []
    for n in engines.names():
        roles = {"properties": {"roles": {"additionalProperties": schema_ref(role_type(n), defs)}}}
        named = {"required": ["engine"], "properties": {"engine": {
            "required": ["name"], "properties": {"name": {"const": n}}}}}
        if n == engines.DEFAULT:  # also when engine.name is not given
            other = {"required": ["engine"], "properties": {"engine": {
                "required": ["name"], "properties": {"name": {"not": {"const": n}}}}}}
            named = {"not": other}
        rules.append({"if": named, "then": roles})
    defs["Deployment"]["allOf"] = rules
    return out


def merged_settings(settings_cls: type, *layers: Any) -> dict[str, Any]:
    """The named settings of `settings_cls` over `layers` (profile sections, then the role):
    later layers win; args/env merge key by key, and an args value of None removes the key."""
    names = setting_names(settings_cls)
    out: dict[str, Any] = {n: None for n in names}
    args: dict[str, Any] = {}
    env: dict[str, Any] = {}
    for layer in layers:
        for n in names:
            v = getattr(layer, n)
            if isinstance(v, dict) and isinstance(out[n], dict):
                out[n] = {**out[n], **v}  # a mapping setting (an options file) merges by key
            elif v is not None:
                out[n] = copy.copy(v)
        for k, v in layer.args.items():
            if v is None:
                args.pop(k, None)
            else:
                args[k] = v
        env.update(layer.env)
    out["args"] = args
    out["env"] = env
    return out
