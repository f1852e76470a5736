"""What hpcserve's simulated engines share (stdlib only): logging, fault injection, a multi-node
rendezvous that fails like the real one when an address, rank or count is wrong, and an
OpenAI-style HTTP server (chat and completions, streamed with usage).

Copied into job directories beside hpcserve_sim.py under this same name, so the stand-in of every
engine imports it the same way, in the package and in a job directory.

Shared knobs (environment):
  HPCSERVE_SIM_STARTUP_DELAY         seconds between init and opening the HTTP port (default 0)
  HPCSERVE_SIM_INIT_TIMEOUT          multi-node rendezvous timeout in seconds (default 60)
  HPCSERVE_SIM_PEER_LOSS_DELAY       seconds a surviving rank takes to notice a dead peer, as an
                                     NCCL watchdog does; so srun reports the dead node first (0.5)
  HPCSERVE_SIM_PREFILL_S_PER_TOKEN   prefill compute time per prompt token (default 0)
  HPCSERVE_SIM_DECODE_S_PER_TOKEN    time per output token (default 0)
  HPCSERVE_SIM_VERSION               the engine release the stand-in reports (SGLang's
                                     /get_server_info "version", vLLM's /version, its log's
                                     first line): the deployment's engine.version, so a rolling
                                     upgrade can be shown to start the new release (default:
                                     the newest release the stand-in was written against)
  HPCSERVE_SIM_FAULT                 one fault (AFTER_S counts from process start; the word
                                     SIGUSR1 in its place waits for that signal instead, so a
                                     test fires the fault once the deployment serves, however
                                     long the machine took to get there):
    exit:CODE:AFTER_S     the process exits with CODE, saying goodbye to no peer
    hang:AFTER_S          the engine core wedges: no request progresses, counters stand still and
                          SIGTERM is ignored; what still answers is the engine's own: SGLang's
                          /health runs a generation, so it never answers; vLLM's API server
                          answers /health 200 and /metrics (running/waiting stay > 0), and so
                          does trtllm-serve's (its /metrics then an empty list)
    slow:DELAY_S[:AFTER_S]  from AFTER_S on (default 0), GET /health (and /health_generate)
                          answers only after DELAY_S, while generation goes on and /metrics
                          answers at once: an engine that is slow because it is busy (on the
                          node rank that serves HTTP; unlike a hang it does not spread)
    unhealthy             /health answers 503
    empty:AFTER_N         0 output tokens, after AFTER_N generation requests answered as usual
    kv-lost:AFTER_N       a PD prefill hands no KV to its decode, after AFTER_N requests
  HPCSERVE_SIM_FAULT_RANKS           node ranks the fault applies to, e.g. "0,2" (default: all)
  HPCSERVE_SIM_FAULT_ATTEMPTS        attempts the fault applies to, e.g. "0" (default: all); the
                                     attempt is HPCSERVE_ATTEMPT, which hpcserve's runtime sets
                                     to 0 at the first start and 1, 2, .. at restarts
"""

import hmac
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn

START = time.monotonic()
TAG = ["sim"]  # log prefix (role and node rank), set by the engine's main()


class ThreadingHTTPServer(ThreadingMixIn, HTTPServer):  # http.server has it only from 3.7 on
    daemon_threads = True


def release(default):
    """The engine release this stand-in reports: HPCSERVE_SIM_VERSION, else `default`."""
    return os.environ.get("HPCSERVE_SIM_VERSION") or default


def log(msg):
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{ts} {TAG[0]}] {msg}\n")
    sys.stderr.flush()


def fatal(code, msg):
    log(msg)
    os._exit(code)


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


