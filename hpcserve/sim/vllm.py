#!/usr/bin/env python3
"""Simulated vLLM: a stdlib-only stand-in for `vllm serve MODEL ...` (no GPU, no model).

It takes the exact argv of the real server and reproduces what a launcher can get wrong:
- TP/PP across nodes (`--nnodes --node-rank --master-addr --master-port`): node rank 0 hosts the
  torch.distributed store at master-addr:master-port and waits for every other node rank, which
  must be `--headless`; a wrong address, rank or count fails like torch and vLLM do;
- DP across nodes: the head binds --data-parallel-address:--data-parallel-rpc-port (literally:
  an address not of this node fails) and waits for every remote DP rank; each headless node says
  hello with its ranks (`--data-parallel-start-rank` .. + `--data-parallel-size-local`); a rank
  out of range, one the head runs itself, or a node without --headless fails with vLLM's words;
  the head never gives up on a rank that does not come (vLLM has no timeout there either);
- headless ranks serve no HTTP; the head (or single node) serves /health, /v1/models, /version,
  /metrics (one `engine` label per DP rank, which vllm-router counts), /load, /ping,
  /v1/completions and /v1/chat/completions (SSE, usage);
- PD with NixlConnector: a kv_producer answers a request that carries kv_transfer_params
  {do_remote_decode: true} with kv_transfer_params naming its side channel
  (VLLM_NIXL_SIDE_CHANNEL_HOST, default "localhost", : VLLM_NIXL_SIDE_CHANNEL_PORT + DP rank);
  a kv_consumer given those must reach that side channel, find the same engine id there and
  read the request's blocks before it emits a token, else the request fails (HTTP 500,
  kv_load_failure_policy "fail"), as vLLM's does. With MooncakeConnector the prefill runs the
  bootstrap server (VLLM_MOONCAKE_BOOTSTRAP_PORT, GET /query) and the decode waits there for
  the transfer the router announced.
- SIGTERM: the API server and headless nodes shut down (in-flight requests aborted).
Faults and timings: see hpcserve_simcore (HPCSERVE_SIM_*). HPCSERVE_SIM_KV_TIMEOUT is how long a
decode waits for the prefill's KV (default 5, vLLM's NIXL handshake timeout).
"""

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

# The shared part lies beside this file, in the package and in a job directory alike (and
# `python -I` does not put the script's own folder on sys.path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hpcserve_simcore import (TAG, EngineBase, HandlerBase,  # noqa: E402
                              KVTransferError, Rendezvous, bind_socket, engine_facts, env_float,
                              fatal, log, prometheus, read_msg, release, self_check, send_msg,
                              serve_http)

# What the real releases move and answer (hpcserve/engines/facts.py VLLM, proved against 0.32.0
# and 0.33.0 by tests/facts/): the stand-in moves a counter only as they do.
FACTS = engine_facts("VLLM")

VLLM_VERSION = release("0.33.0")


