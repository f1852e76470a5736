#!/usr/bin/env python3
"""Simulated SGLang server: a stdlib-only stand-in for `python3 -m sglang.launch_server`.

It takes the exact argv of the real server and reproduces what a launcher can get wrong:
address binding, multi-node rendezvous on --dist-init-addr, node-rank-0-only HTTP, the PD
bootstrap server and the decode side's dependency on it, SIGTERM semantics and injectable faults.
No GPU, no model. Copied into job directories as hpcserve_sim.py, so it must stay a single file
with no imports outside the standard library.

Knobs (environment):
  HPCSERVE_SIM_STARTUP_DELAY         seconds between init and opening the HTTP port (default 0)
  HPCSERVE_SIM_INIT_TIMEOUT          multi-node rendezvous timeout in seconds (default 60)
  HPCSERVE_SIM_PEER_LOSS_DELAY       seconds a surviving rank takes to notice a dead peer, as an
                                     NCCL watchdog does; so srun reports the dead node first (0.5)
  HPCSERVE_SIM_BOOTSTRAP_TIMEOUT     decode: how long to wait for the prefill's room (default 30)
  HPCSERVE_SIM_PREFILL_S_PER_TOKEN   prefill compute time per prompt token (default 0)
  HPCSERVE_SIM_DECODE_S_PER_TOKEN    time per output token (default 0)
  HPCSERVE_SIM_FAULT                 exit:CODE:AFTER_S | hang:AFTER_S | unhealthy (AFTER_S counts
                                     from process start; a hung server also ignores SIGTERM)
  HPCSERVE_SIM_FAULT_RANKS           node ranks the fault applies to, e.g. "0,2" (default: all)
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
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn


class ThreadingHTTPServer(ThreadingMixIn, HTTPServer):  # http.server has it only from 3.7 on
    daemon_threads = True

SGLANG_VERSION = "0.5.23"
START = time.monotonic()
TAG = "sim"  # log prefix: role and node rank, set in main()


def log(msg):
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{ts} {TAG}] {msg}\n")
    sys.stderr.flush()


def env_float(name, default):
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        val = float(raw)
    except ValueError:
        fatal(2, f"invalid {name}={raw!r}: expected a number of seconds")
    if val < 0:
        fatal(2, f"invalid {name}={raw!r}: must be >= 0")
    return val


def fatal(code, msg):
    log(msg)
    os._exit(code)


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


def split_addr(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        fatal(2, f"invalid --dist-init-addr {addr!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def bind_socket(host, port, what):
    """Bind (not listen): a bound, non-listening port refuses connections, which is what a
    client of a still-loading SGLang sees, while a bad address fails now, not after the delay."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        fam = infos[0][0]
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(infos[0][4][:2] if fam == socket.AF_INET else infos[0][4])
        return sock
    except OSError as e:
        fatal(1, f"ERROR: {what}: cannot bind {host}:{port}: {e}"
                 f" (is {host} an address of this node, and is the port free?)")


def apply_keepalive(sock):
    # A node that vanishes without a FIN (power loss, network cut) must still end its peers.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, val in (("TCP_KEEPIDLE", 1), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), val)


def send_msg(sock, obj):
    try:
        sock.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass


