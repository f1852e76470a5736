"""SGLang: its settings vocabulary, the version-correct launch_server argv and sglang-router.

The flags each SGLang release accepts come from `data/sglang_flags.json`, extracted from the
release wheels by tools/extract_sglang_flags.py and checked against the real parser in tests.
Named settings are spelled per version by picking the first spelling whose flags all exist (and
are not deprecated) in the configured release; raw `args` are refused when the release lacks
them, with the release range that has them and the named setting that replaces them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..author.schema import doc
from ..author.values import ArgValue, EnvValue
from ..author.words import Var, Word
from .base import (CacheVar, EngineAdapter, Launch, Layout, MemoryBudget, Metrics, PortRequest,
                   RoleContext, RouterAdapter, RouterReadiness, SettingsBase, args_field, env_field,
                   kv_dtype_bytes, tp_pp, tp_words)
from .flags import FlagError, FlagMatrix, Release, Vocabulary, fmt
from .facts import SGLANG as SGLANG_FACTS, moving

ENGINE_PORT = 30000
BOOTSTRAP_PORT = 8998
DIST_INIT_PORT = 5757
NCCL_PORT = 31000


@dataclass(frozen=True)
class SGLangSettings(SettingsBase):
    """SGLang settings that a model profile defaults and a deployment role overrides.

    The named settings are spelled per engine version by hpcserve (for example attn_dp becomes
    `--attn-dp-size N` on SGLang >= 0.5.22 and `--dp-size N --enable-dp-attention` before);
    `args` are passed as they are, after checking that the configured version has each flag.
    """

    tp: int | None = field(default=None, metadata=doc(
        "tensor-parallel size; default: all GPUs of the instance", ge=1))
    pp: int | None = field(default=None, metadata=doc("pipeline-parallel size", ge=1))
    attn_dp: int | None = field(default=None, metadata=doc(
        "data-parallel attention groups inside the TP group (DP attention)", ge=1))
    dp_attention: bool | None = field(default=None, metadata=doc(
        "DP attention across the whole TP group: attn_dp defaults to tp"))
    dp: int | None = field(default=None, metadata=doc("data-parallel model replicas", ge=1))
    ep: int | None = field(default=None, metadata=doc(
        "expert-parallel size (forced to tp with DeepEP)", ge=1))
    moe_a2a_backend: str | None = field(default=None, metadata=doc(
        "MoE all-to-all backend, e.g. deepep"))
    deepep_mode: Literal["auto", "normal", "low_latency"] | None = None
    redundant_experts: int | None = field(default=None, metadata=doc(
        "EPLB redundant experts (--ep-num-redundant-experts)", ge=0))
    cuda_graph_max_bs: int | None = field(default=None, metadata=doc(
        "largest decode batch captured in a CUDA graph", ge=1))
    cuda_graph_bs: list[int] | None = field(default=None, metadata=doc(
        "explicit decode batch sizes captured in CUDA graphs", ge=1, min_items=1))
    disable_cuda_graph: bool | None = None
    mem_fraction_static: float | None = field(default=None, metadata=doc(
        "fraction of GPU memory for weights and KV cache", ge=0.05, le=0.99))
    max_running_requests: int | None = field(default=None, metadata=doc("", ge=1))
    context_length: int | None = field(default=None, metadata=doc("", ge=1))
    chunked_prefill_size: int | None = None
    prefetch_checkpoints: bool | None = field(default=None, metadata=doc(
        "read the checkpoint files into the page cache before loading, each rank a share of "
        "them (--weight-loader-prefetch-checkpoints): for Lustre/NFS"))
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    trust_remote_code: bool | None = None
    args: dict[str, ArgValue] = args_field()
    env: dict[str, EnvValue] = env_field()


# Flags hpcserve derives from the plan; a user setting them in `args` would break the topology.
OWNED = {
    "--model-path": "model.path", "--model": "model.path",
    "--served-model-name": "model.served_name",
    "--host": "site.network.interface", "--port": "roles.<role>.port",
    "--enable-metrics": "(always on: liveness reads the engine's counters)",
    "--dist-init-addr": "roles.<role>.dist_init_port", "--nccl-init-addr": "roles.<role>.dist_init_port",
    "--nnodes": "roles.<role>.nodes", "--node-rank": "(computed in the task)",
    "--disaggregation-mode": "the role name", "--disaggregation-bootstrap-port": "roles.<role>.bootstrap_port",
    "--disaggregation-ib-device": "site.network.ib_devices",
    "--tp-size": "tp", "--tensor-parallel-size": "tp", "--tp": "tp",
    "--pp-size": "pp", "--dp-size": "dp or attn_dp", "--data-parallel-size": "dp",
    "--attn-dp-size": "attn_dp", "--attention-data-parallel-size": "attn_dp",
    "--enable-dp-attention": "attn_dp", "--ep-size": "ep", "--ep": "ep",
    "--expert-parallel-size": "ep", "--nccl-port": "(allocated by hpcserve's port registry)",
}

# Old flags whose meaning a named setting now carries, so an error can say what to write.
LEGACY = {
    "--enable-deepep-moe": "moe_a2a_backend: deepep",
    "--enable-ep-moe": "ep: <tp>",
    "--cuda-graph-max-bs": "cuda_graph_max_bs: N",
    "--cuda-graph-bs": "cuda_graph_bs: [N, ...]",
    "--cuda-graph-max-bs-decode": "cuda_graph_max_bs: N",
    "--cuda-graph-bs-decode": "cuda_graph_bs: [N, ...]",
    "--disable-cuda-graph": "disable_cuda_graph: true",
    "--ep-num-redundant-experts": "redundant_experts: N",
    "--deepep-mode": "deepep_mode: ...",
    "--moe-a2a-backend": "moe_a2a_backend: ...",
    "--disaggregation-decode-tp": "(removed: decode TP is the decode instance's own tp)",
    "--disaggregation-decode-dp": "(removed: decode DP is the decode instance's own attn_dp)",
}

# Named settings in argv order: (setting, spellings newest first).
SPELLINGS = (
    ("tp", (lambda v: ["--tp-size", fmt(v)],)),
    ("pp", (lambda v: ["--pp-size", fmt(v)],)),
    ("attn_dp", (lambda v: ["--attn-dp-size", fmt(v)],
                 lambda v: ["--dp-size", fmt(v), "--enable-dp-attention"])),
    ("dp", (lambda v: ["--dp-size", fmt(v)],)),
    ("ep", (lambda v: ["--ep-size", fmt(v)],)),
    ("moe_a2a_backend", (lambda v: ["--moe-a2a-backend", v],
                         # before --moe-a2a-backend (<= 0.4.9): DeepEP was a switch, none the default
                         lambda v: ["--enable-deepep-moe"] if v == "deepep" else
                         [] if v == "none" else ["--moe-a2a-backend", v])),
    ("deepep_mode", (lambda v: ["--deepep-mode", v],)),
    ("redundant_experts", (lambda v: ["--ep-num-redundant-experts", fmt(v)],)),
    ("cuda_graph_max_bs", (lambda v: ["--cuda-graph-max-bs-decode", fmt(v)],
                           lambda v: ["--cuda-graph-max-bs", fmt(v)])),
    ("cuda_graph_bs", (lambda v: ["--cuda-graph-bs-decode", *map(fmt, v)],
                       lambda v: ["--cuda-graph-bs", *map(fmt, v)])),
    ("disable_cuda_graph", (lambda v: ["--cuda-graph-backend-decode", "disabled",
                                       "--cuda-graph-backend-prefill", "disabled"] if v else [],
                            lambda v: ["--disable-cuda-graph"] if v else [])),
    ("mem_fraction_static", (lambda v: ["--mem-fraction-static", fmt(v)],)),
    ("max_running_requests", (lambda v: ["--max-running-requests", fmt(v)],)),
    ("context_length", (lambda v: ["--context-length", fmt(v)],)),
    ("chunked_prefill_size", (lambda v: ["--chunked-prefill-size", fmt(v)],)),
    ("tool_call_parser", (lambda v: ["--tool-call-parser", v],)),
    ("reasoning_parser", (lambda v: ["--reasoning-parser", v],)),
    ("trust_remote_code", (lambda v: ["--trust-remote-code"] if v else [],)),
    ("prefetch_checkpoints", (lambda v: ["--weight-loader-prefetch-checkpoints"] if v else [],)),
)


class SGLangRouter(RouterAdapter):
    """sglang-router (0.3.x): every prefill URL with its bootstrap port, every decode URL."""

    name = "sglang-router"
    owned = frozenset({"--host", "--port", "--pd-disaggregation", "--prefill", "--decode",
                       "--worker-urls", "--policy", "--prometheus-host", "--prometheus-port"})
    # Prometheus text on --prometheus-port (its smg_* series; tests/jobs scrape it there)
    metrics_path = "/metrics"
    refused = RouterAdapter.NO_MINI_LB
    package = "sglang_router"
    # 0.3.2 answers 401 without it to its worker API and every generation request (its health
    # and readiness paths stay open), and sends it to the workers (tests/sim/
    # test_router_workers.py asks the release)
    api_key_flag = "api-key"

    def keys_workers(self, pd: bool) -> bool:
        return True  # its own --api-key, in plain and PD mode

    def command(self, python: str) -> list[Word]:
        return self.launch_router(python)

    def readiness(self, pd: bool) -> RouterReadiness:
        return RouterReadiness("/readiness", ("healthy_workers",))

    def workers_api(self, pd: bool) -> str:
        # POST/DELETE /workers in PD and plain mode alike, each a queued job (checked against
        # 0.3.2 in tests/sim/test_router_workers.py).
        return "queued"

    def argv(self, *, pd, prefill, decode, workers, port, prometheus_port, policy, args,
             start_timeout):
        w: list[Word] = []
        if pd:
            w.append("--pd-disaggregation")
            for url, bport in prefill:
                w += ["--prefill", url, str(bport)]
            for url in decode:
                w += ["--decode", url]
        else:
            w.append("--worker-urls")
            w += workers
        w += ["--host", self.HOST, "--port", str(port), "--policy", policy,
              "--prometheus-host", self.HOST, "--prometheus-port", str(prometheus_port)]
        return w + self.extra_args(args)


# The caches SGLang 0.5.23 reads (its source, sglang/srt/environ.py): SGLANG_CACHE_DIR, the root
# of its own compiled kernels (cute_aot/, ...); SGLANG_DG_CACHE_DIR, DeepGEMM's JIT cache, which
# sglang/srt/layers/deep_gemm_wrapper/compile_utils.py hands DeepGEMM as DG_JIT_CACHE_DIR;
# TRITON_CACHE_DIR and FLASHINFER_WORKSPACE_BASE, which environ.py's
# third_party_cache_defaults() names as Triton's cache and FlashInfer's base directory (FlashInfer
# adds .cache/flashinfer). TORCHINDUCTOR_CACHE_DIR is not set: SGLang's torch.compile points it
# inside its own compile cache (sglang/srt/compilation/compiler_interface.py).
CACHES = (CacheVar("sglang", "SGLANG_CACHE_DIR", "0.5.23"),
          CacheVar("triton", "TRITON_CACHE_DIR", "0.5.23"),
          CacheVar("deep_gemm", "SGLANG_DG_CACHE_DIR", "0.5.23"),
          CacheVar("flashinfer", "FLASHINFER_WORKSPACE_BASE", "0.5.23"))


# The SGLang releases hpcserve accepts: those whose own parser (sglang.srt.server_args.ServerArgs
# .add_cli_args) its tests run every generated command line through (tests/engine_parsers/
# test_sglang_releases.py, the wheels from https://pypi.org/project/sglang/). The older releases
# of the flag table (0.4.6.post5 to 0.5.16) stay there as data but are refused: their parser
# module imports transformers at load (0.5.16's server_args.py imports sglang.srt.configs, whose
# model configs subclass transformers' classes), which the CPU engines venv does not hold, so
# no test could check their flags with the engine itself.
CHECKED = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")


class SGLang(EngineAdapter):
    name = "sglang"
    title = "SGLang"
    settings = SGLangSettings
    matrix = FlagMatrix("SGLang", "sglang_flags.json", CHECKED)
    vocabulary = Vocabulary(SPELLINGS, OWNED, LEGACY)
    router = SGLangRouter()
    sim_file = "sglang.py"
    bench_client = "sglang"
    # 0.5.23 asks it of every request but /health*, /ready* and /metrics*
    # (sglang/srt/utils/auth.py: decide_request_auth); taken only on the command line, which
    # secret_argv.py keeps it off
    api_key_flag = "api-key"
    caches = CACHES
    facts = SGLANG_FACTS
    # Progress: the counter 0.5.23 moves every decode iteration and every prefill batch
    # (sglang:realtime_tokens_total); its prompt and generation token counters move only when a
    # request finishes, so a long answer streaming would read as still (engines/facts.py).
    # The gauges come from /v1/loads, one sample per DP rank of every node: rank 0's /metrics
    # holds its own node's schedulers only. Only running requests count as held (a queued one
    # may wait for memory or for its KV from a prefill); a drain waits for the waiting ones
    # too, PD's bootstrap, pre-allocation and transfer queues included (LoadSnapshot's
    # num_waiting_reqs); kv_usage is each DP rank's token_usage, the fullest deciding.
    _loads = SGLANG_FACTS["loads"]
    metrics = Metrics(SGLANG_FACTS["metrics_path"], tuple(moving(SGLANG_FACTS, {})),
                      (_loads["running"],), (_loads["waiting"],), (_loads["kv_usage"],),
                      gauges_path=_loads["path"])
    # /health_generate: a 200 there proves the scheduler produced output since the probe began
    liveness_path = SGLANG_FACTS["liveness_path"]
    port_fields = {"bootstrap_port": "first PD bootstrap port (prefill)",
                   "dist_init_port": "first torch.distributed init port"}
    # Read in each accepted release's wheel (0.5.20 to 0.5.23; as far back as 0.4.6.post5 the
    # lines are the same): ModelRunner.load_model logs
    # f"Load weight end. ..." (sglang/srt/model_executor/model_runner.py) once the weights are
    # on the GPU, and _wait_and_warmup logs "The server is fired up and ready to roll!"
    # (sglang/srt/entrypoints/http_server.py) after the warm-up request. 0.5.23 leaves the
    # weights line out where it overlaps the weight load with start-up (startup_weight_load):
    # that phase then shows as unknown.
    startup_patterns = {v: {"weights_loaded": r"Load weight end\. ",
                            "ready": r"The server is fired up and ready to roll!"}
                        for v in CHECKED}

    def command(self, python: str) -> list[Word]:
        return [python, "-m", "sglang.launch_server"]

    def instance_smoke(self, pd: bool) -> tuple[str, str]:
        # /health_generate runs a one-token generation, also on a PD half (with a fake
        # bootstrap), which a chat request to a prefill or decode server alone could not.
        return ("get", "/health_generate")

    def layout(self, rel: Release, ctx: RoleContext) -> Layout:
        st = ctx.settings
        tp, pp = tp_pp(ctx)
        attn_dp = st["attn_dp"]
        if attn_dp is None and st["dp_attention"]:
            attn_dp = tp
        if attn_dp is not None and tp % attn_dp:
            raise FlagError(("attn_dp",), f"attn_dp {attn_dp} must divide {tp_words(ctx, tp)}")
        ep = st["ep"]
        deepep = st["moe_a2a_backend"] not in (None, "none")
        if deepep and ep is not None and ep != tp:
            raise FlagError(("ep",), f"with moe_a2a_backend {st['moe_a2a_backend']} SGLang "
                                     f"forces ep to {tp_words(ctx, tp)}; ep {ep} cannot be "
                                     "honoured")
        ep_eff = tp if deepep else ep
        spelled = {**st, "tp": tp if tp > 1 or st["tp"] else None, "attn_dp": attn_dp}
        spelled.pop("dp_attention")
        parallel = (("tp", tp),) + ((("attn_dp", attn_dp),) if attn_dp else ()) + (
            (("ep", ep_eff),) if ep_eff else ())
        return Layout(parallel=parallel, ep=ep_eff, settings=spelled)

    def ports(self, ctx: RoleContext, layout: Layout) -> list[PortRequest]:
        # SGLang derives more ports from --port (port + 233 and up, one per DP rank), so
        # instances sharing a node get HTTP ports a wide stride apart.
        req = [PortRequest("http", ENGINE_PORT, field="port", stride=1000 if ctx.shared else 1,
                           label="http")]
        if ctx.role == "prefill":
            req.append(PortRequest("bootstrap", BOOTSTRAP_PORT, field="bootstrap_port",
                                   label="bootstrap"))
        req.append(PortRequest("dist_init", DIST_INIT_PORT, field="dist_init_port",
                               label="dist-init" if ctx.nodes > 1 else None))
        if ctx.shared:  # SGLang's own free-port probe races between co-located instances
            req.append(PortRequest("nccl", NCCL_PORT))
        return req

    def launch(self, rel, ctx, layout, ports, *, model_path, served_name, net) -> Launch:
        """The launch_server argv of one instance; node-specific parts are Vars resolved in the
        task."""
        mode = ctx.role if ctx.pd else None
        w: list[Word] = ["--model-path", model_path]
        if served_name:
            w += ["--served-model-name", served_name]
        # Its counters tell a hung engine from a busy one (off by default in SGLang).
        w += ["--host", (Var("NODE_IP"),), "--port", str(ports["http"]), "--enable-metrics"]
        if mode:
            w += ["--disaggregation-mode", mode]
            if mode == "prefill":
                w += ["--disaggregation-bootstrap-port", str(ports["bootstrap"])]
            if net.ib_word is not None:
                w += ["--disaggregation-ib-device", net.ib_word]
        if ctx.nodes > 1:
            w += ["--dist-init-addr", (Var("LEADER_IP"), f":{ports['dist_init']}"),
                  "--nnodes", str(ctx.nodes), "--node-rank", (Var("NODE_RANK"),)]
        if "nccl" in ports:
            w += ["--nccl-port", str(ports["nccl"])]
        words, warnings = self.settings_argv(rel, dict(layout.settings))
        env: list[tuple[str, Word]] = []
        if not net.has_ib and ctx.pd:
            # No HCAs: Mooncake must use TCP (what SGLang's mooncake_tcp backend sets, in every
            # release).
            env.append(("MC_FORCE_TCP", "1"))
        # SGLang advertises this address to peers; on multi-homed nodes it must be the fabric IP.
        late = [("SGLANG_HOST_IP", (Var("NODE_IP"),))]
        return Launch(argv=tuple(w + words), env=tuple(env), late_env=tuple(late),
                      warnings=tuple(warnings))

    def memory_budget(self, settings, layout, gpu_bytes, weights):
        """mem_fraction_static x GPU holds weights and KV cache. Unset, SGLang derives it
        (sglang/srt/arg_groups/memory_hook.py, 0.5.23): GPU - a reserve of 0.5 GiB + 1.5 MiB per
        activation token (the prefill chunk, 8192 by default on large GPUs, at least 2048) +
        tp x pp / 8 GiB, at least 10 GiB on GPUs over 60 GiB (CUDA graph and DeepEP buffers,
        which add to it, are left out)."""
        frac = settings.get("mem_fraction_static")
        gb = gpu_bytes / 2 ** 30  # GiB, as SGLang's MiB figures
        if frac is None:
            p = dict(layout.parallel)
            tokens = max(settings.get("chunked_prefill_size") or 8192, 2048)
            reserve = 0.5 + 1.5 * tokens / 1024 + p.get("tp", 1) * p.get("pp", 1) / 8
            reserve = max(reserve, 10.0) if gb > 60 else reserve
            frac = round((gb - reserve) / gb, 3)
        kv = frac * gpu_bytes - weights
        return MemoryBudget(kv, f"mem_fraction_static {frac:g} x {gb:g} GiB - weights",
                            kv_dtype_bytes(settings["args"].get("kv-cache-dtype")))

    def describe(self, parallel) -> str:
        p = dict(parallel)
        return f"TP {p['tp']}" + (f", DP-attention {p['attn_dp']}" if p.get("attn_dp") else "") + (
            f", EP {p['ep']}" if p.get("ep") else "")


ADAPTER = SGLang()
