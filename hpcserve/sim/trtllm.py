#!/usr/bin/env python3
"""Simulated TensorRT-LLM: a stand-in for `trtllm-llmapi-launch trtllm-serve serve MODEL ...` and
for `trtllm-serve disaggregated -c FILE` (no GPU, no model). Unlike the other stand-ins it needs
mpi4py and PyYAML, as TensorRT-LLM does.

`serve` runs as one Slurm task per GPU under `srun --mpi=pmix` and forms its world with MPI, as
trtllm-llmapi-launch does:
- the MPI world must hold tp x pp ranks: a wrong task count, or tasks started without PMIx
  (each its own world of one), fails with the rank, its node and both numbers;
- rank 0 binds --host:--port (default localhost, as trtllm-serve's) and serves /health,
  /v1/models, /v1/completions and /v1/chat/completions; the other ranks are its workers and
  serve nothing; the options are TensorRT-LLM 1.3.0rc3's click options (an unknown one is refused
  with click's words), the --extra_llm_api_options file's keys its LLM API fields;
- disaggregated: a request with disaggregated_params {request_type: context_only} runs the
  prefill and keeps the request's KV for the generation server, named in the answer's
  disaggregated_params (ctx_request_id, encoded_opaque_state: where and over which cache
  transceiver backend); a generation_only request must fetch that KV first (same backend),
  else it fails.
`disaggregated` reads its config file as TensorRT-LLM does, waits for every server's /health
for at most --server_start_timeout, then sends each request to a context server (context_only)
and then to a generation server with what the context server returned (generation_only).
Faults and timings: see hpcserve_simcore (HPCSERVE_SIM_*; fault ranks are node ranks).
"""

import base64
import collections
import itertools
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hpcserve_simcore import (TAG, BadRequest, EngineBase, HandlerBase,  # noqa: E402
                              KVTransferError, bind_socket, engine_facts, env_float, fatal, log,
                              release, self_check, serve_http)

# its health paths as the release answers them (hpcserve/engines/facts.py TRTLLM)
FACTS = engine_facts("TRTLLM")
TRTLLM_VERSION = release(FACTS["release"])

# trtllm-serve serve's options and those of them that take no value (tools/
# extract_trtllm_flags.py; a test keeps these tables equal to hpcserve's).
SERVE_OPTIONS = frozenset((
    "--backend", "--chat_template", "--cluster_size", "--config", "--context_parallel_size",
    "--cp_size", "--custom_module_dirs", "--custom_tokenizer", "--disable-xqa-jit",
    "--disagg_cluster_uri", "--enable-xqa-jit", "--enable_chunked_prefill", "--ep_size",
    "--extra_llm_api_options", "--fail_fast_on_attention_window_too_large",
    "--free_gpu_memory_fraction", "--gpus_per_node", "--grpc", "--host",
    "--kv_cache_free_gpu_memory_fraction", "--log_level", "--max_batch_size",
    "--max_beam_width", "--max_num_tokens", "--max_seq_len", "--media_io_kwargs",
    "--metadata_server_config_file", "--moe_cluster_parallel_size",
    "--moe_expert_parallel_size", "--num_postprocess_workers", "--otlp_traces_endpoint",
    "--pipeline_parallel_size", "--port", "--pp_size", "--reasoning_parser", "--revision",
    "--server_role", "--tensor_parallel_size", "--tokenizer", "--tool_parser", "--tp_size",
    "--trust_remote_code"))
SERVE_BARE = frozenset((
    "--disable-xqa-jit", "--enable-xqa-jit", "--enable_chunked_prefill",
    "--fail_fast_on_attention_window_too_large", "--grpc", "--trust_remote_code"))
DISAGG_OPTIONS = {"-c": "config_file", "--config_file": "config_file",
                  "-m": "metadata_server_config_file", "--metadata_server_config_file":
                  "metadata_server_config_file", "-t": "server_start_timeout",
                  "--server_start_timeout": "server_start_timeout", "-r": "request_timeout",
                  "--request_timeout": "request_timeout", "-l": "log_level",
                  "--log_level": "log_level", "--metrics-log-interval": "metrics_log_interval"}
