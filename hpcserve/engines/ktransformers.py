"""KTransformers: MoE experts computed on the host's CPUs, attention and hot experts on the GPUs.

Two ways people run it, two adapters:
- `ktransformers`: today's way, the kt-kernel CPU expert kernels inside SGLang's
  `launch_server` with its `--kt-*` flags (KTransformers docs, "Kimi-K2-Thinking" and
  "Kimi-K2.5"). `engine.version` is the SGLang release it runs in: the flags are SGLang's and are
  checked against SGLang's flag matrix. hpcserve plans the CPU side too: `--kt-cpuinfer` from the
  node's physical cores minus its GPUs (what the docs advise), `--kt-threadpool-count` from its
  NUMA nodes, every CPU of the node in the Slurm request (`--cpus-per-task`, to srun as well:
  Slurm 22.05 to 23.02 do not pass it on), `--cpu-bind=none` because kt-kernel pins one thread
  pool per NUMA node itself, and the host memory the CPU experts take checked against the node's;
- `ktransformers_legacy`: the seed guide's `python ktransformers/server/main.py --model_path
  --gguf_path --cache_lens --optimize_config_path ...`, in the releases that ship it (0.2.0 to
  0.4.1; 0.4.2 moved it to archive/); its options come from `data/ktransformers_flags.json`,
  which tools/extract_ktransformers_flags.py reads from each release's
  `ktransformers/server/args.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from ..author.schema import doc
from ..author.values import ArgValue, EnvValue
from ..author.words import Var, Word
from .base import (EngineAdapter, Launch, Layout, NoRouter, PortRequest, RoleContext,
                   SettingsBase, args_field, env_field)
from .flags import FlagError, FlagMatrix, Release, Vocabulary, fmt
from .facts import KTRANSFORMERS_LEGACY as KT_LEGACY_FACTS
from .sglang import LEGACY as SGLANG_LEGACY
from .sglang import OWNED as SGLANG_OWNED
from .sglang import SPELLINGS as SGLANG_SPELLINGS
from .sglang import SGLang, SGLangSettings

# What kt-kernel accepts as --kt-method (kt-kernel python/experts.py, KTransformers 0.7.0).
KT_METHODS = ("AMXINT4", "AMXINT8", "RAWINT4", "FP8", "FP8_PERCHANNEL", "BF16", "LLAMAFILE",
              "GPTQ_INT4", "SYCL_GPTQ_INT4", "MXFP4", "MXFP8", "MOE_INT4", "MOE_INT8")
# Bytes per expert parameter of the CPU weights for each --kt-method (kt-kernel's formats).
METHOD_BYTES = {"AMXINT4": 0.5, "AMXINT8": 1.0, "RAWINT4": 0.5, "FP8": 1.0,
                "FP8_PERCHANNEL": 1.0, "BF16": 2.0, "MOE_INT4": 0.5, "MOE_INT8": 1.0,
                "GPTQ_INT4": 0.5, "MXFP4": 0.5, "MXFP8": 1.0,
                "LLAMAFILE": 0.5625}   # LLAMAFILE: GGUF Q4_K, 4.5 bits per weight


@dataclass(frozen=True)
class KTSettings(SGLangSettings):
    """SGLang's settings plus the kt-kernel CPU expert settings."""

    kt_weight_path: str | None = field(default=None, metadata=doc(
        "the CPU experts' weights (a converted AMX/GGUF checkpoint, or the native INT4 model "
        "folder) as seen on the nodes (--kt-weight-path)"))
    kt_method: Literal[KT_METHODS] | None = field(default=None, metadata=doc(
        "CPU expert kernel and weight format (--kt-method; SGLang passes any text on and "
        "kt-kernel refuses an unknown one only when it loads the model)"))
    kt_cpuinfer: int | None = field(default=None, metadata=doc(
        "CPU threads for the experts (--kt-cpuinfer); default: the node's physical cores "
        "minus its GPUs", ge=1))
    kt_threadpool_count: int | None = field(default=None, metadata=doc(
        "thread pools, one per NUMA node (--kt-threadpool-count); default: site.node."
        "numa_nodes", ge=1))
    kt_num_gpu_experts: int | None = field(default=None, metadata=doc(
        "experts kept on the GPUs per layer (--kt-num-gpu-experts)", ge=0))
    kt_max_deferred_experts_per_token: int | None = field(default=None, metadata=doc(
        "--kt-max-deferred-experts-per-token", ge=0))


