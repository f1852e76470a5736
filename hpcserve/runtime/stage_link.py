"""The staging chain's wire (model.stage): the authenticated link between two nodes of the
chain, the frames it carries and the most each may hold, the job's staging key, the file list a
frame names and where each file of it may be written.

The chain's ports are open to anyone on the network, so every link is authenticated with the
job's own key (run/stage/key, 0600, made for each try by the batch side): the receiver sends a
fresh nonce, and every frame after it carries a keyed BLAKE2b tag over its number, header and
payload under a key derived from both, so no frame can be forged, replayed from another link,
dropped or reordered.

Apart from the node's part in the step (stage.py) because this is what anyone on the network
can reach: what a frame may be is decided here alone, and tested alone
(tests/unit/test_stage_frames.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import struct

from .model_dir import MAX_FILES
from .stage_cache import StageError, plain_name

CHUNK = 1 << 22          # bytes per data frame: large enough for the disks, small for the pipe
FRAME = struct.Struct(">cQ")
KEY_BYTES, NONCE_BYTES, TAG_BYTES = 32, 16, 32


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
