"""Weight staging (model.stage): before any engine starts, every node of the job gets the model's
files in its node-local stage cache, and the shared path is read once per job.

Node side (`python3 -m hpcserve_runtime stage JOB_DIR --component C`, one task per node in the
stage step): every node says whether it is warm (a complete copy is there), cold (it needs one:
it listens for it) or busy (another job holds its stage lock); the cold nodes form a chain in
the order of run/stage/chain, whose first node reads the shared path and each node writes what
it receives and passes it to the next over TCP (a pipeline: the file system is read once, every
link carries the model once, and the nodes write at the same time). Every node hashes what it
writes and checks it against the manifest. A busy node waits for the other job's copy. The
choice of a chain over an MPI broadcast is measured in bench/bench_stage.py.

The chain's ports are open to anyone on the network, so every link is authenticated with the
job's own key (run/stage/key, 0600, made for each try by the batch side): the receiver sends a
fresh nonce, and every frame after it carries a keyed BLAKE2b tag over its number, header and
payload under a key derived from both, so no frame can be forged, replayed from another link,
dropped or reordered. A connection whose hello fails is closed and logged, and the node goes on
listening for its upstream.

Batch side (Staging): runs the step, reads every node's report, records state.json's stage and
ends the job naming node, file and cause when a node failed, before any engine starts.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import os
import queue
import re
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

from .contract import SpecError, load_spec
from .model_dir import MAX_FILES
from .stage_cache import Cache, StageError, check_listing, list_files, load_manifest, \
    plain_name, save_manifest

CHUNK = 1 << 22          # bytes per data frame: large enough for the disks, small for the pipe
FRAME = struct.Struct(">cQ")
PEER_TIMEOUT = 120.0     # s: a peer that sends nothing for this long is taken for dead
HELLO_TIMEOUT = 10.0     # s: a connection that has not proved itself by then is closed
KEY_BYTES, NONCE_BYTES, TAG_BYTES = 32, 16, 32
STATUS_TIMEOUT = 120.0   # s: every node of the job says warm, cold or busy within this


# ------------------------------------------------------------------------------ on each node

class Failed(Exception):
    """This node's staging failed; `blame` is the node where it began (this one, or a peer)."""

    def __init__(self, blame: str, file: str | None, cause: str):
        super().__init__(cause)
        self.blame, self.file, self.cause = blame, file, cause


