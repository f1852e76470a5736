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

Every link is authenticated with the job's own key (stage_link.py). A connection whose hello
fails is closed and logged, and the node goes on listening for its upstream.

A link's frames, its key and the file list (stage_link.py) are apart from this node's part: they
are what anyone on the network can reach. The batch side, which runs the step and judges the
nodes' reports, is stage_batch.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
import time

from .contract import SpecError
from .spec import read as read_spec
from .stage_cache import Cache, StageError, check_listing, list_files, load_manifest, \
    save_manifest
from .stage_link import CHUNK, HEX64, BadFrame, Failed, Link, _abort, _out, _Peer, file_list, \
    read_key

PEER_TIMEOUT = 120.0     # s: a peer that sends nothing for this long is taken for dead
HELLO_TIMEOUT = 10.0     # s: a connection that has not proved itself by then is closed
STATUS_TIMEOUT = 120.0   # s: every node of the job says warm, cold or busy within this


# ------------------------------------------------------------------------------ on each node

class Node:
    """One node's part in the stage step."""

    def __init__(self, job_dir: str, component: int):
        self.dir = job_dir
        plan = read_spec(job_dir)
        self.spec = plan.stage
        self.me = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        self.cache = Cache(self.spec.dir, self.spec.max_bytes)
        self.name = self.spec.name
        self.run = os.path.join(job_dir, "run", "stage")
        with open(os.path.join(self.run, "chain")) as f:
            self.chain = [ln.split() for ln in f if ln.strip()]  # name ip
        self.until = time.time() + _seconds(plan.time_limit)
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
        src = self.spec.source
        manifest = load_manifest(src, self.spec.dir, self.name)
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
        if not load_manifest(src, self.spec.dir, self.name):
            where = save_manifest(manifest, src, self.spec.dir, self.name)
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
        return {"version": 1, "source": self.node.spec.source, "files": out}

    def _own(self, files: list) -> list:
        """The file list as this node's own manifest of the model has it, where it read one
        (its names, sizes and hashes, not the wire's): the list sent must name the same files
        and sizes. With none yet (the model's first staging), the list of the authenticated
        upstream, which hashed what it read."""
        spec = self.node.spec
        own = load_manifest(spec.source, spec.dir, self.node.name)
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