KT_SPELLINGS = (
    ("kt_weight_path", (lambda v: ["--kt-weight-path", v], lambda v: ["--kt-amx-weight-path", v])),
    ("kt_method", (lambda v: ["--kt-method", v], lambda v: ["--kt-amx-method", v])),
    ("kt_cpuinfer", (lambda v: ["--kt-cpuinfer", fmt(v)],)),
    ("kt_threadpool_count", (lambda v: ["--kt-threadpool-count", fmt(v)],)),
    ("kt_num_gpu_experts", (lambda v: ["--kt-num-gpu-experts", fmt(v)],)),
    ("kt_max_deferred_experts_per_token",
     (lambda v: ["--kt-max-deferred-experts-per-token", fmt(v)],)),
)

KT_OWNED = {"--kt-weight-path": "kt_weight_path", "--kt-amx-weight-path": "kt_weight_path",
            "--kt-method": "kt_method", "--kt-amx-method": "kt_method",
            "--kt-cpuinfer": "kt_cpuinfer", "--kt-threadpool-count": "kt_threadpool_count",
            "--kt-num-gpu-experts": "kt_num_gpu_experts"}


class KTransformers(SGLang):
    name = "ktransformers"
    title = "KTransformers in SGLang"   # the version shown beside it is SGLang's
    settings = KTSettings
    vocabulary = Vocabulary(SGLANG_SPELLINGS + KT_SPELLINGS, {**SGLANG_OWNED, **KT_OWNED},
                            SGLANG_LEGACY)
    # The simulated engine is SGLang's stand-in, given the same --kt-* argv.

    def layout(self, rel: Release, ctx: RoleContext) -> Layout:
        base = super().layout(rel, ctx)
        st = dict(base.settings)
        if not st.get("kt_weight_path"):
            raise FlagError(("kt_weight_path",), "KTransformers needs kt_weight_path: the CPU "
                                                 "experts' weights as seen on the nodes")
        if ctx.shared or ctx.nodes > 1:
            raise FlagError(("gpus",) if ctx.shared else ("nodes",),
                            "a KTransformers instance computes its experts on one node's CPUs: "
                            "give it one whole node (nodes: 1, no gpus share)")
        node = ctx.node
        cores = getattr(node, "cpu_cores", None)
        if st.get("kt_cpuinfer") is None:
            if not cores:
                raise FlagError(("kt_cpuinfer",), "set kt_cpuinfer, or site.node.cpu_cores "
                                                  "(physical cores per node) to derive it")
            if cores <= ctx.gpus:
                raise FlagError(("kt_cpuinfer",), "kt_cpuinfer is derived as the node's "
                                                  f"physical cores - its GPUs, and its {cores} "
                                                  "cores (site.node.cpu_cores) leave none beside "
                                                  f"{ctx.gpus} GPUs: set kt_cpuinfer")
            st["kt_cpuinfer"] = cores - ctx.gpus  # one core per GPU stays for its process
        elif cores and st["kt_cpuinfer"] > cores:
            raise FlagError(("kt_cpuinfer",), f"kt_cpuinfer {st['kt_cpuinfer']} is more than "
                                              f"the node's {cores} physical cores")
        if st.get("kt_threadpool_count") is None and getattr(node, "numa_nodes", None):
            st["kt_threadpool_count"] = node.numa_nodes
        host, off_gpu = _host_experts(ctx, st)
        cpus = getattr(node, "cpus", None) or cores
        # Slurm's default memory per CPU is far below hundreds of GB of experts: ask for them
        # (a tenth more for kt-kernel's buffers) where the site asks for no memory itself.
        return Layout(parallel=base.parallel + (("cpu_threads", st["kt_cpuinfer"]),),
                      ep=base.ep, settings=st, cpus_per_task=cpus,
                      srun_args=("--cpu-bind=none",), host_weight_bytes=off_gpu,
                      mem_gb=math.ceil(host * 1.1 / 1e9) if host else None)

    def describe(self, parallel) -> str:
        p = dict(parallel)
        return super().describe(parallel) + f", {p['cpu_threads']} CPU expert threads"