class Engine:
    def __init__(self, args):
        self.args = args
        self.rank = args.node_rank
        self.mode = args.disaggregation_mode
        self.status = "starting"       # starting -> ready; faults and SIGTERM are flags beside it
        self.unhealthy = False
        self.frozen = threading.Event()
        self.terminating = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.peers = {}                 # rank -> socket (leader) / {0: socket} (peer)
        self.exiting = threading.Lock()
        self.rooms = {}                 # bootstrap_room -> (monotonic time, info)
        self.rooms_cv = threading.Condition()
        self.prefill_s = env_float("HPCSERVE_SIM_PREFILL_S_PER_TOKEN", 0.0)
        self.decode_s = env_float("HPCSERVE_SIM_DECODE_S_PER_TOKEN", 0.0)
        self.bootstrap_timeout = env_float("HPCSERVE_SIM_BOOTSTRAP_TIMEOUT", 30.0)
        self.init_timeout = env_float("HPCSERVE_SIM_INIT_TIMEOUT", 60.0)
        self.peer_loss_delay = env_float("HPCSERVE_SIM_PEER_LOSS_DELAY", 0.5)
        self.startup_delay = env_float("HPCSERVE_SIM_STARTUP_DELAY", 0.0)

    # ---- lifecycle ---------------------------------------------------------------------------
    def exit(self, code, msg):
        """The one way out once peers may exist: tell them why, then leave without waiting for
        worker threads (a hung handler must not keep a dead server alive)."""
        if not self.exiting.acquire(blocking=False):
            threading.Event().wait()
        log(msg)
        note = {"shutdown": True} if code == 0 else {"error": msg}
        for s in list(self.peers.values()):
            send_msg(s, note)
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        os._exit(code)

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
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        while True:
            with self.lock:
                if self.inflight == 0:
                    break
            time.sleep(0.1)
        self.exit(0, "Graceful exit complete; sending ShutdownReq to all nodes")

    def start_fault(self):
        spec = os.environ.get("HPCSERVE_SIM_FAULT", "").strip()
        if not spec:
            return
        ranks_raw = os.environ.get("HPCSERVE_SIM_FAULT_RANKS", "").strip()
        try:
            ranks = {int(r) for r in ranks_raw.split(",") if r.strip()}
        except ValueError:
            fatal(2, f"invalid HPCSERVE_SIM_FAULT_RANKS={ranks_raw!r}: expected e.g. 0,2")
        if ranks and self.rank not in ranks:
            return
        parts = spec.split(":")
        try:
            if parts[0] == "exit" and len(parts) == 3:
                code, after = int(parts[1]), float(parts[2])
                self._after(after, lambda: self.fault_exit(code))
            elif parts[0] == "hang" and len(parts) == 2:
                self._after(float(parts[1]), self.fault_hang)
            elif parts == ["unhealthy"]:
                self.unhealthy = True
                self._tell_leader({"fault": "unhealthy", "rank": self.rank})
            else:
                raise ValueError
        except ValueError:
            fatal(2, f"invalid HPCSERVE_SIM_FAULT={spec!r}: expected exit:CODE:AFTER_S, "
                     "hang:AFTER_S or unhealthy")
        log(f"fault injection armed: {spec}")

    def _after(self, delay, fn):
        t = threading.Timer(max(0.0, delay - (time.monotonic() - START)), fn)
        t.daemon = True
        t.start()

    def fault_exit(self, code):
        log(f"fault injection: exiting with code {code}")
        sys.stderr.flush()
        os._exit(code)  # a crash: no goodbye to peers, they must notice the dead socket

    def fault_hang(self):
        log("fault injection: hanging (HTTP requests will not be answered)")
        self.frozen.set()
        self._tell_leader({"fault": "hang", "rank": self.rank})

    def _tell_leader(self, msg):
        # A wedged or sick scheduler on any rank stalls rank 0's collectives too.
        if self.rank != 0 and 0 in self.peers:
            send_msg(self.peers[0], msg)

    def apply_peer_fault(self, msg):
        if msg.get("fault") == "hang":
            log(f"node rank {msg.get('rank')} is hung; collectives stall")
            self.frozen.set()
        elif msg.get("fault") == "unhealthy":
            log(f"node rank {msg.get('rank')} reports unhealthy")
            self.unhealthy = True

    # ---- multi-node rendezvous ---------------------------------------------------------------
    def init_prefix(self):
        a = self.args
        return (f"torch.distributed init failed (dist_init_addr={a.dist_init_addr}, "
                f"node_rank={self.rank}, nnodes={a.nnodes}): ")

    def lead_init(self):
        a = self.args
        host, port = split_addr(a.dist_init_addr)
        lsock = bind_socket(host, port, "torch.distributed TCPStore (--dist-init-addr)")
        try:
            lsock.listen(64)
        except OSError as e:
            fatal(1, self.init_prefix() + f"cannot listen on {a.dist_init_addr}: {e}")
        lsock.settimeout(0.2)
        deadline = time.monotonic() + self.init_timeout
        missing = set(range(1, a.nnodes))
        log(f"init torch distributed begin: waiting for {len(missing)} peer node(s) at "
            f"{a.dist_init_addr}")
        while missing:
            if time.monotonic() > deadline:
                self.exit(1, self.init_prefix() + f"timed out waiting for ranks "
                          f"{sorted(missing)} at {a.dist_init_addr} after "
                          f"{self.init_timeout:g}s")
            try:
                conn, peer_addr = lsock.accept()
            except socket.timeout:
                continue
            hello = self._read_hello(conn)
            if hello is None:
                conn.close()
                continue
            err = self._check_hello(hello, missing)
            if err:
                send_msg(conn, {"error": err})
                self.exit(1, self.init_prefix() + err)
            r = hello["rank"]
            self.peers[r] = conn
            missing.discard(r)
            log(f"node rank {r} joined from {peer_addr[0]}")
        for r, s in self.peers.items():
            send_msg(s, {"ok": True})
            s.settimeout(None)
            apply_keepalive(s)
            threading.Thread(target=self._watch_peer, args=(r, s), daemon=True).start()
        threading.Thread(target=self._refuse_late, args=(lsock,), daemon=True).start()
        log(f"init torch distributed ends: all {a.nnodes} nodes joined")

    def _read_hello(self, conn):
        conn.settimeout(5)
        try:
            line = conn.makefile("rb").readline(65536)
            hello = json.loads(line)
            if isinstance(hello, dict) and isinstance(hello.get("rank"), int):
                return hello
        except (OSError, ValueError):
            pass
        log("ignoring a connection to the dist-init port that did not send a rank hello")
        return None

    def _check_hello(self, h, missing):
        a, r = self.args, h["rank"]
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
        return None

    def _refuse_late(self, lsock):
        while True:
            try:
                conn, _ = lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            hello = self._read_hello(conn)
            if hello is not None:
                send_msg(conn, {"error": f"node rank {hello['rank']} joined after init had "
                                         f"completed (all {self.args.nnodes} nodes present)"})
            conn.close()

    def _watch_peer(self, rank, sock):
        f = sock.makefile("rb")
        while True:
            try:
                line = f.readline()
            except OSError:
                line = b""
            if not line:
                time.sleep(self.peer_loss_delay)
                self.exit(1, f"NCCL error: remote process exited or network error: lost node "
                             f"rank {rank}; aborting")
            try:
                self.apply_peer_fault(json.loads(line))
            except ValueError:
                pass

    def join_init(self):
        a = self.args
        host, port = split_addr(a.dist_init_addr)
        deadline = time.monotonic() + self.init_timeout
        last = None
        log(f"init torch distributed begin: connecting to {a.dist_init_addr} as node rank "
            f"{self.rank} of {a.nnodes}")
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                fatal(1, self.init_prefix() + f"timed out after {self.init_timeout:g}s "
                         f"connecting to {a.dist_init_addr}: {last}")
            try:
                sock = socket.create_connection((host, port), timeout=min(2.0, remaining))
                break
            except OSError as e:  # like torch's TCPStore client: retry until the timeout
                last = e
                time.sleep(0.2)
        send_msg(sock, {"rank": self.rank, "nnodes": a.nnodes, "tp_size": a.tp_size,
                        "mode": self.mode})
        f = sock.makefile("rb")
        sock.settimeout(max(1.0, deadline - time.monotonic()) + 5.0)
        try:
            reply = json.loads(f.readline() or b"null")
        except socket.timeout:
            fatal(1, self.init_prefix() + f"timed out waiting for the other ranks at "
                     f"{a.dist_init_addr} after {self.init_timeout:g}s")
        except (OSError, ValueError) as e:
            fatal(1, self.init_prefix() + f"bad reply from {a.dist_init_addr}: {e}")
        if not isinstance(reply, dict):
            fatal(1, self.init_prefix() + f"node rank 0 at {a.dist_init_addr} closed the "
                                          "connection during init")
        if reply.get("shutdown"):
            fatal(0, "node rank 0 shut down during init; exiting")
        if not reply.get("ok"):
            # The leader's message already carries its own torch-style prefix and reason.
            fatal(1, f"rendezvous failed, node rank 0 says: {reply.get('error')}")
        sock.settimeout(None)
        apply_keepalive(sock)
        self.peers[0] = sock
        if self.unhealthy:
            self._tell_leader({"fault": "unhealthy", "rank": self.rank})
        if self.frozen.is_set():
            self._tell_leader({"fault": "hang", "rank": self.rank})
        log(f"init torch distributed ends: joined {a.dist_init_addr} as node rank {self.rank}")
        while True:
            try:
                line = f.readline()
            except OSError:
                line = b""
            if not line:
                time.sleep(self.peer_loss_delay)
                fatal(1, "NCCL error: lost connection to node rank 0; aborting")
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("shutdown"):
                fatal(0, "Received ShutdownReq from node rank 0; exiting")
            if msg.get("error"):
                fatal(1, f"node rank 0 aborted: {msg['error']}")

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

    def model_info(self):
        a = self.args
        return {"model_path": a.model_path, "tokenizer_path": a.tokenizer_path,
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "sim",
                "architectures": ["SimulatedForCausalLM"]}