# The LLM API options file's top-level keys (pydantic, extra fields forbidden).
LLM_API_FIELDS = frozenset((
    "allreduce_strategy", "attention_dp_config", "attn_backend", "backend",
    "batch_wait_max_tokens_ratio", "batch_wait_timeout_iters", "batch_wait_timeout_ms",
    "batched_logits_processor", "cache_transceiver_config", "checkpoint_format",
    "checkpoint_loader", "context_parallel_size", "cp_config", "cuda_graph_config",
    "custom_tokenizer", "decoding_config", "disable_flashinfer_sampling",
    "disable_overlap_scheduler", "dtype", "enable_attention_dp", "enable_autotuner",
    "enable_chunked_prefill", "enable_iter_perf_stats", "enable_iter_req_stats",
    "enable_layerwise_nvtx_marker", "enable_lm_head_tp_in_adp", "enable_lora",
    "enable_min_latency", "enable_sleep", "env_overrides",
    "fail_fast_on_attention_window_too_large", "force_dynamic_quantization",
    "garbage_collection_gen0_threshold", "gather_generation_logits", "gpus_per_node",
    "guided_decoding_backend", "iter_stats_max_iterations", "kv_cache_config",
    "kv_connector_config", "layer_wise_benchmarks_config", "load_format", "lora_config",
    "max_batch_size", "max_beam_width", "max_input_len", "max_num_tokens", "max_seq_len",
    "max_stats_len", "mm_encoder_only", "model", "model_kwargs", "moe_cluster_parallel_size",
    "moe_config", "moe_expert_parallel_size", "moe_tensor_parallel_size", "mpi_session",
    "num_postprocess_workers", "nvfp4_gemm_config", "orchestrator_type", "otlp_traces_endpoint",
    "peft_cache_config", "perf_metrics_max_requests", "pipeline_parallel_size",
    "postprocess_tokenizer_dir", "pp_partition", "print_iter_log", "ray_placement_config",
    "ray_worker_extension_cls", "reasoning_parser", "request_stats_max_iterations",
    "return_perf_metrics", "revision", "sampler_force_async_worker", "sampler_type",
    "scheduler_config", "skip_tokenizer_init", "sparse_attention_config", "speculative_config",
    "stream_interval", "tensor_parallel_size", "tokenizer", "tokenizer_mode",
    "tokenizer_revision", "torch_compile_config", "trust_remote_code"))
TRANSCEIVER_BACKENDS = ('DEFAULT', 'MOONCAKE', 'MPI', 'NIXL', 'UCX')


def click_error(usage, msg):
    sys.stderr.write(f"Usage: {usage}\nTry 'trtllm-serve --help' for help.\n\nError: {msg}\n")
    sys.stderr.flush()
    os._exit(2)


def parse_options(argv, table, usage, positional):
    """click's rules for the options we are given: `--x v`, `--x=v`, bare flags; an unknown
    option or a missing value is an error, and so is a missing or extra positional."""
    opts, pos = {}, []
    it = iter(argv)
    for a in it:
        if a.startswith("-") and a != "-":
            name, eq, val = a.partition("=")
            if name not in table:
                click_error(usage, f"No such option: {name}")
            takes = table[name]
            if takes and not eq:
                val = next(it, None)
                if val is None:
                    click_error(usage, f"Option '{name}' requires an argument.")
            elif not takes and eq:
                click_error(usage, f"Option '{name}' does not take a value.")
            opts[name] = val if takes else True
        else:
            pos.append(a)
    if len(pos) < len(positional):
        click_error(usage, f"Missing argument '{positional[len(pos)].upper()}'.")
    if len(pos) > len(positional):
        click_error(usage, f"Got unexpected extra argument ({pos[len(positional)]})")
    return opts, pos


