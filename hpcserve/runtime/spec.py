"""plan.json as typed objects: every key of it the runtime reads is spelled here, once.

`read(job_dir)` checks the spec (contract.load_spec: the version, the files this user's alone)
and returns a `Spec`: the runtime reads `job.plan.readiness.engine_timeout`, so a key is renamed
here and nowhere else in it, and a type checker or an IDE sees every field.

Each class below is one JSON object of plan.json. Its annotations are its keys (a trailing _
where the key is a Python keyword: `import_` is "import") and what each value becomes: another
class here by name, `list[X]`, `dict[str, X]`, `X | None`, or a JSON value as it is (str, int,
float, bool, list, dict, object). The runtime runs on the nodes' python3, 3.7 and later, so the
annotations stay strings (`from __future__ import annotations`) that View reads itself, with no
`typing` or `dataclasses` import in a job's start.

plan.json is whole (plan_json.py's schema requires every key). A key absent from an object, as in
a unit test's partial plan, is None where its annotation admits None, else no attribute at all.

To add a plan.json key: its writer and schema in author/plan_json.py, the spec version in
contract.py, and its annotation here, in the class of the object that holds it.
"""

from __future__ import annotations

import keyword

from .contract import load_spec

_VIEWS: dict = {}       # class name -> View subclass, for the annotations that name one
_AS_IS = {"str", "int", "float", "bool", "list", "dict", "object"}


class View:
    """One JSON object of plan.json, its keys as attributes (see the module's docstring)."""

    _fields: tuple = ()   # (attribute, key, convert, admits None), built at first use

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        _VIEWS[cls.__name__] = cls
        cls._fields = ()

    def __init__(self, raw: dict):
        if not isinstance(raw, dict):
            raise TypeError(f"{type(self).__name__}: expected a JSON object, got {raw!r:.80}")
        self._raw = raw
        for attr, key, convert, nullable in self._fields or self._compile():
            if key in raw:
                value = raw[key]
                setattr(self, attr, None if value is None and nullable else convert(value))
            elif nullable:
                setattr(self, attr, None)

    def as_json(self) -> dict:
        """The JSON object this view was read from (to copy into state.json as it is)."""
        return self._raw

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._raw!r})"

    @classmethod
    def _compile(cls) -> tuple:
        fields = []
        # the class's own, strings under the __future__ import on every python3 from 3.7 on
        own = vars(cls).get("__annotations__") or getattr(cls, "__annotations__", {})
        for attr, ann in own.items():
            if attr.startswith("_"):
                continue
            key = attr[:-1] if attr.endswith("_") and keyword.iskeyword(attr[:-1]) else attr
            convert, nullable = _converter(ann, f"{cls.__name__}.{attr}")
            fields.append((attr, key, convert, nullable))
        cls._fields = tuple(fields)
        return cls._fields


def _same(value):
    return value


def _converter(ann: str, where: str):
    """(a function from the JSON value to the attribute's, whether None is admitted) for an
    annotation as written in this module."""
    ann = ann.strip()
    if ann.endswith("| None"):  # "X | None": None, or X
        return _converter(ann[:-len("| None")], where)[0], True
    if ann.startswith("list[") and ann.endswith("]"):
        item = _converter(ann[len("list["):-1], where)[0]
        return (_same if item is _same else (lambda v: [item(x) for x in v])), False
    if ann.startswith("dict[str, ") and ann.endswith("]"):
        item = _converter(ann[len("dict[str, "):-1], where)[0]
        return (_same if item is _same else (lambda v: {k: item(x) for k, x in v.items()})), False
    if ann in _AS_IS:
        return _same, False
    if ann in _VIEWS:
        return _VIEWS[ann], False
    raise TypeError(f"{where}: an annotation View cannot read: {ann!r}")


# --- the objects of plan.json, from the inside out (author/plan_json.py writes each) ---------


class Engine(View):
    name: str
    title: str
    version: str
    simulate: bool


class RecoveryPolicy(View):
    """recovery[role]: what happens when an instance of the role fails while serving."""
    restart: bool
    max_restarts: int
    backoff_s: float
    min_serving: int
    spares: int
    component: int
    first_spare: int


class Readiness(View):
    engine_timeout: int
    router_timeout: int
    poll_interval: float
    smoke_tokens: int


class Liveness(View):
    interval: float
    timeout: float
    failures: int
    node_interval: float


class ImageImport(View):
    """container.import: the image imported once per job (sqsh: enroot/pyxis, sif: apptainer)."""
    uri: str
    sqsh: str | None
    sif: str | None
    helper: str
    owner: str | None


class Container(View):
    runtime: str
    image: str | None
    import_: ImageImport | None