def parse_args(argv):
    # allow_abbrev=False: a prefix must not silently bind to one of the few flags we read.
    p = argparse.ArgumentParser(prog="vllm (hpcserve sim)", allow_abbrev=False)
    p.add_argument("subcommand", choices=["serve"])
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--data-parallel-size-local", "-dpl", type=int, default=None)
    p.add_argument("--data-parallel-address", "-dpa", default=None)
    p.add_argument("--data-parallel-rpc-port", "-dpp", type=int, default=29550)
    p.add_argument("--data-parallel-start-rank", "-dpr", type=int, default=None)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--distributed-executor-backend", default=None)
    p.add_argument("--enable-expert-parallel", "-ep", action="store_true")
    p.add_argument("--kv-transfer-config", default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    # vllm/entrypoints/launchers/cli_args.py: api_key: list[str] (one or more)
    p.add_argument("--api-key", nargs="+", default=None)
    args, unknown = p.parse_known_args(argv)
    args.unknown = unknown
    if args.model is not None:
        log("With `vllm serve`, you should provide the model as a positional argument or in a "
            "config file instead of via the `--model` option.")
        args.model_tag = args.model_tag or args.model
    if args.model_tag is None:
        p.error("`model` should be provided as the first positional argument when using "
                "`vllm serve`. i.e. `vllm serve <model> --<arg> <value>`.")
    args.model = args.model_tag
    args.served = (args.served_model_name or [args.model])[0]
    args.kv = _kv_config(p, args.kv_transfer_config)
    _validate(p, args)
    return args


def _kv_config(p, raw):
    if raw is None:
        return None
    try:
        kv = json.loads(raw)
    except ValueError as e:
        p.error(f"argument --kv-transfer-config: invalid loads value: {raw!r} ({e})")
    if kv.get("kv_connector") not in ("NixlConnector", "MooncakeConnector"):
        p.error(f"the simulator models NixlConnector and MooncakeConnector, not "
                f"{kv.get('kv_connector')!r}")
    if kv.get("kv_role") not in ("kv_producer", "kv_consumer", "kv_both"):
        p.error("kv_role must be one of kv_producer, kv_consumer, kv_both when kv_connector is "
                "set")
    return kv


def _validate(p, a):
    """What vLLM's EngineArgs/ParallelConfig refuse before any GPU work (their words)."""
    world = a.tensor_parallel_size * a.pipeline_parallel_size
    if a.nnodes > 1:
        if a.distributed_executor_backend not in (None, "mp", "uni", "external_launcher"):
            fatal(1, "ValueError: nnodes > 1 can only be set when distributed executor backend "
                     "is mp, uni or external_launcher.")
        if (world * a.data_parallel_size) % a.nnodes:
            fatal(1, f"ValueError: Invalid data-parallel launch options: `--nnodes {a.nnodes}` "
                     f"must evenly divide the total world size ({world * a.data_parallel_size})")
        if not 0 <= a.node_rank < a.nnodes:
            fatal(1, "ValueError: Invalid data-parallel launch options: `--node-rank` must be "
                     f"between 0 and {a.nnodes - 1}; got `--node-rank {a.node_rank}`. Set it "
                     "to this node's zero-based index.")
    dp = a.data_parallel_size
    if a.data_parallel_size_local is None:
        a.data_parallel_size_local = dp  # vLLM's default: every DP engine on this node
    if a.data_parallel_size_local > dp:
        fatal(1, f"ValueError: data_parallel_size_local ({a.data_parallel_size_local}) must be "
                 f"<= data_parallel_size ({dp})")
    if a.headless and a.data_parallel_size_local <= 0:
        fatal(1, "ValueError: data_parallel_size_local must be > 0 in headless mode")
    start = a.data_parallel_start_rank
    if start is not None and not 0 <= start < dp:
        fatal(1, f"ValidationError: data_parallel_rank ({start}) must be in the range [0, {dp})")
    if start is not None and not a.headless and a.data_parallel_size_local < dp:
        # 0.33: a start rank on the API-server node means hybrid load balancing
        a.hybrid_lb = True
    else:
        a.hybrid_lb = False


class Engine(EngineBase):
    def __init__(self, args):
        # the node's index within the instance, which faults and peers are named by
        super().__init__(args.node_rank if args.nnodes > 1 else
                         (args.data_parallel_start_rank or 0) // max(1, args.data_parallel_size_local))
        self.args = args
        # vllm/entrypoints/serve/middleware/register.py: --api-key, else VLLM_API_KEY
        self.api_keys = [k for k in (args.api_key or [os.environ.get("VLLM_API_KEY")]) if k]
        self.engine_id = uuid.uuid4().hex
        self.kv = args.kv or {}
        self.role = self.kv.get("kv_role")
        self.blocks = {}                # NIXL: request id -> (monotonic time, block ids)
        self.transfers = {}             # Mooncake: transfer id -> prompt tokens
        self.kv_cv = threading.Condition()
        self.kv_timeout = env_float("HPCSERVE_SIM_KV_TIMEOUT", 5.0)
        self.side_host = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost")
        self.side_port = int(os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
        # the API server balances requests over the DP engines and records each one's stats
        self.set_facts(FACTS, dp=args.data_parallel_size)

    @property
    def multi_node_tp(self):
        return self.args.nnodes > 1 and self.args.data_parallel_size == 1

    @property
    def multi_node_dp(self):
        a = self.args
        return a.data_parallel_size > 1 and a.data_parallel_size_local < a.data_parallel_size

    def on_sigterm(self, signum, frame):
        if self.frozen.is_set():
            log("[shutdown] SIGTERM received, but the engine core is hung")
            return
        if self.terminating:
            return
        self.terminating = True
        log("[shutdown] API server: shutdown triggered" if not self.args.headless else
            "[shutdown] headless: SIGTERM received")
        self.exit(0, "Shutting down.")  # --shutdown-timeout 0: in-flight requests are aborted

    # ---- TP/PP across nodes: torch.distributed at --master-addr:--master-port ------------------
    def torch_rendezvous(self):
        a = self.args
        return Rendezvous(self, f"{a.master_addr}:{a.master_port}", "--master-addr/--master-port",
                          "torch.distributed TCPStore", self.init_timeout,
                          peer_name=lambda r: f"node rank {r}")

    def lead_tp(self):
        a = self.args

        def check(h, missing):
            r = h.get("rank")
            if h.get("nnodes") != a.nnodes or h.get("world") != self.world():
                return (f"node rank {r} has --nnodes {h.get('nnodes')} and world size "
                        f"{h.get('world')}, node rank 0 {a.nnodes} and {self.world()}")
            if r in self.peers or r not in missing:
                return f"two processes claim node rank {r}"
            return [r]

        self.torch_rendezvous().lead(
            range(1, a.nnodes), check, lambda e: f"torch.distributed.DistStoreError: {e}",
            lambda missing: f"Timed out after {self.init_timeout:g} seconds waiting for clients. "
                            f"{a.nnodes - 1 - len(missing)}/{a.nnodes - 1} clients joined.")

    def join_tp(self):
        a = self.args
        log(f"Launching vLLM (v{VLLM_VERSION}) headless multiproc executor, with head node "
            f"address {a.master_addr}:{a.master_port} for torch.distributed process group.")
        rz = self.torch_rendezvous()
        f = rz.join({"rank": a.node_rank, "nnodes": a.nnodes, "world": self.world()},
                    lambda last: "torch.distributed.DistNetworkError: The client socket has "
                                 f"timed out after {int(self.init_timeout * 1000)}ms while trying "
                                 f"to connect to ({a.master_addr}, {a.master_port}). ({last})",
                    lambda e: f"torch.distributed.DistNetworkError: {e}")
        if not a.headless:
            # A follower with an API server of its own: its engine core asks its executor for
            # collective RPCs that only a node-rank-0 executor may send.
            self.exit(1, "AssertionError: collective_rpc should not be called on follower node "
                         "(node ranks > 0 need --headless)")
        rz.follow(f)

    def world(self):
        return self.args.tensor_parallel_size * self.args.pipeline_parallel_size

    # ---- DP across nodes: the head's handshake socket -----------------------------------------
    def dp_rendezvous(self, timeout):
        a = self.args
        addr = f"{a.data_parallel_address or a.master_addr}:{a.data_parallel_rpc_port}"
        return Rendezvous(self, addr, "--data-parallel-address/--data-parallel-rpc-port",
                          "DP handshake", timeout, peer_name=lambda r: f"data parallel rank {r}")

    def local_ranks(self):
        a = self.args
        start = a.data_parallel_start_rank or 0
        return list(range(start, start + a.data_parallel_size_local))

    def lead_dp(self):
        a = self.args
        local = set(self.local_ranks())
        remote = set(range(a.data_parallel_size)) - local

        def check(h, missing):
            ranks = h.get("ranks") or []
            for r in ranks:
                if not 0 <= r < a.data_parallel_size or (r not in local and r not in remote):
                    return f"Message from engine with unexpected data parallel rank: {r}"
                if r in local:
                    return f"HELLO message from remote engine {r}, expected it to be local"
                if a.hybrid_lb and h.get("headless"):
                    return (f"Remote engine {r} must not use --headless in external or hybrid "
                            "dp lb mode")
                if not h.get("headless"):
                    return (f"Remote engine {r} must use --headless unless in external or "
                            "hybrid dp lb mode")
                if r not in missing:
                    return f"data parallel rank {r} connected twice"
            if h.get("config") != self.dp_config():
                return (f"Configuration mismatch detected for engine {ranks[0]}. All DP workers "
                        "must have identical configurations for parameters that affect "
                        "collective communication")
            return ranks or "a headless node sent no data parallel ranks"

        # vLLM's head has no timeout for engines that never connect; neither has this one.
        self.dp_rendezvous(float("inf")).lead(sorted(remote), check, lambda e: f"RuntimeError: {e}",
                                              lambda missing: f"still waiting for {sorted(missing)}")

    def join_dp(self):
        a = self.args
        rz = self.dp_rendezvous(self.init_timeout)
        log(f"Launching {a.data_parallel_size_local} data parallel engine(s) in headless mode, "
            f"with head node address tcp://{rz.addr}.")
        f = rz.join({"ranks": self.local_ranks(), "headless": a.headless,
                     "config": self.dp_config()},
                    lambda last: "RuntimeError: Did not receive response from front-end process "
                                 f"within {self.init_timeout:g} s ({last})",
                    lambda e: f"RuntimeError: {e}")
        rz.follow(f)

    def dp_config(self):
        a = self.args
        return {"tp": a.tensor_parallel_size, "pp": a.pipeline_parallel_size,
                "dp": a.data_parallel_size, "ep": a.enable_expert_parallel, "model": a.model}

    # ---- PD: NIXL side channel and Mooncake bootstrap -----------------------------------------
    def serve_side_channel(self):
        """Each engine's NIXL handshake listener: this engine's id, and the blocks it holds."""
        port = self.side_port + (self.args.data_parallel_start_rank or 0)
        sock = bind_socket(self.side_host, port, "NIXL side channel "
                                                 "(VLLM_NIXL_SIDE_CHANNEL_HOST/PORT)")
        sock.listen(64)
        log(f"NIXL side channel listening on {self.side_host}:{port}")

        def serve(conn):
            with conn:
                msg = read_msg(conn)
                if msg is None:
                    return
                if msg.get("op") == "read":
                    with self.kv_cv:
                        entry = self.blocks.pop(msg.get("request_id"), None)
                    send_msg(conn, {"engine_id": self.engine_id, "blocks": entry and entry[1]})
                else:
                    send_msg(conn, {"engine_id": self.engine_id})

        def accept():
            while True:
                conn, _ = sock.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return port

    def nixl_pull(self, params):
        """Decode: read the request's blocks from the prefill named in kv_transfer_params."""
        host, port = params.get("remote_host"), params.get("remote_port")
        ctx = {"remote_host": host, "remote_port": port,
               "remote_engine_id": params.get("remote_engine_id")}
        try:
            with socket.create_connection((host, int(port)), timeout=self.kv_timeout) as s:
                send_msg(s, {"op": "read", "request_id": params.get("remote_request_id")})
                reply = read_msg(s, self.kv_timeout)
        except (OSError, TypeError, ValueError) as e:
            log(f"NIXL transfer failure: handshake_failed | Context: {ctx} ({e})")
            raise KVTransferError("handshake_failed") from None
        if reply is None:
            log(f"NIXL transfer failure: handshake_failed | Context: {ctx} (no answer)")
            raise KVTransferError("handshake_failed")
        if reply.get("engine_id") != params.get("remote_engine_id"):
            log(f"Remote NIXL agent engine ID mismatch. Expected {params.get('remote_engine_id')},"
                f"received {reply.get('engine_id')}.")
            raise KVTransferError("engine id mismatch")
        if not reply.get("blocks"):
            log(f"NIXL transfer failure: no blocks for {params.get('remote_request_id')} at "
                f"{host}:{port}")
            raise KVTransferError("blocks not found")
        log(f"KV of {params.get('remote_request_id')} read from {host}:{port} "
            f"({len(reply['blocks'][0])} block(s))")

    def mooncake_pull(self, params):
        """Decode: the prefill's bootstrap server must know the engine, then the transfer."""
        base = params.get("remote_bootstrap_addr") or ""
        tid = params.get("transfer_id")
        deadline = time.monotonic() + self.kv_timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{base}/query", timeout=self.kv_timeout) as r:
                engines = json.loads(r.read())
        except (OSError, ValueError) as e:
            log(f"Failed to connect to bootstrap server {base} ({e})")
            raise KVTransferError("bootstrap unreachable") from None
        ids = {v.get("engine_id") for v in engines.values()}
        if params.get("remote_engine_id") not in ids:
            log(f"remote engine_id {params.get('remote_engine_id')} not found from bootstrap "
                f"server {base}")
            raise KVTransferError("unknown engine")
        while time.monotonic() < deadline:
            try:
                with opener.open(f"{base}/transfer/{tid}", timeout=self.kv_timeout) as r:
                    log(f"KV of transfer {tid} received from {base} ({r.read().decode()})")
                    return
            except urllib.error.HTTPError:
                time.sleep(0.05)
            except OSError as e:
                log(f"Failed to connect to bootstrap server {base} ({e})")
                raise KVTransferError("bootstrap unreachable") from None
        raise KVTransferError(f"transfer {tid} never arrived from {base}")

    def metrics(self):
        """vLLM's /metrics: one `engine` label per DP rank (vllm-router counts them), each
        engine's gauges its own; the facts' counters (iteration histogram, token counters) move
        every step, summed over the engines under engine 0."""
        label = FACTS["label"]

        def per_engine(values):
            return [({label: str(r), "model_name": self.args.served}, values[r])
                    for r in range(self.args.data_parallel_size)]
        with self.lock:
            usage = [min(1.0, v / 256) for v in self.running_by]
            return prometheus([
                ("vllm:num_requests_running", "gauge",
                 "Number of requests in model execution batches.", per_engine(self.running_by)),
                ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be "
                 "processed.", per_engine(self.waiting_by)),
                ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent "
                 "usage.", per_engine(usage)),
            ] + self.counter_metrics({label: "0", "model_name": self.args.served}))


class VLLMHandler(HandlerBase):
    do_POST = HandlerBase.openai_post
    quiet_paths = ("/health", "/metrics")

    def guarded(self, path):
        # vllm/entrypoints/serve/middleware/authenticate.py: GUARDED_PREFIX
        return path.startswith(("/v1", "/v2", "/inference", "/cohere"))

    def do_GET(self):
        # No freeze here: the API server process answers even while the engine core is hung
        # (/health only asks whether the engine core has died, not whether it makes progress).
        eng, path = self.engine, self.path.split("?")[0]
        a = eng.args
        if path == "/health":
            return self.health()
        if path == "/v1/models":
            return self.send_json(200, {"object": "list", "data": [{
                "id": a.served, "object": "model", "created": int(time.time()),
                "owned_by": "vllm", "root": a.model, "parent": None,
                "max_model_len": a.max_model_len or 131072}]})
        if path == "/version":
            return self.send_json(200, {"version": VLLM_VERSION})
        if path == "/load":
            return self.send_json(200, {"server_load": eng.inflight})
        if path == "/ping":
            return self.send_json(200, None)
        if path == "/metrics":
            return self.send_text(200, eng.metrics(), "text/plain; version=0.0.4")
        return self.send_json(404, {"detail": "Not Found"})

    def kv_failure(self, e):
        # kv_load_failure_policy "fail": the request ends with finish_reason "error"
        return "Internal server error"

    def error(self, kind, code, msg):
        typ = {400: "BadRequestError", 503: "ServiceUnavailableError"}.get(
            code, "InternalServerError")
        self.send_json(code, {"error": {"message": msg, "type": typ, "param": None,
                                        "code": code}})

    def generate(self, kind, body):
        eng = self.engine
        prompt, max_new, _ = self.openai_request(kind, body)
        params = body.get("kv_transfer_params") or {}
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        extra = None
        conn = eng.kv.get("kv_connector")
        if params.get("do_remote_prefill") and eng.role in ("kv_consumer", "kv_both"):
            if conn == "NixlConnector":
                eng.nixl_pull(params)
            else:
                eng.mooncake_pull(params)
        else:
            time.sleep(prompt * eng.prefill_s)  # a local prefill
        if params.get("do_remote_decode") and eng.role in ("kv_producer", "kv_both"):
            max_new = min(max_new, 1)
            if conn == "NixlConnector":
                extra = {"kv_transfer_params": self.hold_blocks(rid, prompt)}
            else:
                with eng.kv_cv:
                    eng.transfers[params.get("transfer_id")] = prompt
                extra = {"kv_transfer_params": None}
        self.respond(kind, body, rid, body.get("model") or eng.args.served, prompt, max_new,
                     extra)

    def hold_blocks(self, rid, prompt):
        """Prefill: keep the request's blocks for the decode to read; tell it where."""
        eng = self.engine
        req = f"{rid}-0-{uuid.uuid4().hex[:8]}"
        blocks = [list(range(1, 1 + max(1, prompt // 16 + 1)))]
        with eng.kv_cv:
            now = time.monotonic()
            for k in [k for k, (t, _) in eng.blocks.items() if now - t > 30]:
                del eng.blocks[k]  # kv_lease_duration: the decode never came
            eng.blocks[req] = (now, blocks)
        a = eng.args
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": blocks, "remote_engine_id": eng.engine_id,
                "remote_request_id": req, "remote_host": eng.side_host,
                "remote_port": eng.side_port + (a.data_parallel_start_rank or 0),
                "tp_size": a.tensor_parallel_size, "dcp_size": 1,
                "pp_size": a.pipeline_parallel_size, "remote_num_tokens": prompt,
                "remote_blocks_expiry_time": None, "transfer_mode": "pull"}


class MooncakeBootstrap(HandlerBase):
    """The prefill's Mooncake bootstrap server: /query names its engines; /transfer/<id> (the
    simulator's stand-in for the RDMA push) answers once the prefill has the transfer."""

    def do_GET(self):
        eng = self.engine
        path = self.path.split("?")[0]
        if path == "/query":
            return self.send_json(200, {"0": {"engine_id": eng.engine_id, "worker_addr": {}}})
        if path.startswith("/transfer/"):
            with eng.kv_cv:
                n = eng.transfers.pop(path[len("/transfer/"):], None)
            return self.send_json(200, {"prompt_tokens": n}) if n is not None else \
                self.send_json(404, {"detail": "pending"})
        return self.send_json(404, {"detail": "Not Found"})


def redacted(args):
    """The args as vLLM logs them: api_key (and hf_token) as "***"
    (vllm/entrypoints/serve/utils/api_utils.py: redact_sensitive_args)."""
    return {k: ("***" if k == "api_key" and v else v) for k, v in vars(args).items()
            if k != "unknown"}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    role = {"kv_producer": "prefill", "kv_consumer": "decode"}.get((args.kv or {}).get("kv_role"),
                                                                    "vllm")
    eng = Engine(args)
    TAG[0] = f"{role} NR{eng.rank}"
    log(f"hpcserve simulated vLLM {VLLM_VERSION} (no GPU, no model) pid={os.getpid()} "
        f"non-default args: {json.dumps(redacted(args))}")
    if args.unknown:
        log(f"ignoring flags the simulator does not model: {' '.join(args.unknown)}")
    signal.signal(signal.SIGTERM, eng.on_sigterm)
    signal.signal(signal.SIGINT, lambda *_: eng.exit(130, "Received SIGINT; exiting"))
    eng.start_fault()
    if eng.multi_node_tp and args.node_rank > 0:
        eng.join_tp()  # returns only by exiting
    if args.headless and not eng.multi_node_dp:
        fatal(1, "ValueError: --headless without remote data parallel ranks or --nnodes: "
                 "there is no head node to join")
    if eng.multi_node_dp and (args.headless or args.data_parallel_start_rank):
        # Engines whose ranks are not the head's own say hello at the head's handshake socket,
        # with or without --headless (the head decides whether that is allowed).
        eng.join_dp()  # returns only by exiting
    host = args.host or "0.0.0.0"  # vLLM's default binds every interface
    http_sock = bind_socket(host, args.port, "API server (--host/--port)")
    if args.kv and args.kv["kv_connector"] == "NixlConnector":
        eng.serve_side_channel()
    if args.kv and args.kv["kv_connector"] == "MooncakeConnector" and role == "prefill":
        port = int(os.environ.get("VLLM_MOONCAKE_BOOTSTRAP_PORT", "8998"))
        serve_http(eng, bind_socket("0.0.0.0", port, "Mooncake bootstrap server"),
                   MooncakeBootstrap)
        log(f"Mooncake bootstrap server listening on 0.0.0.0:{port}")
    if eng.multi_node_tp:
        eng.lead_tp()
    if eng.multi_node_dp:
        eng.lead_dp()
    # vLLM 0.32.0's lines (vllm/model_executor/model_loader/default_loader.py; the server's
    # in vllm/entrypoints/launchers/api_server/entry.py, logged before uvicorn serves)
    eng.loading(lambda s: f"Loading weights took {s:.2f} seconds")
    log(f"Starting vLLM server on http://{host}:{args.port}")
    serve_http(eng, http_sock, VLLMHandler)
    self_check(eng, host, args.port, "/v1/models")
    log("Application startup complete.")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