def split_addr(addr, flag):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        fatal(2, f"invalid {flag} {addr!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def bind_socket(host, port, what):
    """Bind (not listen): a bound, non-listening port refuses connections, which is what a
    client of a still-loading engine sees, while a bad address fails now, not after the delay."""
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


def read_msg(conn, timeout=5):
    conn.settimeout(timeout)
    try:
        msg = json.loads(conn.makefile("rb").readline(65536))
        return msg if isinstance(msg, dict) else None
    except (OSError, ValueError):
        return None


class Rendezvous:
    """One leader and its peers, as torch's TCPStore or vLLM's DP handshake: the leader binds
    `addr`, each peer connects and says hello; `check(hello, missing)` returns the keys a hello
    covers or an error string. Returns once every expected key joined; afterwards a lost
    connection ends every side (NCCL's watchdog), and a peer exits when told to."""

    def __init__(self, eng, addr, flag, what, timeout, peer_name=str,
                 shutdown_msg="Received shutdown from node rank 0; exiting"):
        self.eng = eng
        self.addr = addr
        self.flag = flag
        self.what = what
        self.timeout = timeout
        self.peer_name = peer_name   # a key as the engine's messages name it ("node rank 1")
        self.shutdown_msg = shutdown_msg

    def lead(self, expected, check, fail, timed_out):
        """`fail(text)` words a leader-side error the way the real engine does, `timed_out(
        missing)` the leader giving up on the peers that never came."""
        eng = self.eng
        host, port = split_addr(self.addr, self.flag)
        lsock = bind_socket(host, port, f"{self.what} ({self.flag})")
        try:
            lsock.listen(64)
        except OSError as e:
            fatal(1, fail(f"cannot listen on {self.addr}: {e}"))
        lsock.settimeout(0.2)
        deadline = time.monotonic() + self.timeout
        missing = set(expected)
        log(f"{self.what}: waiting for {sorted(missing)} at {self.addr}")
        while missing:
            if time.monotonic() > deadline:
                eng.exit(1, fail(timed_out(missing)))
            try:
                conn, peer_addr = lsock.accept()
            except socket.timeout:
                continue
            hello = read_msg(conn)
            if hello is None:
                log(f"ignoring a connection to {self.addr} that sent no hello")
                conn.close()
                continue
            keys = check(hello, missing)
            if isinstance(keys, str):
                send_msg(conn, {"error": keys})
                eng.exit(1, fail(keys))
            for k in keys:
                missing.discard(k)
            eng.peers[keys[0]] = conn
            log(f"{self.peer_name(keys[0])} joined from {peer_addr[0]}")
        for k, s in eng.peers.items():
            send_msg(s, {"ok": True})
            s.settimeout(None)
            apply_keepalive(s)
            threading.Thread(target=self._watch, args=(k, s), daemon=True).start()
        threading.Thread(target=self._refuse_late, args=(lsock,), daemon=True).start()
        log(f"{self.what}: all joined")

    def _refuse_late(self, lsock):
        while True:
            try:
                conn, _ = lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            if read_msg(conn) is not None:
                send_msg(conn, {"error": f"joined {self.addr} after every peer had joined"})
            conn.close()

    def _watch(self, key, sock):
        f = sock.makefile("rb")
        while True:
            try:
                line = f.readline()
            except OSError:
                line = b""
            if not line:
                time.sleep(self.eng.peer_loss_delay)
                self.eng.exit(1, f"NCCL error: remote process exited or network error: lost "
                                 f"{self.peer_name(key)}; aborting")
            try:
                self.eng.apply_peer_fault(json.loads(line))
            except ValueError:
                pass

    def join(self, hello, timeout_error, fail):
        """Connect, say hello, wait for the leader's word; then stay with it until it goes.
        `timeout_error(last)` words a connect timeout as the real engine does."""
        eng = self.eng
        host, port = split_addr(self.addr, self.flag)
        deadline = time.monotonic() + self.timeout
        last = None
        log(f"{self.what}: connecting to {self.addr} with {hello}")
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                fatal(1, timeout_error(last))
            try:
                sock = socket.create_connection((host, port), timeout=min(2.0, remaining))
                break
            except OSError as e:  # like torch's TCPStore client: retry until the timeout
                last = e
                time.sleep(0.2)
        send_msg(sock, hello)
        f = sock.makefile("rb")
        sock.settimeout(max(1.0, deadline - time.monotonic()) + 5.0)
        try:
            reply = json.loads(f.readline() or b"null")
        except socket.timeout:
            fatal(1, fail(f"timed out waiting for the other ranks at {self.addr} after "
                          f"{self.timeout:g}s"))
        except (OSError, ValueError) as e:
            fatal(1, fail(f"bad reply from {self.addr}: {e}"))
        if not isinstance(reply, dict):
            fatal(1, fail(f"the leader at {self.addr} closed the connection during init"))
        if reply.get("shutdown"):
            fatal(0, "the leader shut down during init; exiting")
        if not reply.get("ok"):
            # The leader fails first (it found the error); this side notices it going, as a
            # peer of a dead rendezvous does, so srun reports the leader's task first.
            time.sleep(eng.peer_loss_delay)
            fatal(1, f"rendezvous failed, the leader says: {reply.get('error')}")
        sock.settimeout(None)
        apply_keepalive(sock)
        eng.peers[0] = sock
        if eng.unhealthy:
            eng.tell_leader({"fault": "unhealthy", "rank": eng.rank})
        if eng.frozen.is_set():
            eng.tell_leader({"fault": "hang", "rank": eng.rank})
        log(f"{self.what}: joined {self.addr}")
        return f

    def follow(self, f):
        """A peer's life after init: exit when the leader goes, shuts down or aborts."""
        eng = self.eng
        while True:
            try:
                line = f.readline()
            except OSError:
                line = b""
            if not line:
                time.sleep(eng.peer_loss_delay)
                fatal(1, "NCCL error: lost connection to node rank 0; aborting")
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("shutdown"):
                fatal(0, self.shutdown_msg)
            if msg.get("error"):
                fatal(1, f"node rank 0 aborted: {msg['error']}")


class EngineBase:
    """Lifecycle, faults and peers of one simulated engine process (one node of an instance)."""

    def __init__(self, rank):
        self.rank = rank
        self.status = "starting"       # starting -> ready; faults and SIGTERM are flags beside it
        self.unhealthy = False
        self.frozen = threading.Event()
        self.terminating = False
        self.inflight = 0
        self.lock = threading.Lock()
        self.peers = {}                 # key -> socket (leader) / {0: socket} (peer)
        self.exiting = threading.Lock()
        self.prefill_s = env_float("HPCSERVE_SIM_PREFILL_S_PER_TOKEN", 0.0)
        self.decode_s = env_float("HPCSERVE_SIM_DECODE_S_PER_TOKEN", 0.0)
        self.init_timeout = env_float("HPCSERVE_SIM_INIT_TIMEOUT", 60.0)
        self.peer_loss_delay = env_float("HPCSERVE_SIM_PEER_LOSS_DELAY", 0.5)
        self.startup_delay = env_float("HPCSERVE_SIM_STARTUP_DELAY", 0.0)
        self.api_keys = []              # the keys a request may bear (--api-key); none: open
        self.requests = 0               # generation requests so far
        self.request_faults = {}        # "empty" / "kv-lost" -> requests answered before it
        self.slow = None                # slow fault: (monotonic time from, seconds per probe)
        # What the engine's metrics count: requests before (waiting) and in (running) decode
        # per DP rank (a request goes to rank requests % dp, as a round-robin balancer sends
        # it), tokens in and out so far, and each counter of the engine's facts table as the
        # release moves it (counters, set_facts()).
        self.dp = 1
        self.waiting_by = [0]
        self.running_by = [0]
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.facts = None
        self.counters = {}
        self.env_on = set()

    @property
    def waiting(self):
        return sum(self.waiting_by)

    @property
    def running(self):
        return sum(self.running_by)

    def set_facts(self, facts, dp=1):
        """Move counters as the release does (hpcserve_facts: each metric's `moves`): "step"
        ones with every prompt taken in and token produced, "finish" ones when a request
        ends, "env:NAME" ones only where NAME is set true, gauges never by themselves."""
        self.facts, self.dp = facts, max(1, dp)
        self.waiting_by, self.running_by = [0] * self.dp, [0] * self.dp
        self.counters = {n: 0.0 for n, m in facts["metrics"].items() if m["kind"] != "gauge"}
        for m in facts["metrics"].values():
            var = m["moves"][4:] if m["moves"].startswith("env:") else None
            if var and os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
                self.env_on.add(var)

    def local(self, rank):
        """Whether DP rank `rank`'s scheduler runs on the node that serves /metrics."""
        return True

    def _move(self, when, prompt=0, generated=0, rank=0):
        """Under self.lock: the counters the facts move `when` ("step" or "finish"), for work
        on DP rank `rank` (a scheduler's counter lives in its own node's metrics)."""
        if self.facts is None:
            return
        for name, m in self.facts["metrics"].items():
            if m.get("process") == "scheduler" and not self.local(rank):
                continue
            moves = m["moves"]
            if moves.startswith("env:"):
                moves = "step" if moves[4:] in self.env_on else "never"
            if moves != when or name not in self.counters:
                continue
            if m["kind"] == "histogram":
                self.counters[name] += 1  # one observation per step
                continue
            self.counters[name] += {"prompt": prompt, "generated": generated,
                                    "both": prompt + generated,
                                    "seconds": generated * self.decode_s}[m["counts"]]

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

    def drain_then_exit(self, msg):
        def drain():
            while True:
                with self.lock:
                    if self.inflight == 0:
                        break
                time.sleep(0.1)
            self.exit(0, msg)
        threading.Thread(target=drain, daemon=True).start()

    def start_fault(self):
        spec = os.environ.get("HPCSERVE_SIM_FAULT", "").strip()
        if not spec or not self._fault_targets_me():
            return
        parts = spec.split(":")
        try:
            self._arm(parts)
        except ValueError:
            fatal(2, f"invalid HPCSERVE_SIM_FAULT={spec!r}: expected exit:CODE:AFTER_S, "
                     "hang:AFTER_S, slow:DELAY_S[:AFTER_S], unhealthy, empty:AFTER_N or "
                     "kv-lost:AFTER_N")
        log(f"fault injection armed: {spec}")

    def _fault_targets_me(self):
        """Whether this node rank, in this attempt, is one the fault is for."""
        ranks = int_set("HPCSERVE_SIM_FAULT_RANKS", "0,2")
        attempts = int_set("HPCSERVE_SIM_FAULT_ATTEMPTS", "0,1")
        # A restarted instance is a new attempt; a fault for the first one must spare it.
        raw = os.environ.get("HPCSERVE_ATTEMPT", "").strip() or "0"
        if not raw.isdigit():
            fatal(2, f"invalid HPCSERVE_ATTEMPT={raw!r}: expected 0, 1, ..")
        if ranks and self.rank not in ranks:
            return False
        if attempts and int(raw) not in attempts:
            log(f"fault injection not armed: attempt {raw} is not one of {sorted(attempts)}")
            return False
        return True

    def _arm(self, parts):
        if parts[0] == "exit" and len(parts) == 3:
            code = int(parts[1])
            self._after(parts[2], lambda: self.fault_exit(code))
        elif parts[0] == "hang" and len(parts) == 2:
            self._after(parts[1], self.fault_hang)
        elif parts[0] == "slow" and len(parts) in (2, 3):
            delay = float(parts[1])
            if delay < 0:
                raise ValueError
            self.slow = (float("inf"), delay)  # until the signal or the time below
            self._after(parts[2] if len(parts) == 3 else "0",
                        lambda: setattr(self, "slow", (time.monotonic(), delay)))
        elif parts[0] in ("empty", "kv-lost") and len(parts) == 2:
            self.request_faults[parts[0]] = int(parts[1])
        elif parts == ["unhealthy"]:
            self.unhealthy = True
            self.tell_leader({"fault": "unhealthy", "rank": self.rank})
        else:
            raise ValueError

    def probe_delay(self):
        """Seconds a health probe waits under the slow fault (0 before it starts)."""
        if self.slow is None or time.monotonic() < self.slow[0]:
            return 0.0
        return self.slow[1]

    def count_request(self):
        """A request taken in: the DP rank it waits on."""
        with self.lock:
            rank = self.requests % self.dp
            self.requests += 1
            self.waiting_by[rank] += 1
            return rank

    def prefilled(self, prompt, rank=0):
        """A request's prompt is in: it leaves the queue and decodes."""
        with self.lock:
            self.waiting_by[rank] -= 1
            self.running_by[rank] += 1
            self.prompt_tokens += prompt
            self._move("step", prompt=prompt, rank=rank)

    def generated(self, rank=0):
        """One output token of one request."""
        with self.lock:
            self.generation_tokens += 1
            self._move("step", generated=1, rank=rank)

    def finished(self, decoding, rank=0, prompt=0, generated=0):
        """A generation request ended, answered or failed, while waiting or `decoding`, with
        `prompt` tokens in and `generated` out."""
        with self.lock:
            if decoding:
                self.running_by[rank] -= 1
                self._move("finish", prompt=prompt, generated=generated, rank=rank)
            else:
                self.waiting_by[rank] -= 1

    def counter_metrics(self, labels):
        """The facts' counters (and histograms' counts and sums) for prometheus()."""
        out = []
        for name, m in (self.facts or {"metrics": {}})["metrics"].items():
            if name not in self.counters:
                continue
            if m["kind"] == "histogram":
                out.append((name + "_count", "counter", name, [(labels, self.counters[name])]))
            else:
                total = name if name.endswith("_total") else name + "_total"
                out.append((total, "counter", name, [(labels, self.counters[name])]))
        return out

    def faulty(self, kind):
        """Whether a request fault (empty, kv-lost) applies to the request being answered."""
        after = self.request_faults.get(kind)
        return after is not None and self.requests > after

    def _after(self, when, fn):
        """Run fn WHEN seconds after process start, or once SIGUSR1 arrives (in a thread of its
        own: a hang tells the leader over a socket, which a signal handler must not do)."""
        if when == "SIGUSR1":
            signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=fn,
                                                                      daemon=True).start())
            return
        delay = float(when)
        if delay < 0:
            raise ValueError
        t = threading.Timer(max(0.0, delay - (time.monotonic() - START)), fn)
        t.daemon = True
        t.start()

    def fault_exit(self, code):
        log(f"fault injection: exiting with code {code}")
        sys.stderr.flush()
        os._exit(code)  # a crash: no goodbye to peers, they must notice the dead socket

    def fault_hang(self):
        log("fault injection: hanging (no request makes progress from now on)")
        self.frozen.set()
        self.tell_leader({"fault": "hang", "rank": self.rank})

    def tell_leader(self, msg):
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

    def loading(self, weights_line=None):
        """The simulated start-up delay: the first 60 % "loading weights", then the engine's own
        weights-loaded line (where the engine prints one: `weights_line`, given the seconds the
        load took), the rest "warming up" (compile, graph capture, KV cache)."""
        t0 = time.monotonic()
        self._sleep_until(t0 + 0.6 * self.startup_delay)
        if weights_line:
            log(weights_line(time.monotonic() - t0))
        self._sleep_until(t0 + self.startup_delay)

    @staticmethod
    def _sleep_until(deadline):
        while time.monotonic() < deadline:
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