def _host_experts(ctx: RoleContext, st: dict) -> tuple[float, float]:
    """(bytes of the CPU experts in host memory in the kt_method format, the same experts'
    bytes in the checkpoint's format, which the GPUs no longer hold); (0, 0) when the profile
    does not say. Refused when they exceed the node's memory."""
    arch, node = ctx.architecture, ctx.node
    method = st.get("kt_method") or "AMXINT4"  # SGLang's default
    if not (arch and arch.expert_parameters and method in METHOD_BYTES):
        return 0.0, 0.0
    on_gpu = min(st.get("kt_num_gpu_experts") or 0, arch.experts)
    params = arch.expert_parameters * (arch.experts - on_gpu) / arch.experts
    need = params * METHOD_BYTES[method]
    mem = getattr(node, "memory_gb", None)
    if mem and need > mem * 1e9:
        raise FlagError(("kt_method",) if "kt_method" in ctx.own else (),
                        f"the {arch.experts - on_gpu} CPU experts per layer take "
                        f"{need / 1e9:.0f} GB of host memory in {method} "
                        f"({arch.expert_parameters / 1e9:.0f}B expert parameters x "
                        f"{METHOD_BYTES[method]:g} bytes); a node has {mem:g} GB "
                        "(site.node.memory_gb): keep more experts on the GPUs "
                        "(kt_num_gpu_experts) or use a smaller format")
    return need, arch.expert_bytes * (arch.experts - on_gpu) / arch.experts


ADAPTER = KTransformers()


# ------------------------------------------------------------------------- the legacy server

@dataclass(frozen=True)
class LegacySettings(SettingsBase):
    """Settings of the legacy `ktransformers/server/main.py` (KTransformers 0.2.0 to 0.4.1)."""

    gguf_path: str | None = field(default=None, metadata=doc(
        "the GGUF weights directory as seen on the nodes (--gguf_path)"))
    optimize_rules: str | None = field(default=None, metadata=doc(
        "the injection rules YAML (--optimize_config_path), e.g. ktransformers/optimize/"
        "optimize_rules/DeepSeek-V3-Chat-serve.yaml inside the installed package"))
    backend_type: Literal["transformers", "exllamav2", "ktransformers", "balance_serve"] | None \
        = field(default=None, metadata=doc("--backend_type (from 0.2.4; balance_serve batches)"))
    cache_lens: int | None = field(default=None, metadata=doc("KV cache tokens", ge=1))
    max_new_tokens: int | None = field(default=None, metadata=doc("", ge=1))
    max_batch_size: int | None = field(default=None, metadata=doc("", ge=1))
    chunk_size: int | None = field(default=None, metadata=doc("prefill chunk", ge=1))
    cpu_infer: int | None = field(default=None, metadata=doc(
        "CPU threads for the experts (--cpu_infer); default: the node's physical cores minus "
        "its GPUs", ge=1))
    args: dict[str, ArgValue] = args_field(r"[A-Za-z0-9][A-Za-z0-9_-]*")
    env: dict[str, EnvValue] = env_field()


LEGACY_OWNED = {"--host": "site.network.interface", "--port": "roles.<role>.port",
                "--model_path": "model.path", "--model_dir": "model.path",
                "--gguf_path": "gguf_path", "--model_name": "model.served_name",
                "--optimize_config_path": "optimize_rules", "--cpu_infer": "cpu_infer",
                "--type": "backend_type", "--backend_type": "backend_type"}

LEGACY_SPELLINGS = (
    ("gguf_path", (lambda v: ["--gguf_path", v],)),
    ("optimize_rules", (lambda v: ["--optimize_config_path", v],)),
    ("backend_type", (lambda v: ["--backend_type", v], lambda v: ["--type", v])),
    ("cache_lens", (lambda v: ["--cache_lens", fmt(v)],)),
    ("max_new_tokens", (lambda v: ["--max_new_tokens", fmt(v)],)),
    ("max_batch_size", (lambda v: ["--max_batch_size", fmt(v)],)),
    ("chunk_size", (lambda v: ["--chunk_size", fmt(v)],)),
    ("cpu_infer", (lambda v: ["--cpu_infer", fmt(v)],)),
)


