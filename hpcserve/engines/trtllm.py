"""TensorRT-LLM: `trtllm-serve` under Slurm's PMIx, its LLM API options file, and its
disaggregated front server.

The options each release accepts come from `data/trtllm_flags.json`, which
tools/extract_trtllm_flags.py reads out of the release's source (`tensorrt_llm/commands/
serve.py`'s click options, `tensorrt_llm/llmapi/llm_args.py`'s fields): the wheel needs CUDA to
import, so its own parser cannot run on a CPU machine.

How it runs (TensorRT-LLM docs, "trtllm-serve" and "Disaggregated Serving"):
- one Slurm task per GPU, `srun --mpi=pmix`, each running `trtllm-llmapi-launch trtllm-serve
  serve MODEL ...`: the launcher takes the MPI rank from Slurm, rank 0 serves HTTP and the other
  ranks are its MPI workers. The seed guides start the same world with `mpirun -H host1:8,
  host2:8` and passwordless SSH set up by hand inside the containers; under Slurm, srun already
  knows every rank's node and PMIx wires the world, so there is no SSH, no host list and no
  hand-made key to leak;
- `--host` is the node's own address (trtllm-serve's default is localhost, which no router or
  front server on another node can reach);
- the extra LLM API options (`--extra_llm_api_options FILE`) are written into the job
  directory from the deployment: the release's own field names, unknown ones refused;
- disaggregated serving: context (prefill) and generation (decode) servers, each with its
  `cache_transceiver_config`, behind `trtllm-serve disaggregated -c FILE`, whose file lists the
  servers' addresses and is written in the router's task once they are known.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from ..author.schema import doc
from ..author.values import ArgValue, EnvValue
from ..author.words import Var, Word
from .base import (EngineAdapter, Launch, Layout, MemoryBudget, NoRouter, PortRequest,
                   RoleContext, RouterAdapter, RouterReadiness, SettingsBase, args_field,
                   env_field, kv_dtype_bytes, tp_pp, tp_words)
from .flags import FlagError, FlagMatrix, Release, Vocabulary, fmt
from .facts import TRTLLM as TRTLLM_FACTS

HTTP_PORT = 8200          # not trtllm-serve's 8000, which the router in front usually takes
TRTLLM_FLAG = r"[a-z0-9][a-z0-9_-]*"   # click options are spelled with underscores
LLM_API_DIR = "llm-api"   # in the job directory: one options file per role


@dataclass(frozen=True)
class TRTLLMSettings(SettingsBase):
    """TensorRT-LLM settings that a model profile defaults and a deployment role overrides.
    Named settings become `trtllm-serve` options or keys of the LLM API options file;
    `llm_api` adds any other key of that file (checked against the release's fields)."""

    tp: int | None = field(default=None, metadata=doc(
        "tensor-parallel size; default: the instance's GPUs / pp", ge=1))
    pp: int | None = field(default=None, metadata=doc("pipeline-parallel size", ge=1))
    ep: int | None = field(default=None, metadata=doc(
        "MoE expert-parallel size (--ep_size); must divide tp", ge=1))
    attention_dp: bool | None = field(default=None, metadata=doc(
        "attention data parallelism (enable_attention_dp in the options file)"))
    backend: str | None = field(default=None, metadata=doc(
        "pytorch (TensorRT-LLM's default), tensorrt or _autodeploy"))
    max_batch_size: int | None = field(default=None, metadata=doc("", ge=1))
    max_num_tokens: int | None = field(default=None, metadata=doc("", ge=1))
    context_length: int | None = field(default=None, metadata=doc(
        "longest sequence (--max_seq_len)", ge=1))
    kv_cache_free_gpu_memory_fraction: float | None = field(default=None, metadata=doc(
        "fraction of the GPU memory left after the weights that the KV cache takes", ge=0.05,
        le=0.99))
    cache_transceiver: Literal["DEFAULT", "UCX", "NIXL", "MOONCAKE", "MPI"] | None = field(
        default=None, metadata=doc("KV transfer between context and generation servers (PD "
                                   "only; cache_transceiver_config.backend, default DEFAULT)"))
    cache_max_tokens_in_buffer: int | None = field(default=None, metadata=doc(
        "cache_transceiver_config.max_tokens_in_buffer (PD only)", ge=1))
    trust_remote_code: bool | None = None
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    llm_api: dict[str, Any] | None = field(default=None, metadata=doc(
        "more keys of the LLM API options file (--extra_llm_api_options), e.g. "
        "{cuda_graph_config: {enable_padding: true}, print_iter_log: true}; merged key by key "
        "over the profile's"))
    args: dict[str, ArgValue] = args_field(TRTLLM_FLAG)  # options spelled with _
    env: dict[str, EnvValue] = env_field()


# Options hpcserve derives from the plan; a user setting them in `args` would break the topology.
OWNED = {
    "--host": "site.network.interface", "--port": "roles.<role>.port",
    "--tp_size": "tp", "--tensor_parallel_size": "tp", "--pp_size": "pp",
    "--pipeline_parallel_size": "pp", "--ep_size": "ep", "--moe_expert_parallel_size": "ep",
    "--extra_llm_api_options": "llm_api", "--config": "llm_api",
    "--gpus_per_node": "site.node.gpus", "--cluster_size": "(the instance's GPUs)",
    "--server_role": "the role name", "--disagg_cluster_uri": "(the disaggregated front server)",
    "--metadata_server_config_file": "(the disaggregated front server)",
}

# Keys of the options file that named settings or the plan write.
OWNED_KEYS = {
    "enable_attention_dp": "attention_dp", "cache_transceiver_config": "cache_transceiver",
    "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp",
    "moe_expert_parallel_size": "ep", "max_batch_size": "max_batch_size",
    "max_num_tokens": "max_num_tokens", "max_seq_len": "context_length",
    "backend": "backend", "trust_remote_code": "trust_remote_code",
}

SPELLINGS = (
    ("backend", (lambda v: ["--backend", v],)),
    ("tp", (lambda v: ["--tp_size", fmt(v)],)),
    ("pp", (lambda v: ["--pp_size", fmt(v)],)),
    ("ep", (lambda v: ["--ep_size", fmt(v)],)),
    ("kv_cache_free_gpu_memory_fraction",
     (lambda v: ["--kv_cache_free_gpu_memory_fraction", fmt(v)],)),
    ("trust_remote_code", (lambda v: ["--trust_remote_code"] if v else [],)),
    ("max_batch_size", (lambda v: ["--max_batch_size", fmt(v)],)),
    ("max_num_tokens", (lambda v: ["--max_num_tokens", fmt(v)],)),
    ("context_length", (lambda v: ["--max_seq_len", fmt(v)],)),
    ("tool_parser", (lambda v: ["--tool_parser", v],)),
    ("reasoning_parser", (lambda v: ["--reasoning_parser", v],)),
)


class DisaggServer(RouterAdapter):
    """`trtllm-serve disaggregated -c FILE`: the front server of context and generation servers.
    It sends each request to a context server (disaggregated_params request_type context_only),
    then to a generation server with what the context server returned. It waits for every
    server to answer /health before it serves, for at most --server_start_timeout."""

    name = "trtllm-serve disaggregated"
    owned = frozenset({"--config_file", "-c", "--server_start_timeout", "-t",
                       "--metadata_server_config_file", "-m"})
    stand_in = ("disaggregated",)
    config = "disagg.yaml"   # under run/, written by the router's task

    def command(self, python: str) -> list[Word]:
        return ["trtllm-serve", "disaggregated"]

    def readiness(self, pd: bool) -> RouterReadiness:
        # It listens only once every server answered /health: a 200 is readiness.
        return RouterReadiness("/health", ())

    def workers_api(self, pd: bool) -> str:
        # Its servers come from the config file at start (TensorRT-LLM 1.3.0rc3,
        # tensorrt_llm/serve/openai_disagg_server.py OpenAIDisaggServer.__init__:
        # get_ctx_gen_server_addrs); Router.add_server/remove_server (serve/router.py) run only
        # for a disagg_cluster watch (openai_disagg_service.py _on_worker_event) or a metadata
        # server (-m, Router._monitor_servers), both of which hpcserve leaves out, and no HTTP
        # route (register_routes) changes them: restart it with the new file.
        return "restart"

    def argv(self, *, pd, prefill, decode, workers, port, prometheus_port, policy, args,
             start_timeout):
        # Its default of 180 s to see every server healthy is short for a 1T-parameter load.
        return ["-c", (Var("JOB_DIR"), f"/run/{self.config}"),
                "-t", str(start_timeout)] + self.extra_args(args)

    def config_files(self, *, pd, prefill, decode, workers, port):
        lines: list[Word] = [("hostname: ", *self.HOST), f"port: {port}"]
        for key, urls in (("context_servers", [u for u, _ in prefill]),
                          ("generation_servers", decode)):
            lines += [f"{key}:", f"  num_instances: {len(urls)}", "  urls:"]
            lines += [("  - \"", *_host_port(u), "\"") for u in urls]
        return {self.config: lines}


def _host_port(url: Word) -> tuple:
    """("http://", Var, ":8200") -> (Var, ":8200"): the front server's config takes host:port."""
    return tuple(p for p in url if p != "http://")


class TRTLLM(EngineAdapter):
    name = "trtllm"
    title = "TensorRT-LLM"
    settings = TRTLLMSettings
    # Extracted from the source of 1.3.0rc3, the release after the 1.2 branch: the NVIDIA
    # repository was too large to mirror where the table was made. The options hpcserve writes
    # are in trtllm-serve since 1.0 (TensorRT-LLM docs, "trtllm-serve" command reference); a
    # 1.2.x deployment says engine.check_flags_as: newest to be checked against 1.3.0rc3.
    matrix = FlagMatrix("TensorRT-LLM", "trtllm_flags.json")
    vocabulary = Vocabulary(SPELLINGS, OWNED, {})
    router = DisaggServer()
    sim_file = "trtllm.py"
    bench_client = "trtllm"
    port_fields: dict[str, str] = {}
    # No start-up lines: those of 1.3.0rc3 could not be read in its source here (the NVIDIA
    # repository is too large to mirror), so its engine phases show as unknown.
    startup_patterns: dict = {}
    # While serving: /health_generate runs a 1-token chat through the executor (facts.TRTLLM);
    # /health only says the executor has not shut down, which a hung one has not
    facts = TRTLLM_FACTS
    liveness_path = TRTLLM_FACTS["liveness_path"]

    def command(self, python: str) -> list[Word]:
        # The launcher maps Slurm's rank to TensorRT-LLM's MPI roles (rank 0 serves HTTP).
        return ["trtllm-llmapi-launch", "trtllm-serve"]

    def instance_smoke(self, pd: bool) -> tuple[str, str]:
        # A context or generation server alone cannot answer a chat (the front server pairs
        # them): its health is what can be asked.
        return ("get", self.health_path) if pd else ("chat", "/v1/chat/completions")

    def router_for(self, pd: bool) -> RouterAdapter:
        # The front server pairs context with generation servers; it cannot balance plain ones.
        return self.router if pd else PLAIN_ROUTER

    def layout(self, rel: Release, ctx: RoleContext) -> Layout:
        st = ctx.settings
        tp, pp = tp_pp(ctx, ": TensorRT-LLM runs one MPI rank per GPU and needs tp x pp ranks")
        ep = st["ep"]
        if ep is not None and tp % ep:
            raise FlagError(("ep",), f"ep {ep} must divide {tp_words(ctx, tp)} (TensorRT-LLM "
                                     "splits the TP group into expert-parallel and MoE "
                                     "tensor-parallel parts)")
        if (st["cache_transceiver"] or st["cache_max_tokens_in_buffer"]) and not ctx.pd:
            key = "cache_transceiver" if st["cache_transceiver"] else "cache_max_tokens_in_buffer"
            raise FlagError((key,), f"{key} is for disaggregated serving (roles prefill and "
                                    "decode)")
        parallel = (("tp", tp),) + ((("pp", pp),) if pp > 1 else ()) + (
            (("ep", ep),) if ep else ()) + ((("attn_dp", tp),) if st["attention_dp"] else ())
        spelled = {**st, "tp": tp, "pp": pp if pp > 1 else None}
        return Layout(parallel=parallel, ep=ep, settings=spelled,
                      tasks_per_node=ctx.gpus // ctx.nodes, mpi="pmix")

    def ports(self, ctx: RoleContext, layout: Layout) -> list[PortRequest]:
        return [PortRequest("http", HTTP_PORT, field="port", stride=1 if not ctx.shared else 10,
                            label="http")]

    def launch(self, rel, ctx, layout, ports, *, model_path, served_name, net) -> Launch:
        path = f"{LLM_API_DIR}/{ctx.role}.yaml"
        w: list[Word] = ["serve", model_path, "--host", (Var("NODE_IP"),),
                         "--port", str(ports["http"])]
        settings = dict(layout.settings)
        words, warnings = self.settings_argv(rel, settings)
        w += words
        w += ["--extra_llm_api_options", (Var("JOB_DIR"), "/" + path)]
        text = llm_api_file(rel, ctx, settings)
        env: list[tuple[str, Word]] = []
        if not net.has_ib and ctx.pd:
            env.append(("UCX_TLS", "tcp,sm,self"))  # no HCAs: UCX must not look for RDMA
        return Launch(argv=tuple(w), env=tuple(env), warnings=tuple(warnings),
                      files=((path, text),))

    def memory_budget(self, settings, layout, gpu_bytes, weights):
        """kv_cache_free_gpu_memory_fraction (0.9) of the memory left after the weights (and
        the runtime's buffers, left out here) goes to the KV cache."""
        kv_cfg = (settings.get("llm_api") or {}).get("kv_cache_config") or {}
        frac = (settings.get("kv_cache_free_gpu_memory_fraction")
                or kv_cfg.get("free_gpu_memory_fraction") or 0.9)
        return MemoryBudget(frac * (gpu_bytes - weights),
                            f"kv_cache_free_gpu_memory_fraction {frac:g} x "
                            f"({gpu_bytes / 2 ** 30:g} GiB - weights)",
                            kv_dtype_bytes(kv_cfg.get("dtype")))

    def describe(self, parallel) -> str:
        names = {"tp": "TP", "pp": "PP", "ep": "EP", "attn_dp": "attention-DP"}
        return ", ".join(f"{names[k]} {v}" for k, v in parallel)


def llm_api_file(rel: Release, ctx: RoleContext, settings: dict) -> str:
    """The LLM API options YAML of a role: named settings, then `llm_api`, keys checked against
    the release's LlmArgs fields (TensorRT-LLM refuses unknown ones)."""
    api = ADAPTER.matrix.data(rel).get("llm_api", {})
    fields = set(api.get("fields", ()))
    out: dict[str, Any] = {}
    user = settings.get("llm_api") or {}
    for key, value in user.items():
        if key in OWNED_KEYS:
            raise FlagError(("llm_api", key), f"{key} is written by hpcserve; use the setting "
                                              f"{OWNED_KEYS[key]}")
        if fields and key not in fields:
            raise FlagError(("llm_api", key), f"TensorRT-LLM {rel.version} has no LLM API "
                                              f"option {key}" + _closest(key, fields))
        for sub, known in (("cuda_graph_config", "cuda_graph_config"),
                           ("kv_cache_config", "kv_cache_config"),
                           ("moe_config", "moe_config")):
            if key == sub and isinstance(value, dict) and api.get(known):
                for k in value:
                    if k not in api[known]:
                        raise FlagError(("llm_api", key, k),
                                        f"TensorRT-LLM {rel.version} has no {key}.{k}"
                                        + _closest(k, api[known]))
        out[key] = value
    if settings.get("attention_dp") is not None:
        out["enable_attention_dp"] = bool(settings["attention_dp"])
    if ctx.pd:
        ct: dict[str, Any] = {"backend": settings.get("cache_transceiver") or "DEFAULT"}
        if settings.get("cache_max_tokens_in_buffer"):
            ct["max_tokens_in_buffer"] = settings["cache_max_tokens_in_buffer"]
        out["cache_transceiver_config"] = ct
        if ctx.role == "prefill" and "disable_overlap_scheduler" not in out:
            # What the disaggregated serving docs set on every context server.
            out["disable_overlap_scheduler"] = True
    head = (f"# TensorRT-LLM {rel.version} LLM API options of every {ctx.role} server "
            "(--extra_llm_api_options), written by hpcserve from the deployment\n")
    return head + (yaml.safe_dump(out, sort_keys=False, default_flow_style=False)
                   if out else "{}\n")


def _closest(key: str, known) -> str:
    import difflib   # here: only an error needs it
    near = [k for k in sorted(known) if _same_words(k, key)] or \
        difflib.get_close_matches(key, sorted(known), n=1)
    return f" (did you mean {near[0]}?)" if near else ""


def _same_words(a: str, b: str) -> bool:
    """padding_enabled ~ enable_padding: the same words, in any order, up to an ending."""
    wa, wb = a.split("_"), b.split("_")
    return len(wa) == len(wb) and all(
        any(x.startswith(y) or y.startswith(x) for y in wb) for x in wa)


PLAIN_ROUTER = NoRouter("TensorRT-LLM's front server (trtllm-serve disaggregated) needs context "
                        "and generation servers (roles prefill and decode)")
ADAPTER = TRTLLM()