class BadRequest(Exception):
    pass


class KVTransferError(Exception):
    pass


def int_set(name, example):
    """The integers of a comma-separated environment variable (empty: none given)."""
    raw = os.environ.get(name, "").strip()
    try:
        return {int(r) for r in raw.split(",") if r.strip()}
    except ValueError:
        fatal(2, f"invalid {name}={raw!r}: expected e.g. {example}")


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


class HandlerBase(BaseHTTPRequestHandler):
    """HTTP plumbing, and OpenAI chat/completions with streaming and usage."""

    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    engine = None  # set per server
    quiet_paths = ("/health",)

    def log_message(self, fmt, *args):
        pass

    def guarded(self, path):
        """Whether the engine's API key is asked of a request for `path` (an engine's handler
        says which, as its release does); this server's other ports ask none."""
        return False

    def parse_request(self):
        """The release's authentication, before any handler runs: with an API key set, a
        request for a guarded path without `Authorization: Bearer <key>` is answered 401
        {"error": "Unauthorized"} (vLLM's AuthenticationMiddleware, SGLang's api key
        middleware), and the connection closed: its body is never read."""
        if not BaseHTTPRequestHandler.parse_request(self):
            return False
        keys = self.engine.api_keys
        if not keys or self.command == "OPTIONS" or not self.guarded(self.path.split("?")[0]):
            return True
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and any(hmac.compare_digest(token.encode(), k.encode())
                                              for k in keys):
            return True
        self.close_connection = True
        body = json.dumps({"error": "Unauthorized"}).encode()
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        return False

    def log_request(self, code="-", size="-"):
        path = getattr(self, "path", "")  # unset when the request line was unparsable
        if path.split("?")[0] not in self.quiet_paths:
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

    def send_text(self, code, text, ctype="text/plain"):
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
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

    def health(self):
        """GET /health: under the slow fault a busy engine answers late, but answers."""
        time.sleep(self.engine.probe_delay())
        self.send_json(200 if self.healthy() else 503, None)

    def start_decode(self, prompt):
        """The request's prefill is done (`prompt` tokens): from now on it is running."""
        if not self.decoding:
            self.decoding = True
            self.prompt = prompt
            self.engine.prefilled(prompt, self.dp_rank)

    def decode_step(self):
        """One output token: it takes decode_s, and a hung engine core never makes it."""
        self.freeze_if_hung()
        time.sleep(self.engine.decode_s)
        self.freeze_if_hung()  # the hang may have come while this token was computed
        self.made += 1
        self.engine.generated(self.dp_rank)

    def healthy(self):
        eng = self.engine
        return eng.status == "ready" and not eng.terminating and not eng.unhealthy

    def count_inflight(self, fn):
        """Run a request handler counted as in flight (a graceful exit waits for it)."""
        eng = self.engine
        with eng.lock:
            eng.inflight += 1
        try:
            fn()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client (or router) went away mid-stream
        finally:
            with eng.lock:
                eng.inflight -= 1

    def answer(self, kind):
        """One generation request, its errors answered as the engine words them (error())."""
        eng = self.engine
        try:
            body = self.read_body()
            if eng.terminating or eng.status != "ready":
                return self.error(kind, 503, "server is not ready or is shutting down")
            self.counted(kind, body)
        except BadRequest as e:
            self.error(kind, 400, str(e))
        except KVTransferError as e:
            self.error(kind, 500, self.kv_failure(e))
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            self.error(kind, 400, f"malformed request: {e!r}")  # odd shapes of valid JSON

    def counted(self, kind, body):
        """generate() with the request counted as waiting, then running, until it ends; a hung
        engine core still queues a new request (the API server takes it), but never runs it."""
        eng = self.engine
        self.dp_rank = eng.count_request()
        self.decoding, self.prompt, self.made = False, 0, 0
        try:
            self.freeze_if_hung()
            self.generate(kind, body)
        finally:
            eng.finished(self.decoding, self.dp_rank, self.prompt, self.made)

    def kv_failure(self, e):
        """The message of a request whose KV never arrived."""
        log(f"ERROR: {e}")
        return str(e)

    # -- OpenAI chat and completions
    OPENAI_POSTS = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}

    def openai_post(self):
        """do_POST of an engine that serves the OpenAI generation routes only."""
        path = self.path.split("?")[0]
        if path not in self.OPENAI_POSTS:
            return self.send_json(404, {"detail": "Not Found"})
        self.count_inflight(lambda: self.answer(self.OPENAI_POSTS[path]))

    def openai_request(self, kind, body):
        """(prompt tokens, max new tokens, stream) of a chat or completion request."""
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        max_new = first_int(body.get("max_completion_tokens"), body.get("max_tokens"),
                            default=16)
        if kind == "chat":
            prompt = count_tokens(chat_prompt_text(body.get("messages")))
        else:
            prompt = count_tokens(body.get("prompt", ""))
        return prompt, max_new, bool(body.get("stream"))

    def respond(self, kind, body, rid, model, prompt, n, extra=None):
        """Generate n tokens (decode_s each) and answer as one JSON or an SSE stream; `extra`
        adds top-level fields (vLLM's kv_transfer_params) to the response."""
        if self.engine.faulty("empty"):
            log("fault injection: answering with 0 output tokens")
            n = 0
        self.start_decode(prompt)
        if body.get("stream"):
            return self.stream(kind, body, rid, model, prompt, n, extra or {})
        for _ in range(n):
            self.decode_step()
        self.send_json(200, {**self.final(kind, rid, model, prompt, n), **(extra or {})})

    def final(self, kind, rid, model, prompt, n):
        text = "".join(f" tok{i}" for i in range(n))
        usage = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
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

    def stream(self, kind, body, rid, model, prompt, n, extra):
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
        for i in range(n):
            self.decode_step()
            tok = f" tok{i}"
            self.sse(chunk({"delta": {"content": tok}} if kind == "chat" else {"text": tok}))
        self.sse({**chunk({"delta": {}} if kind == "chat" else {"text": ""}, "length"), **extra})
        if (body.get("stream_options") or {}).get("include_usage"):
            self.sse({"id": rid, "object": obj, "created": created, "model": model,
                      "choices": [], "usage": usage})
        self.end_stream()