def recv_exact(sock, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("the connection closed")
        got += k
    return bytes(buf)


# The frames of the chain and the most bytes each may carry: the sender's hello (its node name),
# the file list (MAX_FILES entries), a chunk of data, a file's SHA-256 in hex, an abort, the
# end. A frame of another kind, or a longer one, is refused before anything is allocated for it.
LIMITS = {b"O": 255, b"H": 64 << 20, b"D": CHUNK, b"E": 64, b"A": 64 << 10, b"Z": 0}
HEX64 = re.compile(r"[0-9a-f]{64}")


class BadFrame(ValueError):
    """A frame this chain never sends: of no known kind, too long, not what its kind holds, or
    not from this job's chain (its tag does not check)."""


class Link:
    """One link of the chain, either end: frames tagged under a key derived from the job's key
    and the receiver's nonce, and numbered, so that only a holder of the job's key can send
    them, and none can be replayed from another link, dropped or reordered."""

    def __init__(self, sock, key: bytes, nonce: bytes):
        self.sock = sock
        self.key = hashlib.blake2b(nonce, key=key, digest_size=32,
                                   person=b"hpcserve-stage").digest()
        self.seq = 0

    @classmethod
    def accepting(cls, sock, key: bytes) -> "Link":
        """The receiving end: a fresh nonce sent first, which the sender's tags must cover."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        sock.sendall(nonce)
        return cls(sock, key, nonce)

    @classmethod
    def connecting(cls, sock, key: bytes) -> "Link":
        return cls(sock, key, recv_exact(sock, NONCE_BYTES))

    def _tag(self, head: bytes, payload: bytes) -> bytes:
        m = hashlib.blake2b(struct.pack(">Q", self.seq), key=self.key, digest_size=TAG_BYTES)
        m.update(head)
        m.update(payload)
        self.seq += 1
        return m.digest()

    def send(self, kind: bytes, payload: bytes) -> None:
        head = FRAME.pack(kind, len(payload))
        tag = self._tag(head, payload)
        if len(payload) < 65536:
            self.sock.sendall(head + payload + tag)
        else:  # a data chunk: not copied once more to join its header and tag
            self.sock.sendall(head)
            self.sock.sendall(payload)
            self.sock.sendall(tag)

    def recv(self) -> tuple:
        head = recv_exact(self.sock, FRAME.size)
        kind, n = FRAME.unpack(head)
        if n > LIMITS.get(kind, -1):
            raise BadFrame(f"a frame of kind {kind!r} and {n} bytes" if kind in LIMITS
                           else f"a frame of unknown kind {kind!r}")
        payload = recv_exact(self.sock, n)
        if not hmac.compare_digest(recv_exact(self.sock, TAG_BYTES), self._tag(head, payload)):
            raise BadFrame(f"a frame of kind {kind!r} whose tag does not check: not from "
                           "this job's chain")
        return kind, payload


def new_key(path: str) -> None:
    """The job's staging key, readable by its owner alone, in a file that did not exist."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(KEY_BYTES))


def read_key(path: str) -> bytes:
    """The job's staging key; refused unless it is a file of this user's that nobody else
    can read (anyone else's key would let its maker into the chain)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise StageError(None, f"cannot read the job's staging key {path}: {e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        key = f.read(KEY_BYTES + 1)
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or len(key) != KEY_BYTES:
        raise StageError(None, f"the job's staging key {path} is not a {KEY_BYTES}-byte file "
                               f"of uid {os.getuid()} that only it can read (uid "
                               f"{st.st_uid}, mode {st.st_mode & 0o777:o}): refused")
    return key


def safe_rel(rel) -> str:
    """A file's path relative to the model directory, as the file list gives it: refused
    (BadFrame) if it could name anything outside the copy (absolute, `..`, `.` or empty parts,
    NUL)."""
    if not isinstance(rel, str) or not all(plain_name(part) for part in rel.split("/")):
        raise BadFrame(f"a file path that is not one inside the model directory: {rel!r}")
    return rel


def file_list(payload: bytes) -> list:
    """The H frame's [[path, size, SHA-256 or None]], every entry of the types it must be."""
    try:
        files = json.loads(payload)["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise BadFrame(f"a file list that is not one: {e}") from None
    if not isinstance(files, list) or len(files) > MAX_FILES:
        raise BadFrame("a file list that is not a list of at most "
                       f"{MAX_FILES} files")
    for f in files:
        if not (isinstance(f, list) and len(f) == 3 and type(f[1]) is int and f[1] >= 0
                and (f[2] is None or isinstance(f[2], str) and HEX64.fullmatch(f[2]))):
            raise BadFrame(f"a file list entry that is not [path, size, SHA-256]: {f!r:.200}")
        safe_rel(f[0])
    return files


class Node:
    """One node's part in the stage step."""

    def __init__(self, job_dir: str, component: int):
        self.dir = job_dir
        plan = load_spec(job_dir)
        self.spec = plan["stage"]
        self.me = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        self.cache = Cache(self.spec["dir"], self.spec["max_bytes"])
        self.name = self.spec["name"]
        self.run = os.path.join(job_dir, "run", "stage")
        with open(os.path.join(self.run, "chain")) as f:
            self.chain = [ln.split() for ln in f if ln.strip()]  # name ip
        self.until = time.time() + _seconds(plan["time_limit"])
        self.read_shared = 0
        self.t0 = time.time()

    def log(self, msg: str) -> None:
        sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {self.me}: {msg}\n")
        sys.stderr.flush()

    def main(self) -> int:
        lock = None
        try:
            self.key = read_key(os.path.join(self.run, "key"))
            lock, outcome = self._stage()
            self.cache.add_user(self.name, self.job_id, self.until)
            self.cache.touch(self.name)
            self._report(outcome)
            return 0
        except Failed as e:
            self._report("failed", file=e.file, detail=e.cause, blame=e.blame)
        except BadFrame as e:  # a path of the file list that would leave the copy here
            self._report("failed", file=None, detail=str(e), blame=self.me)
        except (StageError, OSError) as e:
            f = getattr(e, "file", None)
            self._report("failed", file=f, detail=getattr(e, "cause", None) or repr(e),
                         blame=self.me)
        finally:
            if lock is not None:
                lock.close()
        return 1

    def _stage(self) -> tuple:
        lock = self.cache.try_lock(self.name)
        if lock is not None and self.cache.warm(self.name, None):
            self._status("warm")
            return lock, "warm"
        if lock is None:
            self._status("busy")
            return self._after_other_job()
        listener = socket.socket()
        try:
            listener.bind((self._my_ip(), 0))
            listener.listen(16)
            self._status(f"cold {listener.getsockname()[1]}")
            cold = self._cold_chain()
            k = [n for n, _ in cold].index(self.me)
            nxt = cold[k + 1] if k + 1 < len(cold) else None
            if k == 0:
                self._copy(None, nxt)
            else:
                self._copy((listener, cold[k - 1][0]), nxt)
        finally:
            listener.close()
        return lock, "copied"

    def _after_other_job(self) -> tuple:
        """Another job is staging this model here: its copy, once it released the lock; if it
        left none (it failed), this node reads the shared path itself."""
        lock = self.cache.lock(self.name, self.until)
        if self.cache.warm(self.name, None):
            return lock, "waited"
        self.log("the other job left no complete copy: reading the shared path here")
        self._copy(None, None)
        return lock, "copied"

    def _my_ip(self) -> str:
        return next(ip for n, ip in self.chain if n == self.me)

    def _status(self, words: str) -> None:
        d = os.path.join(self.run, "status")
        os.makedirs(d, exist_ok=True)
        _write(os.path.join(d, self.me), words + "\n")
        self.log(f"status {words}")

    def _cold_chain(self) -> list:
        """[(name, address:port)] of the cold nodes, in chain order, once every node said."""
        d = os.path.join(self.run, "status")
        deadline = time.time() + STATUS_TIMEOUT
        while True:
            said = {}
            for n, ip in self.chain:
                try:
                    with open(os.path.join(d, n)) as f:
                        said[n] = f.read().split()
                except OSError:
                    pass
            if len(said) == len(self.chain) and all(said.values()):
                return [(n, (ip, int(said[n][1]))) for n, ip in self.chain
                        if said[n][0] == "cold"]
            if time.time() > deadline:
                missing = [n for n, _ in self.chain if n not in said]
                raise Failed(missing[0], None, f"{', '.join(missing)} did not say whether it "
                                               f"needs a copy within {STATUS_TIMEOUT:g} s")
            time.sleep(0.02)

    # -- the copy
    def _copy(self, upstream, nxt) -> None:
        """Receive the model (from the shared path, or from `upstream`), write it to a partial
        directory, pass it on to `nxt`, check it, and install it."""
        # new, of a name nobody knew beforehand, this user's alone (0700): never a directory
        # another user made at the name a job id predicts
        partial = tempfile.mkdtemp(prefix=f"{self.name}.partial-{self.job_id}-",
                                   dir=self.cache.dir)
        down = self._connect(nxt) if nxt else None
        try:
            if upstream is None:
                manifest = self._read_shared(partial, down)
            else:
                manifest = self._receive(upstream, partial, down)
            self.cache.install(self.name, partial, manifest)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        finally:
            if down is not None:
                down.close()

    def _connect(self, nxt):
        name, addr = nxt
        try:
            s = socket.create_connection(addr, timeout=PEER_TIMEOUT)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = Link.connecting(s, self.key)
            link.send(b"O", self.me.encode())
        except (OSError, EOFError) as e:
            raise Failed(name, None, f"cannot connect to {name} at {addr[0]}:{addr[1]}: {e}")
        return _Peer(link, name, self.me)

    def _read_shared(self, partial: str, down) -> dict:
        """The reader: the shared path once, each file hashed as it is read, against the
        manifest (computed here, once, where there is none)."""
        src = self.spec["source"]
        manifest = load_manifest(src, self.spec["dir"], self.name)
        try:
            listing = list_files(src)
        except OSError as e:
            raise Failed(self.me, None, f"cannot list {src}: {e}")
        if manifest is not None:
            self._checked(down, lambda: check_listing(listing, manifest, src))
        files = manifest["files"] if manifest else [[rel, size, None] for rel, size in listing]
        self.cache.make_room(self.name, sum(f[1] for f in files), self.log)
        if down:
            down.send(b"H", json.dumps({"files": files}).encode())
        out = []
        for rel, size, want in files:
            h = hashlib.sha256()
            with open(os.path.join(src, rel), "rb") as f, _out(partial, rel) as w:
                for block in iter(lambda: f.read(CHUNK), b""):
                    self.read_shared += len(block)
                    h.update(block)
                    w.write(block)
                    if down:
                        down.send(b"D", block)
            got = h.hexdigest()
            if want is not None and got != want:
                self._checked(down, lambda: _raise(StageError(
                    rel, f"SHA-256 {got[:16]}... read from the shared path {src} differs "
                         f"from the manifest's {want[:16]}... (corrupted or changed)")))
            if down:
                down.send(b"E", got.encode())
            out.append([rel, size, got])
        if down:
            down.send(b"Z", b"")
        manifest = manifest or {"version": 1, "source": src, "files": out}
        if not load_manifest(src, self.spec["dir"], self.name):
            where = save_manifest(manifest, src, self.spec["dir"], self.name)
            self.log(f"manifest written to {where}")
        return manifest

    def _checked(self, down, check) -> None:
        """A check of the reader's: its failure goes down the chain before it ends this node."""
        try:
            check()
        except StageError as e:
            if down:
                down.abort(self.me, e.file, e.cause)
            raise Failed(self.me, e.file, e.cause)

    def _receive(self, upstream, partial: str, down) -> dict:
        listener, up_name = upstream
        conn, link = self._accept(listener, up_name)
        try:
            return _Receiver(self, link, up_name, partial, down).run()
        finally:
            conn.close()

    def _accept(self, listener, up_name: str) -> tuple:
        """The upstream's connection: the first whose hello proves it holds the job's key and
        names `up_name`. Anyone else's is closed and logged, each in a thread of its own (one
        that sends nothing holds up nobody), while this node goes on listening."""
        proved: queue.Queue = queue.Queue()
        deadline = time.time() + PEER_TIMEOUT
        listener.settimeout(0.05)
        while proved.empty():
            if time.time() > deadline:
                raise Failed(up_name, None, f"{up_name} did not connect within "
                                            f"{PEER_TIMEOUT:g} s")
            try:
                conn, addr = listener.accept()
            except socket.timeout:  # TimeoutError from 3.10; its old name on older nodes
                continue
            threading.Thread(target=self._hello, args=(conn, addr, up_name, proved),
                             name="hpcserve-stage-hello", daemon=True).start()
        return proved.get()

    def _hello(self, conn, addr, up_name: str, proved: queue.Queue) -> None:
        try:
            conn.settimeout(HELLO_TIMEOUT)
            link = Link.accepting(conn, self.key)
            kind, payload = link.recv()
            if (kind, payload) != (b"O", up_name.encode()):
                raise BadFrame(f"a {kind!r} frame where {up_name}'s hello was due")
        except (OSError, EOFError, BadFrame) as e:
            self.log(f"refused a connection from {addr[0]}:{addr[1]} to the chain port: {e}")
            conn.close()
            return
        conn.settimeout(PEER_TIMEOUT)
        proved.put((conn, link))

    def _report(self, outcome: str, **more) -> None:
        d = os.path.join(self.run, "report")
        os.makedirs(d, exist_ok=True)
        rep = {"node": self.me, "outcome": outcome, "read_shared": self.read_shared,
               "took_s": round(time.time() - self.t0, 3),
               **{k: v for k, v in more.items() if v is not None}}
        _write(os.path.join(d, self.me + ".json"), json.dumps(rep))
        self.log(f"{outcome}" + (f": {more.get('file') or ''} {more.get('detail')}"
                                 if outcome == "failed" else ""))


class _Peer:
    """The next node of the chain; a failure to send names it."""

    def __init__(self, link: Link, name: str, me: str):
        self.link, self.name, self.me = link, name, me

    def send(self, kind: bytes, payload: bytes) -> None:
        try:
            self.link.send(kind, payload)
        except OSError as e:
            raise Failed(self.name, None, f"sending to {self.name} failed: {e}")

    def abort(self, node: str, file: str | None, cause: str) -> None:
        try:
            self.link.send(b"A", json.dumps({"node": node, "file": file,
                                             "cause": cause}).encode())
        except OSError:
            pass

    def close(self) -> None:
        self.link.sock.close()


class _Receiver:
    """A node after the first: frames from upstream written, hashed and passed on."""

    def __init__(self, node: Node, link: Link, up_name: str, partial: str, down):
        self.node, self.link, self.up, self.partial, self.down = node, link, up_name, partial, down

    def frame(self) -> tuple:
        try:
            kind, payload = self.link.recv()
        except (OSError, EOFError) as e:
            raise Failed(self.up, None, f"receiving from {self.up} failed: {e}")
        except BadFrame as e:
            raise Failed(self.up, None, f"{self.up} sent {e}")
        if kind == b"A":
            node, file, cause = _abort(payload, self.up)
            if self.down:
                self.down.abort(node, file, cause)
            raise Failed(node, file, cause)
        if self.down:
            self.down.send(kind, payload)
        return kind, payload

    def run(self) -> dict:
        kind, payload = self.frame()
        if kind != b"H":
            raise Failed(self.up, None, f"{self.up} sent {kind!r} where the file list was due")
        try:
            files = self._own(file_list(payload))
        except BadFrame as e:
            raise Failed(self.up, None, f"{self.up} sent {e}")
        self.node.cache.make_room(self.node.name, sum(f[1] for f in files), self.node.log)
        out = []
        for rel, size, want in files:
            h = hashlib.sha256()
            with _out(self.partial, rel) as w:
                kind, payload = self.frame()
                while kind == b"D":
                    h.update(payload)
                    w.write(payload)
                    kind, payload = self.frame()
            if kind != b"E" or not HEX64.fullmatch(payload.decode("ascii", "replace")):
                raise Failed(self.up, rel, f"{self.up} sent {kind!r} where the file's "
                                           "SHA-256 was due")
            got, sent = h.hexdigest(), payload.decode()
            if got != (want or sent):
                raise Failed(self.node.me, rel, f"SHA-256 of the copy written here {got[:16]}... "
                                                f"differs from the manifest's "
                                                f"{(want or sent)[:16]}...")
            out.append([rel, size, got])
        kind, _ = self.frame()
        if kind != b"Z":
            raise Failed(self.up, None, f"{self.up} sent {kind!r} where the end was due")
        return {"version": 1, "source": self.node.spec["source"], "files": out}

    def _own(self, files: list) -> list:
        """The file list as this node's own manifest of the model has it, where it read one
        (its names, sizes and hashes, not the wire's): the list sent must name the same files
        and sizes. With none yet (the model's first staging), the list of the authenticated
        upstream, which hashed what it read."""
        spec = self.node.spec
        own = load_manifest(spec["source"], spec["dir"], self.node.name)
        if own is None:
            return files
        try:
            mine = file_list(json.dumps({"files": own["files"]}).encode())
        except BadFrame as e:
            raise Failed(self.node.me, None, f"this node's manifest of the model: {e}") from None
        if [f[:2] for f in mine] != [f[:2] for f in files]:
            raise BadFrame("a file list that differs from the model's manifest as this node "
                           "read it")
        return mine


@contextlib.contextmanager
def _out(partial: str, rel: str):
    """A new file at `rel` inside the copy in progress, never through a link (a path that
    leaves `partial`, or a file already there, is refused), on disk once its block ends."""
    path = os.path.join(partial, safe_rel(rel))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.commonpath([os.path.realpath(os.path.dirname(path)),
                           os.path.realpath(partial)]) != os.path.realpath(partial):
        raise BadFrame(f"a file path that leads out of the copy through a link: {rel!r}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o644)
    with os.fdopen(fd, "wb") as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def _abort(payload: bytes, up: str) -> tuple:
    """An A frame's (node, file, cause); a malformed one is the sender's failure."""
    try:
        a = json.loads(payload)
        node, file, cause = a["node"], a["file"], a["cause"]
    except (ValueError, KeyError, TypeError):
        return up, None, f"{up} sent a malformed abort frame"
    if not (isinstance(node, str) and isinstance(cause, str)
            and (file is None or isinstance(file, str))):
        return up, None, f"{up} sent a malformed abort frame"
    return node, file, cause


def _raise(e: Exception) -> None:
    raise e


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _seconds(limit: str) -> float:
    """Slurm's [D-]HH:MM:SS in seconds."""
    days, _, hms = limit.rpartition("-")
    h, m, s = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def main(argv: list) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hpcserve_runtime stage")
    ap.add_argument("job_dir")
    ap.add_argument("--component", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        node = Node(a.job_dir, a.component)
    except SpecError as e:  # one line in the step's log; the batch side reports no copy here
        sys.stderr.write(f"hpcserve_runtime stage: {e}\n")
        return 2
    return node.main()


# ------------------------------------------------------------------------- on the batch host

class Staging:
    def __init__(self, job):
        self.job = job
        self.procs: dict = {}

    def run(self, found: dict) -> None:
        """The stage step on every node of the job; returns once each has a complete copy,
        raises Stop naming node, file and cause where one has not."""
        job, spec = self.job, self.job.plan["stage"]
        run = os.path.join(job.dir, "run", "stage")
        shutil.rmtree(run, ignore_errors=True)   # an earlier try's statuses say nothing now
        os.makedirs(run, mode=0o700)
        new_key(os.path.join(run, "key"))        # this try's own: no earlier link's frame checks
        chain = list(dict.fromkeys((n[0], n[1]) for c in sorted(found) for n in found[c]))
        _write(os.path.join(run, "chain"), "".join(f"{n} {ip}\n" for n, ip in chain))
        t0 = time.time()
        job.log(f"stage: start, {spec['source']} to {spec['path']} on {len(chain)} node(s)")
        for c in job.plan["components"]:
            i = c["index"]
            with open(os.path.join(job.dir, "logs", f"stage-{i}.log"), "ab") as log:
                self.procs[i] = subprocess.Popen(
                    ["bash", os.path.join(job.dir, "steps", f"stage-{i}.sh")],
                    stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                    env={**os.environ, **job.allocation.env(i)})
        try:
            self._wait()
        finally:
            self.stop()
        self._judge([n for n, _ in chain], t0)

    def _wait(self) -> None:
        while any(p.poll() is None for p in self.procs.values()):
            self.job.check()
            time.sleep(0.05)

    def _judge(self, nodes: list, t0: float) -> None:
        from .failures import Stop
        job, spec = self.job, self.job.plan["stage"]
        reports = {n: _read_json(os.path.join(job.dir, "run", "stage", "report", n + ".json"))
                   for n in nodes}
        took = round(time.time() - t0, 3)
        record = {"path": spec["path"], "took_s": took,
                  "reader": next((n for n, r in reports.items() if r and r["read_shared"]), None),
                  "shared_bytes_read": sum(r["read_shared"] for r in reports.values() if r),
                  "model_bytes": _model_bytes(spec),
                  "nodes": {n: {k: r[k] for k in ("outcome", "read_shared", "took_s", "detail")
                                if k in r} if r else {"outcome": "failed",
                                                      "detail": "no report from this node"}
                            for n, r in reports.items()}}
        job.state.update(stage=record)
        bad = _root_failure(nodes, reports)
        if bad:
            node, rep = bad
            job.log(f"stage: failed on {node}: {rep.get('file') or ''} {rep['detail']}")
            where = f"{rep['file']} on {node}" if rep.get("file") else node
            raise Stop("failed", f"staging failed: {where}: {rep['detail']}",
                       {"step": "stage", "role": None, "instance": None, "node": node,
                        "reason": "staging failed", "file": rep.get("file"),
                        "detail": rep["detail"], "log": "logs/stage-0.log"})
        outcomes = ", ".join(f"{n} {r['outcome']}" for n, r in reports.items())
        job.log(f"stage: end, {took:.2f} s ({outcomes}; {record['shared_bytes_read']} bytes "
                "read from the shared path)")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def _root_failure(nodes: list, reports: dict):
    """(node, report) of the failure the others follow from: a node that blames itself (the
    reader that found a corrupted file, a node whose disk failed), else the first failed."""
    failed = [(n, reports[n] or {"outcome": "failed", "detail": "no report from this node",
                                 "blame": n}) for n in nodes
              if not reports[n] or reports[n]["outcome"] == "failed"]
    for n, r in failed:
        if r.get("blame") == n:
            return n, r
    return failed[0] if failed else None


def _model_bytes(spec: dict) -> int:
    try:
        return sum(size for _, size in list_files(spec["source"]))
    except (OSError, StageError):
        return 0


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