class KVTransferError(Exception):
    pass


class BadRequest(Exception):
    pass


def count_tokens(text):
    return max(1, len(str(text).split()))


def chat_prompt_text(messages):
    parts = []
    for m in messages or []:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list):
            parts += [p.get("text", "") for p in c if isinstance(p, dict)]
        elif c is not None:
            parts.append(str(c))
    return " ".join(parts)


def first_int(*vals, default):
    for v in vals:
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise BadRequest(f"max tokens must be a non-negative integer, got {v!r}")
            return v
    return default


class SimHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    engine = None  # set per server

    def log_message(self, fmt, *args):
        pass

    def log_request(self, code="-", size="-"):
        path = getattr(self, "path", "")  # unset when the request line was unparsable
        if path.split("?")[0] not in ("/health", "/health_generate", "/ready"):
            log(f'{self.client_address[0]} - "{getattr(self, "command", "")} {path}" {code}')

    # -- plumbing
    def send_json(self, code, obj):
        body = b"" if obj is None else json.dumps(obj).encode()
        self.send_response(code)
        if obj is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
        else:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not data:
            return {}
        try:
            return json.loads(data)
        except ValueError as e:
            raise BadRequest(f"invalid JSON body: {e}")

    def start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def sse(self, obj):
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self):
        self.sse(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def freeze_if_hung(self):
        if self.engine.frozen.is_set():
            threading.Event().wait()

    # -- routing
    def do_GET(self):
        self.freeze_if_hung()
        eng, path = self.engine, self.path.split("?")[0]
        if path in ("/health", "/health_generate", "/ready"):
            ok = eng.status == "ready" and not eng.terminating and not eng.unhealthy
            return self.send_json(200 if ok else 503, None)
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
        self.freeze_if_hung()
        path = self.path.split("?")[0]
        kinds = {"/generate": "generate", "/v1/completions": "completion",
                 "/v1/chat/completions": "chat"}
        if path not in kinds:
            if path == "/flush_cache":
                return self.send_json(200, None)
            return self.send_json(404, {"detail": "Not Found"})
        eng = self.engine
        kind = kinds[path]
        with eng.lock:
            eng.inflight += 1
        try:
            try:
                body = self.read_body()
                if eng.terminating or eng.status != "ready":
                    return self.error(kind, 503, "server is not ready or is shutting down")
                self.generate(kind, body)
            except BadRequest as e:
                self.error(kind, 400, str(e))
            except KVTransferError as e:
                log(f"ERROR: {e}")
                self.error(kind, 500, str(e))
            except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
                self.error(kind, 400, f"malformed request: {e!r}")  # odd shapes of valid JSON
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client (or router) went away mid-stream
        finally:
            with eng.lock:
                eng.inflight -= 1

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
            max_new = first_int(body.get("max_completion_tokens"), body.get("max_tokens"),
                                default=16)
            if kind == "chat":
                prompts, batch = [count_tokens(chat_prompt_text(body.get("messages")))], False
            else:
                prompts, batch = [count_tokens(body.get("prompt", ""))], False
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
        if eng.mode == "prefill":
            for room, n in zip(rooms, prompts):
                eng.register_room(room, {"bootstrap_room": room, "prompt_tokens": n,
                                         "prefill": f"{eng.args.host}:{eng.args.port}"})
            max_new = min(max_new, 1)  # prefill emits only the first token; decode does the rest
        rid = body.get("rid") or uuid.uuid4().hex
        model = body.get("model") or eng.args.served_model_name
        if stream:
            return self.stream(kind, body, rid, model, prompts[0], max_new, t0)
        results = []
        for i, n in enumerate(prompts):
            for _ in range(max_new):
                self.freeze_if_hung()
                time.sleep(eng.decode_s)
            results.append(self.final(kind, f"{rid}-{i}" if batch else rid, model, n, max_new, t0))
        self.send_json(200, results if batch else results[0])

    def final(self, kind, rid, model, prompt, n, t0):
        text = "".join(f" tok{i}" for i in range(n))
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        if kind == "generate":
            return {"text": text, "output_ids": [1000 + i for i in range(n)],
                    "meta_info": self.meta(rid, prompt, n, t0, True)}
        created = int(time.time())
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                              "reasoning_content": None, "tool_calls": None},
                      "logprobs": None, "finish_reason": "length", "matched_stop": None}
            return {"id": rid, "object": "chat.completion", "created": created, "model": model,
                    "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                  "matched_stop": None}
        return {"id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [choice], "usage": usage}

    @staticmethod
    def meta(rid, prompt, n, t0, done):
        return {"id": rid, "finish_reason": {"type": "length", "length": n} if done else None,
                "prompt_tokens": prompt, "completion_tokens": n, "cached_tokens": 0,
                "e2e_latency": round(time.monotonic() - t0, 6)}

    def stream(self, kind, body, rid, model, prompt, n, t0):
        eng = self.engine
        created = int(time.time())
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}

        def chunk(choice_fields, finish=None):
            choice = {"index": 0, **choice_fields, "logprobs": None, "finish_reason": finish}
            return {"id": rid, "object": obj, "created": created, "model": model,
                    "choices": [choice]}

        self.start_stream()
        if kind == "chat":
            self.sse(chunk({"delta": {"role": "assistant", "content": ""}}))
        text = ""
        for i in range(n):
            self.freeze_if_hung()
            time.sleep(eng.decode_s)
            tok = f" tok{i}"
            text += tok
            if kind == "generate":
                # SGLang streams the cumulative text by default.
                self.sse({"text": text, "output_ids": [1000 + j for j in range(i + 1)],
                          "meta_info": self.meta(rid, prompt, i + 1, t0, i == n - 1)})
            elif kind == "chat":
                self.sse(chunk({"delta": {"content": tok}}))
            else:
                self.sse(chunk({"text": tok}))
        if kind == "generate" and n == 0:
            self.sse({"text": "", "output_ids": [],
                      "meta_info": self.meta(rid, prompt, 0, t0, True)})
        if kind != "generate":
            self.sse(chunk({"delta": {}} if kind == "chat" else {"text": ""}, "length"))
            if (body.get("stream_options") or {}).get("include_usage"):
                self.sse({"id": rid, "object": obj, "created": created, "model": model,
                          "choices": [], "usage": usage})
        self.end_stream()


class BootstrapHandler(SimHandler):
    """Prefill's bootstrap server. Real SGLang exchanges KV endpoints here; the simulator hands
    out per-room records so that a decode worker pointed at the wrong place visibly fails."""

    def do_GET(self):
        self.freeze_if_hung()
        url = urllib.parse.urlsplit(self.path)
        if url.path == "/health":
            body = b"OK"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            return self.wfile.write(body)
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


def main(argv=None):
    global TAG
    args = parse_args(sys.argv[1:] if argv is None else argv)
    role = args.disaggregation_mode if args.disaggregation_mode != "null" else "sim"
    TAG = f"{role} NR{args.node_rank}"
    eng = Engine(args)
    log(f"hpcserve simulated SGLang {SGLANG_VERSION} (no GPU, no model) pid={os.getpid()} "
        f"server_args={json.dumps({k: v for k, v in vars(args).items() if k != 'unknown'})}")
    if args.unknown:
        log(f"ignoring flags the simulator does not model: {' '.join(args.unknown)}")
    signal.signal(signal.SIGTERM, eng.on_sigterm)
    # Ctrl-C through srun reaches every rank; like SGLang's process-tree kill, no draining.
    signal.signal(signal.SIGINT, lambda *_: eng.exit(130, "Received SIGINT; exiting"))
    eng.start_fault()
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
    deadline = time.monotonic() + eng.startup_delay
    while time.monotonic() < deadline:
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))  # "loading weights"
    serve_http(eng, http_sock, SimHandler)
    log(f"Uvicorn running on http://{args.host}:{args.port}")
    _warmup(eng)
    while True:
        time.sleep(3600)


def serve_http(eng, sock, handler):
    """Serve on an already bound socket; listening only starts here, so until then clients get
    "connection refused", as with an SGLang that is still loading."""
    class Handler(handler):
        engine = eng

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128

        def handle_error(self, request, client_address):
            log(f"HTTP handler error for {client_address}: {sys.exc_info()[1]!r}")

    srv = Server(sock.getsockname()[:2], Handler, bind_and_activate=False)
    srv.socket.close()
    srv.socket = sock
    try:  # SO_REUSEADDR lets two bound-but-idle sockets share a port; only one can listen
        sock.listen(srv.request_queue_size)
    except OSError as e:
        eng.exit(1, f"ERROR: cannot listen on {sock.getsockname()[:2]}: {e}")
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()


def _warmup(eng):
    # Like SGLang's warmup request: prove the HTTP port answers from this node before "ready".
    host = eng.args.host
    host = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{eng.args.port}/model_info"
    try:  # no proxy: a loopback self-check must not depend on the site's http_proxy
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=30) as r:
            r.read()
    except OSError as e:
        eng.exit(1, f"ERROR: warmup request to {url} failed: {e}")
    eng.status = "ready"
    log("The server is fired up and ready to roll!")


if __name__ == "__main__":
    main()