class KTransformersLegacy(EngineAdapter):
    name = "ktransformers_legacy"
    title = "KTransformers"
    settings = LegacySettings
    matrix = FlagMatrix("KTransformers", "ktransformers_flags.json")
    vocabulary = Vocabulary(LEGACY_SPELLINGS, LEGACY_OWNED, {})
    # It answers OpenAI requests but none of the routers' worker APIs (no health route, no
    # server info).
    router = NoRouter("the legacy KTransformers server has no router hpcserve can put in front "
                      "of it")
    sim_file = "ktransformers_legacy.py"
    # It ships no serving benchmark client; SGLang's speaks the OpenAI completions it serves
    # (benchmark.python must name a python that has it).
    bench_client = "sglang"
    # It has no health route; the model is loaded before uvicorn starts, so the first answer
    # of /v1/models means ready.
    # no health route: the first answer of /v1/models (facts.KTRANSFORMERS_LEGACY)
    facts = KT_LEGACY_FACTS
    health_path = KT_LEGACY_FACTS["liveness_path"]
    # No start-up lines: the legacy server prints "loading <tensor> to <device>" per tensor
    # (ktransformers/util/utils.py, v0.2.0 to v0.4.1) and nothing once all are loaded; its
    # ready moment is the first answer of /v1/models. Its engine phases show as unknown.
    startup_patterns: dict = {}

    def release(self, version: str, check_as: str | None = None) -> Release:
        rel = self.matrix.release(version, check_as)
        data = self.matrix.data(rel)
        if not data.get("legacy_server"):
            raise FlagError(("engine", "version"),
                            f"KTransformers {version} has no legacy server (ktransformers/"
                            "server/main.py moved to archive/ in 0.4.2): use engine.name: "
                            "ktransformers, kt-kernel inside SGLang, or a release 0.2.0 to "
                            "0.4.1")
        if "--cache_lens" not in rel.flags:
            raise FlagError(("engine", "version"),
                            f"KTransformers {version}'s server predates --cache_lens and the "
                            "balance_serve backend: use 0.2.0 or later")
        return rel

    def command(self, python: str) -> list[Word]:
        return [python, "-m", "ktransformers.server.main"]

    def layout(self, rel: Release, ctx: RoleContext) -> Layout:
        st = dict(ctx.settings)
        if ctx.pd:
            raise FlagError((), "the legacy KTransformers server has no prefill/decode "
                                "disaggregation: use the role worker")
        if ctx.shared or ctx.nodes > 1:
            raise FlagError(("gpus",) if ctx.shared else ("nodes",),
                            "a legacy KTransformers server runs on one whole node")
        if not st.get("gguf_path"):
            raise FlagError(("gguf_path",), "the legacy KTransformers server needs gguf_path")
        cores = getattr(ctx.node, "cpu_cores", None)
        if st.get("cpu_infer") is None and cores and cores > ctx.gpus:
            st["cpu_infer"] = cores - ctx.gpus
        cpus = getattr(ctx.node, "cpus", None) or cores
        parallel = (("gpus", ctx.gpus),) + (
            (("cpu_threads", st["cpu_infer"]),) if st.get("cpu_infer") else ())
        # Its injection rules put the routed experts on the CPUs (GGUF); the memory of either
        # side is not modelled (the fit report says so).
        arch = ctx.architecture
        return Layout(parallel=parallel, settings=st, cpus_per_task=cpus,
                      host_weight_bytes=arch.expert_bytes if arch else 0.0)

    def ports(self, ctx: RoleContext, layout: Layout) -> list[PortRequest]:
        return [PortRequest("http", 10002, field="port", label="http")]

    def launch(self, rel, ctx, layout, ports, *, model_path, served_name, net) -> Launch:
        w: list[Word] = ["--host", (Var("NODE_IP"),), "--port", str(ports["http"]),
                         "--model_path", model_path]
        if served_name:
            w += ["--model_name", served_name]
        st = dict(layout.settings)
        # type=bool options take a value and bool() it: any text but "" is True.
        bools = set(self.matrix.data(rel).get("bool_from_str", ()))
        st["args"] = {k: ("True" if v is True else None if v is False else v)
                      if "--" + k in bools else v for k, v in st["args"].items()}
        words, warnings = self.settings_argv(rel, st)
        # The server keeps its config copy, logs and database under $HOME/.ktransformers and
        # reads only that copy once made: a home of the job's own per node, so neither another
        # release's copy nor another job's database is used.
        env = (("HOME", (Var("JOB_DIR"), "/run/ktransformers-home/", Var("SLURMD_NODENAME"))),)
        return Launch(argv=tuple(w + words), env=env, warnings=tuple(warnings))

    def describe(self, parallel) -> str:
        p = dict(parallel)
        return f"{p['gpus']} GPU(s)" + (f", {p['cpu_threads']} CPU expert threads"
                                        if p.get("cpu_threads") else "")


LEGACY_ADAPTER = KTransformersLegacy()