def opt_int(opts, names, default):
    for n in names:
        if n in opts:
            try:
                return int(opts[n])
            except ValueError:
                click_error("trtllm-serve serve [OPTIONS] MODEL",
                            f"Invalid value for '{n}': '{opts[n]}' is not a valid integer.")
    return default


def load_yaml(path, what):
    try:
        import yaml
    except ImportError:
        fatal(1, "ModuleNotFoundError: No module named 'yaml' (TensorRT-LLM needs PyYAML)")
    try:
        with open(path) as f:
            return yaml.safe_load(f) or {}
    except OSError as e:
        fatal(1, f"{what}: cannot read {path}: {e}")
    except yaml.YAMLError as e:
        fatal(1, f"{what}: {path} is not valid YAML: {e}")


# ---------------------------------------------------------------------------------- serve

class World:
    """The MPI world of one server, as trtllm-llmapi-launch and the LLM API form it."""

    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError as e:
            fatal(1, f"ImportError: {e} (TensorRT-LLM needs mpi4py to form its MPI world)")
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        nodes = self.comm.allgather(self.node)
        order = list(dict.fromkeys(nodes))
        self.node_rank = order.index(self.node)
        self.nodes = len(order)


class Engine(EngineBase):
    def __init__(self, opts, model, world):
        super().__init__(world.node_rank)
        self.opts, self.model, self.world = opts, model, world
        self.tp = opt_int(opts, ("--tp_size", "--tensor_parallel_size"), 1)
        self.pp = opt_int(opts, ("--pp_size", "--pipeline_parallel_size"), 1)
        self.ep = opt_int(opts, ("--ep_size", "--moe_expert_parallel_size"), None)
        self.host = opts.get("--host", "localhost")
        self.port = opt_int(opts, ("--port",), 8000)
        self.api = {}
        self.kv = {}                    # ctx_request_id -> (monotonic time, prompt tokens)
        self.kv_lock = threading.Lock()
        self.ids = itertools.count(1)
        self.kv_timeout = env_float("HPCSERVE_SIM_KV_TIMEOUT", 5.0)
        self.iter_stats = None          # enable_iter_perf_stats: the iterations not yet read
        self.iter_cv = threading.Condition()
        self.iter_counter = 0

    def check_world(self):
        w = self.world
        need = self.tp * self.pp
        slurm_tasks = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS")
        if w.size != need:
            hint = ""
            if w.size == 1 and slurm_tasks and int(slurm_tasks) > 1:
                hint = (f"; Slurm started {slurm_tasks} tasks but each is an MPI world of its "
                        "own: the step was not started with srun --mpi=pmix")
            fatal(1, f"RuntimeError: rank {w.rank} on {w.node}: MPI world size {w.size} != "
                     f"tp_size {self.tp} x pp_size {self.pp} = {need}{hint}")
        if self.ep and self.tp % self.ep:
            fatal(1, f"ValueError: tp_size {self.tp} must be divisible by moe_ep_size {self.ep}")

    def read_options(self):
        path = self.opts.get("--extra_llm_api_options") or self.opts.get("--config")
        if not path:
            return
        api = load_yaml(path, "extra_llm_api_options")
        if not isinstance(api, dict):
            fatal(1, f"ValueError: {path}: the LLM API options must be a mapping")
        bad = sorted(k for k in api if k not in LLM_API_FIELDS)
        if bad:
            fatal(1, f"pydantic ValidationError: {path}: extra fields not permitted: "
                     f"{', '.join(bad)}")
        ct = api.get("cache_transceiver_config")
        if ct is not None and (not isinstance(ct, dict) or
                               ct.get("backend", "DEFAULT") not in TRANSCEIVER_BACKENDS):
            fatal(1, f"pydantic ValidationError: cache_transceiver_config.backend: "
                     f"{ct!r} is not one of {', '.join(TRANSCEIVER_BACKENDS)}")
        self.api = api
        if api.get("enable_iter_perf_stats"):
            # the PyTorch executor keeps the last max_stats_len iterations until /metrics
            self.iter_stats = collections.deque(maxlen=int(api.get("max_stats_len") or 1000))

    # -- iteration stats, as the PyTorch executor records them (one iteration per token here)
    def prefilled(self, prompt, rank=0):
        super().prefilled(prompt, rank)
        self.iteration(ctx_tokens=prompt)

    def generated(self, rank=0):
        super().generated(rank)
        self.iteration()

    def finished(self, decoding, rank=0, prompt=0, generated=0):
        super().finished(decoding, rank, prompt, generated)
        if decoding:
            self.iteration(completed=1, scheduled=0)

    def iteration(self, ctx_tokens=0, completed=0, scheduled=1):
        if self.iter_stats is None:
            return
        with self.iter_cv:
            self.iter_stats.append(self.iteration_stats(ctx_tokens, completed, scheduled))
            self.iter_counter += 1
            self.iter_cv.notify_all()

    def iteration_stats(self, ctx_tokens, completed, scheduled):
        """One IterationStats as JsonSerialization writes it (camelCase, every field)."""
        ctx = 1 if ctx_tokens else 0
        ms = 1000 * (self.prefill_s * ctx_tokens if ctx else self.decode_s)
        max_batch = opt_int(self.opts, ("--max_batch_size",), 2048)
        return {
            "timestamp": "", "iter": self.iter_counter, "iterLatencyMS": ms,
            "newActiveRequestsQueueLatencyMS": 0.0, "numNewActiveRequests": ctx,
            "numActiveRequests": self.running, "numQueuedRequests": self.waiting,
            "numCompletedRequests": completed, "maxNumActiveRequests": max_batch,
            "maxBatchSizeStatic": max_batch, "maxBatchSizeTunerRecommended": 0,
            "maxBatchSizeRuntime": max_batch, "maxNumTokensStatic": 8192,
            "maxNumTokensTunerRecommended": 0, "maxNumTokensRuntime": 8192,
            "gpuMemUsage": 0, "cpuMemUsage": 0, "pinnedMemUsage": 0,
            "kvCacheStats": {"maxNumBlocks": 65536, "freeNumBlocks": 65536 - self.running,
                             "usedNumBlocks": self.running, "tokensPerBlock": 32,
                             "allocTotalBlocks": self.running, "allocNewBlocks": ctx,
                             "reusedBlocks": 0, "missedBlocks": ctx, "cacheHitRate": 0.0},
            "staticBatchingStats": None,
            "inflightBatchingStats": {
                "numScheduledRequests": scheduled, "numContextRequests": ctx * scheduled,
                "numGenRequests": (1 - ctx) * scheduled, "numPausedRequests": 0,
                "numCtxTokens": ctx_tokens, "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 0.0},
            "specDecodingStats": None}

    def take_iteration_stats(self, timeout=2.0):
        """GET /metrics: get_stats_async(2) drains what the executor kept, waiting up to 2 s
        for an iteration when there is none (so an idle or hung engine answers [] late)."""
        with self.iter_cv:
            self.iter_cv.wait_for(lambda: self.iter_stats, timeout)
            out = list(self.iter_stats or ())
            if self.iter_stats:
                self.iter_stats.clear()
        return out

    @property
    def backend(self):
        return (self.api.get("cache_transceiver_config") or {}).get("backend")

    def on_sigterm(self, signum, frame):
        if self.frozen.is_set():
            log("SIGTERM received, but the executor is hung")
            return
        if not self.terminating:
            self.terminating = True
            self.exit(0, "Shutting down the server (SIGTERM)")

    def worker(self):
        """Ranks above 0: the MPI workers of rank 0's executor; they serve nothing."""
        self.world.comm.barrier()    # "weights loaded" on every rank
        log(f"MPI worker rank {self.world.rank} ready")
        while True:
            time.sleep(3600)

    def leader(self):
        sock = bind_socket(self.host, self.port, "trtllm-serve (--host/--port)")
        self.loading()
        self.world.comm.barrier()
        serve_http(self, sock, TRTLLMHandler)
        log(f"Started server on http://{self.host}:{self.port} (world of {self.world.size} "
            f"ranks on {self.world.nodes} node(s))")
        self_check(self, self.host, self.port, "/v1/models")
        log("Application startup complete.")
        while True:
            time.sleep(3600)

    # -- disaggregated serving: the KV of context-only requests, kept for the generation side
    def keep_kv(self, prompt):
        rid = next(self.ids)
        with self.kv_lock:
            now = time.monotonic()
            for k in [k for k, (t, _) in self.kv.items() if now - t > 60]:
                del self.kv[k]
            self.kv[rid] = (now, prompt)
        state = {"host": self.host, "port": self.port, "backend": self.backend}
        return rid, base64.b64encode(json.dumps(state).encode()).decode()

    def fetch_kv(self, params):
        try:
            state = json.loads(base64.b64decode(params.get("encoded_opaque_state") or ""))
            host, port, backend = state["host"], int(state["port"]), state["backend"]
        except (ValueError, KeyError, TypeError):
            raise KVTransferError("generation_only request without a valid encoded_opaque_state")
        if backend != self.backend:
            raise KVTransferError(f"cache transceiver backend mismatch: context server uses "
                                  f"{backend}, this generation server {self.backend}")
        url = f"http://{host}:{port}/hpcserve-sim/kv/{params.get('ctx_request_id')}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(url, timeout=self.kv_timeout) as r:
                got = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise KVTransferError(f"KV cache of request {params.get('ctx_request_id')} not "
                                  f"found at the context server {host}:{port} (HTTP {e.code})")
        except OSError as e:
            raise KVTransferError(f"cannot reach the context server {host}:{port} for the KV "
                                  f"cache: {e}")
        log(f"KV cache of context request {params.get('ctx_request_id')} received from "
            f"{host}:{port} over {backend} ({got.get('prompt_tokens')} tokens)")


class TRTLLMHandler(HandlerBase):
    do_POST = HandlerBase.openai_post
    quiet_paths = ("/health", "/metrics")

    def do_GET(self):
        # No freeze: the server's event loop answers while the executor is hung; /health only
        # asks whether the executor has failed, /metrics reads the (then empty) stats queue.
        eng, path = self.engine, self.path.split("?")[0]
        if path in FACTS["health"]:
            if FACTS["health"][path]["proves"] == "generation":
                self.freeze_if_hung()  # a 1-token chat through the executor
                return self.send_json(200 if self.healthy() else 500, None)
            return self.health()
        if path == "/metrics":
            return self.send_json(200, eng.take_iteration_stats())
        if path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [{
                "id": eng.model, "object": "model", "created": int(time.time()),
                "owned_by": "tensorrt_llm"}]})
        if path.startswith("/hpcserve-sim/kv/"):
            self.freeze_if_hung()  # the KV leaves through the (hung) executor
            try:
                rid = int(path.rsplit("/", 1)[1])
            except ValueError:
                return self.send_json(404, None)
            with eng.kv_lock:
                held = eng.kv.pop(rid, None)
            return self.send_json(404, None) if held is None else \
                self.send_json(200, {"prompt_tokens": held[1]})
        return self.send_json(404, {"detail": "Not Found"})

    def error(self, kind, code, msg):
        self.send_json(code, {"object": "error", "message": msg, "type": "BadRequestError"
                              if code == 400 else "InternalServerError", "code": code})

    def generate(self, kind, body):
        eng = self.engine
        prompt, max_new, _ = self.openai_request(kind, body)
        params = body.get("disaggregated_params") or {}
        rtype = params.get("request_type")
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        if rtype == "generation_only":
            eng.fetch_kv(params)
        else:
            time.sleep(prompt * eng.prefill_s)
        if rtype == "context_only":
            if eng.backend is None:
                raise BadRequest("context_only request, but this server has no "
                                 "cache_transceiver_config")
            ctx_id, state = eng.keep_kv(prompt)
            self.start_decode(prompt)
            final = self.final(kind, rid, body.get("model") or eng.model, prompt, 1)
            final["choices"][0]["disaggregated_params"] = {
                "request_type": "context_only", "first_gen_tokens": [1],
                "ctx_request_id": ctx_id, "encoded_opaque_state": state, "draft_tokens": None,
                "disagg_request_id": params.get("disagg_request_id")}
            return self.send_json(200, final)
        self.respond(kind, body, rid, body.get("model") or eng.model, prompt, max_new)