class Network(View):
    interface: str
    ib_devices: object


class PreflightGpus(View):
    why: str | None


class Fabric(View):
    domain_nodes: int


class PreflightImage(View):
    path: str | None
    note: str | None


class Preflight(View):
    enabled: bool
    only: bool
    mpi: bool
    waive: list[str]
    max_clock_skew_s: float
    min_shm_bytes: int
    min_gpu_free_fraction: float
    gid_index: int | None
    gpus: PreflightGpus
    model_optional: str | None
    fabric: Fabric | None
    tools: list[str]
    image: PreflightImage | None


class Stage(View):
    source: str
    dir: str
    name: str
    path: str
    max_bytes: int
    only: bool


class BenchPoint(View):
    label: str
    concurrency: int
    rate: float | None
    prompts: int
    file: str


class BenchKeys(View):
    output: str
    failed: str | None
    json_lines: bool
    metrics: dict[str, str]


class BenchGate(View):
    min_success: float
    output_tolerance: float


class Benchmark(View):
    client: str
    title: str
    dir: str
    input_tokens: int
    output_tokens: int
    warmup: int
    points: list[BenchPoint]
    keys: BenchKeys
    point_timeout_s: int
    gate: BenchGate
    metrics_interval_s: float
    then: str
    python: str
    tokenizer: str
    component: int
    node_offset: int


class Component(View):
    index: int
    name: str
    nodes: int
    directives: list


class InstanceLiveness(View):
    path: str
    proves_progress: bool
    hung_after: float


class Metrics(View):
    path: str
    gauges_path: str | None
    progress: list[str]
    pending: list[str]
    queued: list[str]


class Smoke(View):
    kind: str
    path: str


class StartupLines(View):
    weights_loaded: str | None
    ready: str | None


class Instance(View):
    """instances[i]: one engine instance (its argv, env and parallel sizes are for people)."""
    name: str
    role: str
    index: int
    component: int
    node_offset: int
    nodes: int
    tasks_per_node: int
    mpi: str | None
    gpus_per_node: int
    gpu_ids: str | None
    port: int
    ports: dict[str, int]
    health_path: str
    stop_signal: str
    liveness: InstanceLiveness
    metrics: Metrics | None
    smoke: Smoke
    parallel: dict[str, int]
    argv: list
    rank_argv: list
    env: list
    startup_lines: StartupLines


class RouterReadiness(View):
    path: str
    count: list[str]
    workers: int


class Router(View):
    name: str
    component: int
    node_offset: int
    port: int
    prometheus_port: int
    metrics_path: str | None
    pd: bool
    readiness: RouterReadiness
    workers_api: str
    api_key_env: str | None
    stop_signal: str
    command: list
    argv: list
    env: list


class Attach(View):
    """attach: the router an instance job joins (a slot reads router_url, front_job_id later)."""
    router_url: str | None
    workers_api: str
    api_key_env: str | None
    front_job_id: str | None
    front_job_dir: str
    deployment: str


class Signal(View):
    kind: str
    metrics: list[str]


class AutoscaleRole(View):
    min: int
    max: int
    signal: Signal
    target: float
    cool_down_s: float
    interval_s: float
    drain_timeout_s: float
    slots: list[str]


class Renew(View):
    twin_dir: str
    margin_s: float


class Cache(View):
    name: str
    var: str
    path: str
    probe: str


class Caches(View):
    dir: str
    storage: str
    caches: list[Cache]


class ApiKey(View):
    env: str
    file: str | None


class Spec(View):
    """plan.json: the job's spec, as the renderer wrote it for this job directory."""
    spec: str
    spec_version: int
    hpcserve_version: str
    name: str
    job_dir: str
    engine: Engine
    profile: str
    model_path: str
    served_name: str
    time_limit: str
    signal_grace: int
    requeue: int
    jobs_dir: str
    recovery: dict[str, RecoveryPolicy]
    readiness: Readiness
    liveness: Liveness
    container: Container
    scratch: bool
    network: Network
    preflight: Preflight
    stage: Stage | None
    benchmark: Benchmark | None
    components: list[Component]
    instances: list[Instance]
    router: Router | None
    attach: Attach | None
    autoscale: dict[str, AutoscaleRole] | None
    renew: Renew | None
    file_sd_dir: str | None
    caches: Caches | None
    secret_env: list[str]
    api_key: ApiKey | None
    in_allocation: bool
    warnings: list[str]
    notes: list[str]


def read(job_dir: str) -> Spec:
    """The job directory's plan.json, checked (contract.load_spec) and typed."""
    return Spec(load_spec(job_dir))
