#!/usr/bin/env python3
"""Simulated SGLang server: a stdlib-only stand-in for `python3 -m sglang.launch_server`.

It takes the exact argv of the real server and reproduces what a launcher can get wrong:
address binding, multi-node rendezvous on --dist-init-addr, node-rank-0-only HTTP, the PD
bootstrap server and the decode side's dependency on it, SIGTERM semantics and injectable faults.
No GPU, no model. Copied into job directories as hpcserve_sim.py, so it must stay a single file
with no imports outside the standard library.

Knobs (environment), besides hpcserve_simcore's:
  HPCSERVE_SIM_BOOTSTRAP_TIMEOUT     decode: how long to wait for the prefill's room (default 30)
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

# The shared part lies beside this file, in the package and in a job directory alike (and
# `python -I` does not put the script's own folder on sys.path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hpcserve_simcore import (TAG, BadRequest, EngineBase, HandlerBase,  # noqa: E402
                              KVTransferError, Rendezvous, bind_socket, count_tokens,
                              engine_facts, env_float, fatal, first_int, log, release,
                              prometheus, self_check, serve_http)

# What the real release moves and answers, and when (hpcserve/engines/facts.py SGLANG, proved
# against 0.5.23 by tests/facts/): the stand-in moves a counter, or answers a health path, only
# where the release would.
FACTS = engine_facts("SGLANG")
SGLANG_VERSION = release(FACTS["releases"][-1])


def parse_args(argv):
    # allow_abbrev=False: the real parser is checked elsewhere; here a prefix must not silently
    # bind to one of the few flags we read.
    p = argparse.ArgumentParser(prog="sglang.launch_server (hpcserve sim)", allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    p.add_argument("--attn-dp-size", "--attention-data-parallel-size", dest="attn_dp_size",
                   type=int, default=None)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--ep-size", "--expert-parallel-size", "--ep", dest="ep_size", type=int,
                   default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--moe-a2a-backend", default="none")
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--disaggregation-mode", default="null", choices=["null", "prefill", "decode"])
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--disaggregation-transfer-backend", default="mooncake")
    p.add_argument("--disaggregation-ib-device", default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--api-key", default=None)
    # KTransformers: kt-kernel's CPU experts (--kt-amx-* before SGLang 0.5.6)
    p.add_argument("--kt-weight-path", "--kt-amx-weight-path", dest="kt_weight_path")
    p.add_argument("--kt-method", "--kt-amx-method", dest="kt_method", default="AMXINT4")
    p.add_argument("--kt-cpuinfer", type=int, default=None)
    p.add_argument("--kt-threadpool-count", type=int, default=2)
    p.add_argument("--kt-num-gpu-experts", type=int, default=None)
    args, unknown = p.parse_known_args(argv)
    args.unknown = unknown
    if args.served_model_name is None:
        args.served_model_name = args.model_path
    if args.tokenizer_path is None:
        args.tokenizer_path = args.model_path
    # SGLang >= 0.5.22 rewrites the deprecated dp-attention spelling the same way.
    if args.attn_dp_size is None:
        args.attn_dp_size = args.dp_size if args.enable_dp_attention else 1
        if args.enable_dp_attention:
            args.dp_size = 1
    if args.moe_a2a_backend != "none":
        args.ep_size = args.tp_size
    # A node rank out of range is left to the rendezvous, which fails every side, as torch does.
    if args.nnodes < 1:
        p.error(f"--nnodes must be >= 1, got {args.nnodes}")
    if (args.nnodes > 1 or args.node_rank != 0) and not args.dist_init_addr:
        p.error("--dist-init-addr is required when --nnodes > 1")
    return args


class Engine(EngineBase):
    def __init__(self, args):
        super().__init__(args.node_rank)
        self.args = args
        self.api_keys = [args.api_key] if args.api_key else []
        self.mode = args.disaggregation_mode
        self.rooms = {}                 # bootstrap_room -> (monotonic time, info)
        self.rooms_cv = threading.Condition()
        self.bootstrap_timeout = env_float("HPCSERVE_SIM_BOOTSTRAP_TIMEOUT", 30.0)
        # one scheduler per attention-DP rank, spread evenly over the nodes
        self.set_facts(FACTS, dp=args.attn_dp_size or 1)
        self.health_timeout = env_float("SGLANG_HEALTH_CHECK_TIMEOUT",
                                        float(FACTS["env"]["SGLANG_HEALTH_CHECK_TIMEOUT"]))

    def local(self, rank):
        """Node rank 0's /metrics reads its own node's metrics directory: the DP ranks there."""
        per_node = max(1, self.dp // max(1, self.args.nnodes))
        return rank < per_node

    def on_sigterm(self, signum, frame):
        if self.rank != 0:
            log(f"Received SIGTERM on node rank {self.rank}; ignoring it and waiting for the "
                "rank-0 ShutdownReq broadcast")
            return
        if self.frozen.is_set():
            log("Received SIGTERM, but the scheduler is hung; the process will not exit by itself")
            return
        if self.terminating:
            return
        self.terminating = True
        log("Received SIGTERM; gracefully exiting: /health now returns 503, draining "
            "in-flight requests")
        self.drain_then_exit("Graceful exit complete; sending ShutdownReq to all nodes")

    # ---- multi-node rendezvous: torch.distributed at --dist-init-addr ------------------------
    def rendezvous(self):
        return Rendezvous(self, self.args.dist_init_addr, "--dist-init-addr",
                          "torch.distributed TCPStore", self.init_timeout,
                          peer_name=lambda r: f"node rank {r}",
                          shutdown_msg="Received ShutdownReq from node rank 0; exiting")

    def init_prefix(self):
        a = self.args
        return (f"torch.distributed init failed (dist_init_addr={a.dist_init_addr}, "
                f"node_rank={self.rank}, nnodes={a.nnodes}): ")

    def lead_init(self):
        a = self.args
        self.rendezvous().lead(
            range(1, a.nnodes), self._check_hello, lambda e: self.init_prefix() + e,
            lambda missing: f"timed out waiting for ranks {sorted(missing)} at "
                            f"{a.dist_init_addr} after {self.init_timeout:g}s")

    def _check_hello(self, h, missing):
        a, r = self.args, h.get("rank")
        if not isinstance(r, int):
            return "a peer sent no node rank"
        if h.get("nnodes") != a.nnodes:
            return f"expected {a.nnodes} nodes, peer rank {r} says {h.get('nnodes')}"
        if not 1 <= r < a.nnodes:
            return f"node rank {r} out of range for nnodes {a.nnodes}"
        if r in self.peers:
            return f"duplicate node rank {r}"
        if h.get("tp_size") != a.tp_size:
            return (f"tp_size mismatch: node rank 0 has {a.tp_size}, node rank {r} says "
                    f"{h.get('tp_size')}")
        if h.get("mode") not in (None, self.mode):
            return (f"disaggregation mode mismatch: node rank 0 is {self.mode}, node rank {r} "
                    f"is {h.get('mode')}")
        return [r]

    def join_init(self):
        a = self.args
        rz = self.rendezvous()
        f = rz.join({"rank": self.rank, "nnodes": a.nnodes, "tp_size": a.tp_size,
                     "mode": self.mode},
                    lambda last: self.init_prefix() + f"timed out after {self.init_timeout:g}s "
                                                      f"connecting to {a.dist_init_addr}: {last}",
                    lambda e: self.init_prefix() + e)
        rz.follow(f)

    # ---- PD bootstrap ------------------------------------------------------------------------
    def register_room(self, room, info):
        with self.rooms_cv:
            now = time.monotonic()
            for k in [k for k, (t, _) in self.rooms.items() if now - t > 600]:
                del self.rooms[k]  # the decode side never came; do not grow forever
            self.rooms[room] = (now, info)
            self.rooms_cv.notify_all()

    def take_room(self, room, wait):
        with self.rooms_cv:
            self.rooms_cv.wait_for(lambda: room in self.rooms, timeout=wait)
            entry = self.rooms.pop(room, None)
        return entry and entry[1]

    def fetch_room(self, host, port, room):
        """Decode side: the KV cache for `room` must come from the prefill's bootstrap server
        before the first token, exactly the dependency a misrouted deployment breaks."""
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        base = f"http://{host}:{port}"
        where = f"prefill bootstrap server {base}"
        deadline = time.monotonic() + self.bootstrap_timeout
        last = "no attempt"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KVTransferError(f"KV transfer failed for bootstrap_room {room}: no KV from "
                                      f"{where} within {self.bootstrap_timeout:g}s ({last})")
            wait = min(2.0, remaining)
            url = f"{base}/room/{room}?wait={wait:.3f}"
            try:  # proxies from the environment apply, as with SGLang's requests.get
                with urllib.request.urlopen(url, timeout=wait + 5) as r:
                    return json.loads(r.read())
            except urllib.error.HTTPError as e:
                body = e.read()[:300].decode("utf-8", "replace")
                if '"bootstrap_pending"' in body:
                    last = "room not registered yet"
                else:
                    last = f"{base} is not a bootstrap server: HTTP {e.code} {body}"
                    time.sleep(0.2)
            except (OSError, ValueError) as e:
                last = f"cannot reach {where}: {getattr(e, 'reason', e)}"
                time.sleep(0.2)

    # ---- HTTP --------------------------------------------------------------------------------
    def server_info(self):
        a = self.args
        info = {k: v for k, v in vars(a).items() if k != "unknown"}
        info.update(
            version=SGLANG_VERSION, simulated=True, status=self.status,
            load_balance_method=("follow_bootstrap_room" if self.mode == "prefill"
                                 else "round_robin"),
            skip_tokenizer_init=False, max_total_num_tokens=1 << 20,
            max_req_input_len=(a.context_length or 131072) - 1,
            context_length=a.context_length or 131072, is_embedding=False,
            internal_states=[{"attention_backend": "sim", "avg_spec_accept_length": None,
                              "last_gen_throughput": 0.0}],
            extra_argv=a.unknown,
        )
        return info

    def metrics(self):
        """GET /metrics of SGLang 0.5.23 with --enable-metrics: the scheduler gauges of the DP
        ranks on this node (one exporting scheduler per DP group, dp_rank labelled where there
        are several) and the counters of the facts table, each moved as the release moves it
        (hpcserve_simcore EngineBase.set_facts)."""
        lab = {"model_name": self.args.served_model_name}
        with self.lock:
            ranks = [r for r in range(self.dp) if self.local(r)]

            def per_rank(values):
                return [({**lab, "dp_rank": str(r)} if self.dp > 1 else lab, values[r])
                        for r in ranks]
            usage = [min(1.0, v / 256) for v in self.running_by]
            return prometheus([
                ("sglang:num_running_reqs", "gauge", "The number of running requests.",
                 per_rank(self.running_by)),
                ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting "
                 "queue.", per_rank(self.waiting_by)),
                ("sglang:token_usage", "gauge", "The token usage.", per_rank(usage)),
            ] + self.counter_metrics(lab))

    def loads(self, prometheus_text):
        """GET /v1/loads: every DP rank's load, whatever node it runs on (the tokenizer reads
        every scheduler's snapshot); as Prometheus text one sample per dp_rank of each core
        number, named sglang_<key> (sglang/srt/entrypoints/v1_loads.py)."""
        with self.lock:
            rows = [{"dp_rank": r, "num_running_reqs": self.running_by[r],
                     "num_waiting_reqs": self.waiting_by[r],
                     "token_usage": min(1.0, self.running_by[r] / 256)}
                    for r in range(self.dp)]
        if not prometheus_text:
            return {"version": SGLANG_VERSION, "loads": rows}
        lines = []
        for key in ("num_running_reqs", "num_waiting_reqs", "token_usage"):
            lines.append(f"# TYPE sglang_{key} gauge")
            lines += [f'sglang_{key}{{dp_rank="{r["dp_rank"]}"}} {r[key]}' for r in rows]
        return "\n".join(lines) + "\n"

    def model_info(self):
        a = self.args
        return {"model_path": a.model_path, "tokenizer_path": a.tokenizer_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "sim",
                "architectures": ["SimulatedForCausalLM"]}


class SimHandler(HandlerBase):
    quiet_paths = ("/health", "/health_generate", "/ready", "/metrics", "/v1/loads")

    def guarded(self, path):
        # sglang/srt/utils/auth.py: decide_request_auth lets /health*, /ready* and /metrics*
        # through whatever the keys; every other endpoint the simulator has is NORMAL
        return not path.startswith(("/health", "/ready", "/metrics"))

    # -- routing
    def do_GET(self):
        eng, path = self.engine, self.path.split("?")[0]
        text = "text/plain; version=0.0.4; charset=utf-8"
        if path == "/metrics" and eng.args.enable_metrics:
            # the tokenizer manager's process answers even while the scheduler is hung
            return self.send_text(200, eng.metrics(), text)
        if path == "/v1/loads":  # the schedulers' last snapshots: no scheduler is asked
            prom = "format=prometheus" in self.path
            out = eng.loads(prom)
            return self.send_text(200, out, text) if prom else self.send_json(200, out)
        if path in FACTS["health"]:
            return self.health_path(FACTS["health"][path])
        self.freeze_if_hung()  # every other route waits on the scheduler
        if path == "/ready":
            return self.send_json(200 if self.healthy() else 503, None)
        if path in ("/server_info", "/get_server_info"):
            return self.send_json(200, eng.server_info())
        if path in ("/model_info", "/get_model_info"):
            return self.send_json(200, eng.model_info())
        if path == "/v1/models":
            a = eng.args
            return self.send_json(200, {"object": "list", "data": [{
                "id": a.served_model_name, "object": "model", "created": int(time.time()),
                "owned_by": "sglang", "root": a.model_path,
                "max_model_len": a.context_length or 131072}]})
        if path == "/get_load":
            return self.send_json(200, [{"dp_rank": 0, "num_reqs": eng.inflight,
                                         "num_waiting_reqs": 0, "num_tokens": 0}])
        return self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        path = self.path.split("?")[0]
        kinds = {"/generate": "generate", "/v1/completions": "completion",
                 "/v1/chat/completions": "chat"}
        if path not in kinds:
            self.freeze_if_hung()
            if path == "/flush_cache":
                return self.send_json(200, None)
            return self.send_json(404, {"detail": "Not Found"})
        self.count_inflight(lambda: self.answer(kinds[path]))

    def health_path(self, fact):
        """GET /health or /health_generate as the facts say: "generation" runs a 1-token
        request through the scheduler (200 once it answers, 503 after SGLANG_HEALTH_CHECK_TIMEOUT
        when it does not), unless the environment variable that turns it into a plain 200 is
        set false."""
        eng = self.engine
        off = fact.get("unless_env")
        if fact["proves"] != "generation" or (
                off and os.environ.get(off, "true").strip().lower() in ("0", "false", "no")):
            return self.send_json(200 if self.healthy() else 503, None)
        if not self.healthy():
            return self.send_json(503, None)
        if eng.frozen.wait(eng.probe_delay()):
            time.sleep(eng.health_timeout)  # a wedged scheduler answers nothing
            log(f"Health check failed. Server couldn't get a response from detokenizer for "
                f"last {eng.health_timeout:g} seconds.")
            return self.send_json(503, None)
        return self.send_json(200, None)

    def error(self, kind, code, msg):
        if kind == "generate":
            obj = {"error": {"message": msg, "code": code}}
        else:
            obj = {"object": "error", "message": msg, "code": code, "param": None,
                   "type": "BadRequestError" if code == 400 else "InternalServerError"}
        self.send_json(code, obj)

    # -- generation
    def generate(self, kind, body):
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        eng = self.engine
        stream = bool(body.get("stream"))
        if kind == "generate":
            sp = body.get("sampling_params") or {}
            max_new = first_int(sp.get("max_new_tokens"), default=128)
            if body.get("input_ids") is not None:
                ids = body["input_ids"]
                batch = bool(ids) and isinstance(ids[0], list)
                prompts = [len(x) for x in ids] if batch else [len(ids)]
            else:
                text = body.get("text")
                if text is None:
                    raise BadRequest("either text or input_ids must be provided")
                batch = isinstance(text, list)
                prompts = [count_tokens(t) for t in (text if batch else [text])]
        else:
            prompt, max_new, stream = self.openai_request(kind, body)
            prompts, batch = [prompt], False
        if batch and stream:
            raise BadRequest("the simulator does not stream batch requests")

        def pick(key, i):
            v = body.get(key)
            return v[i] if isinstance(v, list) else v

        rooms = [pick("bootstrap_room", i) for i in range(len(prompts))]
        if eng.mode != "null" and any(isinstance(r, bool) or not isinstance(r, int) for r in rooms):
            raise BadRequest(f"this is a PD {eng.mode} server: the request needs "
                             "bootstrap_host/bootstrap_port/bootstrap_room (send it through "
                             "the PD router)")
        t0 = time.monotonic()
        if eng.mode == "decode":
            for i, room in enumerate(rooms):
                host = pick("bootstrap_host", i)
                if not host:
                    raise BadRequest("decode server got a request without bootstrap_host")
                port = pick("bootstrap_port", i) or eng.args.disaggregation_bootstrap_port
                eng.fetch_room(host, port, room)
        else:
            time.sleep(sum(prompts) * eng.prefill_s)
        if eng.mode == "prefill" and eng.faulty("kv-lost"):
            log(f"fault injection: the KV of bootstrap_room(s) {rooms} goes to no decode")
        elif eng.mode == "prefill":
            for room, n in zip(rooms, prompts):
                eng.register_room(room, {"bootstrap_room": room, "prompt_tokens": n,
                                         "prefill": f"{eng.args.host}:{eng.args.port}"})
            max_new = min(max_new, 1)  # prefill emits only the first token; decode does the rest
        rid = body.get("rid") or uuid.uuid4().hex
        model = body.get("model") or eng.args.served_model_name
        if kind != "generate":
            return self.respond(kind, body, rid, model, prompts[0], max_new)
        self.start_decode(sum(prompts))
        if stream:
            return self.stream_generate(rid, prompts[0], max_new, t0)
        results = []
        for i, n in enumerate(prompts):
            for _ in range(max_new):
                self.decode_step()
            results.append({"text": "".join(f" tok{k}" for k in range(max_new)),
                            "output_ids": [1000 + k for k in range(max_new)],
                            "meta_info": self.meta(f"{rid}-{i}" if batch else rid, n, max_new,
                                                   t0, True)})
        self.send_json(200, results if batch else results[0])

    @staticmethod
    def meta(rid, prompt, n, t0, done):
        return {"id": rid, "finish_reason": {"type": "length", "length": n} if done else None,
                "prompt_tokens": prompt, "completion_tokens": n, "cached_tokens": 0,
                "e2e_latency": round(time.monotonic() - t0, 6)}

    def stream_generate(self, rid, prompt, n, t0):
        self.start_stream()
        text = ""
        for i in range(n):
            self.decode_step()
            text += f" tok{i}"
            # SGLang streams the cumulative text by default.
            self.sse({"text": text, "output_ids": [1000 + j for j in range(i + 1)],
                      "meta_info": self.meta(rid, prompt, i + 1, t0, i == n - 1)})
        if n == 0:
            self.sse({"text": "", "output_ids": [], "meta_info": self.meta(rid, prompt, 0, t0,
                                                                          True)})
        self.end_stream()


class BootstrapHandler(SimHandler):
    """Prefill's bootstrap server. Real SGLang exchanges KV endpoints here; the simulator hands
    out per-room records so that a decode worker pointed at the wrong place visibly fails."""

    def guarded(self, path):
        return False  # its own server, without the HTTP server's key middleware

    def do_GET(self):
        self.freeze_if_hung()
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/health":
            return self.send_text(200, "OK")
        if url.path == "/route":  # what real decode workers ask first: the prefill's layout
            a = self.engine.args
            return self.send_json(200, {"prefill_attn_tp_size": a.tp_size // max(1, a.attn_dp_size),
                                        "prefill_dp_size": a.attn_dp_size,
                                        "prefill_pp_size": a.pp_size, "simulated": True})
        if url.path.startswith("/room/"):
            try:
                room = int(url.path[len("/room/"):])
                wait = min(5.0, float(urllib.parse.parse_qs(url.query).get("wait", ["0"])[0]))
            except ValueError:
                return self.send_json(400, {"detail": "bad room"})
            info = self.engine.take_room(room, wait)
            if info is None:
                return self.send_json(404, {"status": "bootstrap_pending", "room": room})
            return self.send_json(200, info)
        return self.send_json(404, {"detail": "Not Found"})

    def do_POST(self):
        self.send_json(404, {"detail": "Not Found"})


def start_kt_kernel(args):
    """KTransformers' CPU experts: the weights must be on this node; the thread pools are
    split over the CPUs Slurm gave the task (kt-kernel pins one pool per NUMA node)."""
    if not os.path.isdir(args.kt_weight_path):
        fatal(1, f"FileNotFoundError: --kt-weight-path {args.kt_weight_path!r} is not a "
                 "directory on this node")
    if args.kt_cpuinfer is None or args.kt_cpuinfer < 1:
        fatal(1, "ValueError: --kt-cpuinfer must be set to the CPU threads for the experts")
    log(f"kt-kernel {args.kt_method}: {args.kt_cpuinfer} CPU threads in "
        f"{args.kt_threadpool_count} pool(s), {args.kt_num_gpu_experts} experts per layer on "
        f"the GPUs; Slurm gave this task SLURM_CPUS_PER_TASK="
        f"{os.environ.get('SLURM_CPUS_PER_TASK', '-')}, {len(os.sched_getaffinity(0))} CPU(s) "
        "in its affinity")


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    role = args.disaggregation_mode if args.disaggregation_mode != "null" else "sim"
    TAG[0] = f"{role} NR{args.node_rank}"
    eng = Engine(args)
    log(f"hpcserve simulated SGLang {SGLANG_VERSION} (no GPU, no model) pid={os.getpid()} "
        f"server_args={json.dumps({k: v for k, v in vars(args).items() if k != 'unknown'})}")
    if args.unknown:
        log(f"ignoring flags the simulator does not model: {' '.join(args.unknown)}")
    signal.signal(signal.SIGTERM, eng.on_sigterm)
    # Ctrl-C through srun reaches every rank; like SGLang's process-tree kill, no draining.
    signal.signal(signal.SIGINT, lambda *_: eng.exit(130, "Received SIGINT; exiting"))
    eng.start_fault()
    if args.kt_weight_path is not None:
        start_kt_kernel(args)
    if args.node_rank != 0:
        eng.join_init()  # returns only by exiting
    http_sock = bind_socket(args.host, args.port, "HTTP server (--host/--port)")
    if args.disaggregation_mode == "prefill":
        bsock = bind_socket(args.host, args.disaggregation_bootstrap_port,
                            "PD bootstrap server (--host/--disaggregation-bootstrap-port)")
        serve_http(eng, bsock, BootstrapHandler)
        log(f"bootstrap server listening on {args.host}:{args.disaggregation_bootstrap_port}")
    if args.dist_init_addr:
        eng.lead_init()
    # SGLang's line (sglang/srt/model_executor/model_runner.py, 0.4.6.post5 to 0.5.23)
    eng.loading(lambda s: f"Load weight end. elapsed={s:.2f} s, type=SimulatedModel, "
                          "avail mem=0.00 GB, mem usage=0.00 GB.")
    serve_http(eng, http_sock, SimHandler)
    log(f"Uvicorn running on http://{args.host}:{args.port}")
    self_check(eng, args.host, args.port, "/model_info")
    log("The server is fired up and ready to roll!")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