def serve_main(argv):
    usage = "trtllm-serve serve [OPTIONS] MODEL"
    table = {o: o not in SERVE_BARE for o in SERVE_OPTIONS}
    opts, pos = parse_options(argv, table, usage, ["model"])
    world = World()
    eng = Engine(opts, pos[0], world)
    TAG[0] = f"trtllm R{world.rank} NR{world.node_rank}"
    log(f"hpcserve simulated TensorRT-LLM {TRTLLM_VERSION} (no GPU, no model) pid={os.getpid()}"
        f" rank {world.rank} of {world.size} on {world.node}; options: {json.dumps(opts)}")
    signal.signal(signal.SIGTERM, eng.on_sigterm)
    eng.check_world()
    eng.start_fault()
    if world.rank != 0:
        eng.worker()
    eng.read_options()
    eng.leader()


# ---------------------------------------------------------------------------- disaggregated

class Front(EngineBase):
    def __init__(self, cfg, timeout):
        super().__init__(0)
        self.ctx = server_urls(cfg, "context_servers")
        self.gen = server_urls(cfg, "generation_servers")
        self.host, self.port = cfg.get("hostname", "localhost"), int(cfg.get("port", 8000))
        self.start_timeout = timeout
        self.turn = itertools.count()
        self.ids = itertools.count(1)

    def wait_servers(self):
        """Every context and generation server answers /health, or the start fails."""
        deadline = time.monotonic() + self.start_timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        waiting = list(self.ctx + self.gen)
        while waiting:
            for url in list(waiting):
                try:
                    with opener.open(f"http://{url}/health", timeout=2) as r:
                        if r.status == 200:
                            waiting.remove(url)
                            log(f"server {url} is ready")
                except OSError:
                    pass
            if waiting and time.monotonic() > deadline:
                fatal(1, "TimeoutError: Timeout waiting for context and generation servers "
                         f"to be ready (--server_start_timeout {self.start_timeout} s; not "
                         f"ready: {', '.join(waiting)})")
            time.sleep(0.2 if waiting else 0)

    def pick(self, urls):
        return urls[next(self.turn) % len(urls)]