def engine_facts(name):
    """The engine's facts table (hpcserve/engines/facts.py `name`): beside this file as
    hpcserve_facts.py in a job directory, in the package under engines/. Loaded alone: the
    package's engines/__init__ imports the rest of hpcserve."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "hpcserve_facts.py"),
                 os.path.join(here, os.pardir, "engines", "facts.py")):
        if os.path.exists(path):
            spec = importlib.util.spec_from_file_location("hpcserve_facts", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return getattr(mod, name)
    fatal(2, f"hpcserve_facts.py is missing beside {__file__}")


def prometheus(metrics):
    """Prometheus text format, as prometheus_client writes it: `metrics` holds (name, type,
    help, [(labels, value)]); a counter's name ends in _total on its # TYPE line too."""
    out = []
    for name, mtype, text, samples in metrics:
        out += [f"# HELP {name} {text}", f"# TYPE {name} {mtype}"]
        for labels, value in samples:
            lab = ",".join(f'{k}="{v}"' for k, v in labels.items())
            out.append(f"{name}{{{lab}}} {float(value)!r}")
    return "\n".join(out) + "\n"


def serve_http(eng, sock, handler):
    """Serve on an already bound socket; listening only starts here, so until then clients get
    "connection refused", as with an engine that is still loading."""
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


def self_check(eng, host, port, path):
    """Like the engines' warmup: prove the HTTP port answers from this node before "ready"."""
    host = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}{path}"
    # bearing the engine's own key, as SGLang's warmup request does
    auth = {"Authorization": f"Bearer {eng.api_keys[0]}"} if eng.api_keys else {}
    try:  # no proxy: a loopback self-check must not depend on the site's http_proxy
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(urllib.request.Request(url, headers=auth), timeout=30) as r:
            r.read()
    except OSError as e:
        eng.exit(1, f"ERROR: warmup request to {url} failed: {e}")
    eng.status = "ready"