def check_disagg_config(path, cfg):
    """What tensorrt_llm/llmapi/disagg_utils.py refuses: a non-mapping, a server section whose
    num_instances is not its number of urls. Other top-level keys are server arguments copied
    into both sections; a missing section or urls leaves servers at "None:None", which only the
    start timeout reports (Front.wait_servers)."""
    if not isinstance(cfg, dict):
        fatal(1, f"ValueError: {path}: the disaggregated config must be a mapping")
    for key in ("context_servers", "generation_servers"):
        s = cfg.get(key) or {}
        if not isinstance(s, dict):
            fatal(1, f"ValueError: {path}: {key} must be a mapping")
        urls = s.get("urls") or []
        if "num_instances" in s and s["num_instances"] != len(urls):
            fatal(1, f"ValueError: Number of {key.split('_')[0]} URLs ({len(urls)}) must be "
                     f"equal to the number of instances ({s['num_instances']})")


def server_urls(cfg, key):
    urls = ((cfg.get(key) or {}).get("urls")) or ["None:None"]
    return [str(u) for u in urls]


class FrontHandler(HandlerBase):
    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/health":
            return self.send_json(200 if self.healthy() else 500, None)
        return self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        path = self.path.split("?")[0]
        if path not in self.OPENAI_POSTS:
            return self.send_json(404, {"detail": "Not Found"})
        try:
            body = self.read_body()
        except BadRequest as e:
            return self.send_json(400, {"object": "error", "message": str(e), "code": 400})
        self.count_inflight(lambda: self.disaggregate(path, body))

    def disaggregate(self, path, body):
        eng = self.engine
        disagg_id = next(eng.ids)
        ctx_body = {**body, "stream": False, "stream_options": None,
                    "disaggregated_params": {"request_type": "context_only",
                                             "disagg_request_id": disagg_id}}
        code, raw = call(eng.pick(eng.ctx), path, ctx_body)
        if code != 200:
            return self.send_text(code, raw.decode(errors="replace"), "application/json")
        params = json.loads(raw)["choices"][0].get("disaggregated_params") or {}
        if params.get("ctx_request_id") is None or params.get("disagg_request_id") is None:
            return self.send_json(500, {"object": "error", "code": 500, "message":
                                        "context server response has no ctx_request_id"})
        gen_body = {**body, "disaggregated_params": {**params,
                                                     "request_type": "generation_only"}}
        self.relay("POST", eng.pick(eng.gen), path, gen_body)

    def relay(self, method, url, path, body):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            r = opener.open(req, timeout=600)
        except urllib.error.HTTPError as e:
            return self.send_text(e.code, e.read().decode(errors="replace"), "application/json")
        except OSError as e:
            return self.send_json(502, {"object": "error", "message": f"{url}: {e}", "code": 502})
        with r:
            ctype = r.headers.get("Content-Type", "application/json")
            if "event-stream" not in ctype:
                return self.send_text(r.status, r.read().decode(), ctype)
            self.start_stream()
            for line in r:  # SSE lines as they come
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")


def call(url, path, body):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(f"http://{url}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with opener.open(req, timeout=600) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return 502, json.dumps({"object": "error", "message": f"{url}: {e}"}).encode()


def disagg_main(argv):
    usage = "trtllm-serve disaggregated [OPTIONS]"
    table = {k: True for k in DISAGG_OPTIONS}
    opts, _ = parse_options(argv, table, usage, [])
    named = {DISAGG_OPTIONS[k]: v for k, v in opts.items()}
    path = named.get("config_file")
    if not path:
        click_error(usage, "Missing option '-c' / '--config_file'.")
    TAG[0] = "disaggregated"
    cfg = load_yaml(path, "disaggregated config")
    check_disagg_config(path, cfg)
    try:
        timeout = int(named.get("server_start_timeout", 180))
    except ValueError:
        click_error(usage, "Invalid value for '-t' / '--server_start_timeout'.")
    front = Front(cfg, timeout)
    log(f"hpcserve simulated trtllm-serve disaggregated {TRTLLM_VERSION} pid={os.getpid()}: "
        f"context servers {front.ctx}, generation servers {front.gen}")
    signal.signal(signal.SIGTERM, lambda *_: front.exit(0, "Shutting down (SIGTERM)"))
    sock = bind_socket(front.host, front.port, "disaggregated server (hostname/port)")
    front.wait_servers()
    front.status = "ready"  # it listens only once every server is ready
    serve_http(front, sock, FrontHandler)
    self_check(front, front.host, front.port, "/health")
    log(f"Disaggregated server listening on http://{front.host}:{front.port}")
    while True:
        time.sleep(3600)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("serve", "disaggregated"):
        click_error("trtllm-serve [OPTIONS] COMMAND [ARGS]...",
                    f"No such command '{argv[0] if argv else ''}'.")
    (serve_main if argv[0] == "serve" else disagg_main)(argv[1:])


if __name__ == "__main__":
    main()
