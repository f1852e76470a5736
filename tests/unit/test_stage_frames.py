"""The staging chain's receiving end against frames its own chain never sends (what anyone on
the network could send to a node's chain port): each is refused as the upstream's failure,
before anything is allocated for it or written outside the copy in progress. Frames not from
this job's chain (no key, another link's) are refused by their tag, and a node's port takes
its upstream alone, whoever connected to it first."""

from __future__ import annotations

import json
import os
import socket
import threading
from types import SimpleNamespace

import pytest

from hpcserve.runtime import stage, stage_link
from hpcserve.runtime import stage_cache as sc
from hpcserve.runtime.spec import Stage


KEY = bytes(range(32))


def _receive(tmp_path, *frames: tuple[bytes, bytes], raw: bytes = b"",
             key: bytes = KEY, source: str = "/models/m") -> stage_link.Failed:
    """The frames sent from "node1" (holding `key`; the job's is KEY) to a receiver on "node2",
    then `raw` bytes; the failure it raised."""
    cache = sc.Cache(str(tmp_path / "stage"), 1 << 30)
    os.makedirs(cache.dir)
    node = SimpleNamespace(cache=cache, name="m-0123456789", me="node2", log=lambda m: None,
                           spec=Stage({"source": source, "dir": cache.dir}))
    partial = cache.path(node.name, ".partial-1")
    os.makedirs(partial)
    a, b = socket.socketpair()

    def send() -> None:
        try:
            link = stage_link.Link.connecting(a, key)
            for k, p in frames:
                link.send(k, p)
            a.sendall(raw)
        except OSError:
            pass  # the receiver refused and closed: what these tests expect of it
        finally:
            a.close()

    sender = threading.Thread(target=send)
    sender.start()
    try:
        with pytest.raises(stage_link.Failed) as e:
            stage._Receiver(node, stage_link.Link.accepting(b, KEY), "node1", partial, None).run()
    finally:
        b.close()
        sender.join()
    return e.value


def _files(*entries) -> tuple[bytes, bytes]:
    return b"H", json.dumps({"files": list(entries)}).encode()


def test_a_frame_longer_than_its_kind_allows_is_refused_before_it_is_read(tmp_path):
    # a header announcing 2**60 bytes of file list: refused on the header alone
    f = _receive(tmp_path / "long", raw=stage_link.FRAME.pack(b"H", 1 << 60))
    assert (f.blame, f.file) == ("node1", None)
    assert f.cause == f"node1 sent a frame of kind b'H' and {1 << 60} bytes", f.cause
    f = _receive(tmp_path / "unknown", raw=stage_link.FRAME.pack(b"X", 0))
    assert f.cause == "node1 sent a frame of unknown kind b'X'", f.cause


@pytest.mark.parametrize("rel", ["../escape", "ABSOLUTE", "a/../../b", "a//b", "./a", ""])
def test_a_file_path_that_leaves_the_model_directory_is_refused(tmp_path, rel):
    # An absolute path of this test's own: against a receiver without the check, the test
    # must not write anywhere but its tmp_path (run as root, "/etc/passwd" here once did).
    target = tmp_path / "outside"
    rel = str(target) if rel == "ABSOLUTE" else rel
    f = _receive(tmp_path / "run", _files([rel, 1, None]), (b"D", b"x"), (b"E", b"0" * 64),
                 (b"Z", b""))
    assert f.blame == "node1" and "not one inside the model directory" in f.cause, f.cause
    assert not target.exists()
    assert sorted(os.listdir(tmp_path / "run" / "stage")) == ["m-0123456789.partial-1"]
    assert os.listdir(tmp_path / "run" / "stage" / "m-0123456789.partial-1") == []


def test_a_file_list_of_the_wrong_shape_is_refused(tmp_path):
    for entry in (["w.bin", -1, None], ["w.bin", 1, "not-a-hash"], ["w.bin", "1", None]):
        f = _receive(tmp_path / str(len(os.listdir(tmp_path))), _files(entry))
        assert f.blame == "node1" and "not [path, size, SHA-256]" in f.cause, f.cause


def test_a_link_planted_in_the_copy_in_progress_is_not_followed(tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    cache_dir = tmp_path / "stage"
    # the receiver makes the partial directory; the link is planted inside it before the data
    frames = (_files(["sub/w.bin", 1, None]), (b"D", b"x"), (b"E", b"0" * 64), (b"Z", b""))
    real_makedirs = os.makedirs

    def plant(path, *a, **k):
        if path.endswith(".partial-1") and not os.path.exists(path):
            real_makedirs(path, *a, **k)
            os.symlink(outside, os.path.join(path, "sub"))
            return None
        return real_makedirs(path, *a, **k)

    monkeypatch.setattr(os, "makedirs", plant)
    with pytest.raises(stage_link.BadFrame, match="leads out of the copy through a link"):
        _receive(tmp_path, *frames)
    monkeypatch.undo()
    assert list(outside.iterdir()) == [] and cache_dir.is_dir()


def test_a_malformed_abort_is_the_senders_failure_not_a_crash(tmp_path):
    for payload in (b"not json", b'{"node": 1, "file": null, "cause": "x"}', b"{}"):
        f = _receive(tmp_path / str(len(os.listdir(tmp_path))), (b"A", payload))
        assert (f.blame, f.file, f.cause) == ("node1", None, "node1 sent a malformed abort frame")
    # a well-formed one still blames the node it names (the reader, up the chain)
    f = _receive(tmp_path / "ok", (b"A", json.dumps({"node": "node0", "file": "w.bin",
                                                       "cause": "gone"}).encode()))
    assert (f.blame, f.file, f.cause) == ("node0", "w.bin", "gone")


def test_the_hash_frame_must_be_a_sha256(tmp_path):
    f = _receive(tmp_path, _files(["w.bin", 1, None]), (b"D", b"x"), (b"E", b"z" * 64))
    assert f.blame == "node1" and f.file == "w.bin" and "SHA-256 was due" in f.cause, f.cause


def test_a_frame_without_the_jobs_key_is_refused_before_anything_is_written(tmp_path):
    # well-formed, and tagged, but under another key: what anyone on the network can send
    f = _receive(tmp_path, _files(["w.bin", 1, None]), (b"D", b"x"), key=bytes(32))
    assert (f.blame, f.file) == ("node1", None)
    assert f.cause == "node1 sent a frame of kind b'H' whose tag does not check: not from " \
                      "this job's chain", f.cause
    assert os.listdir(tmp_path / "stage" / "m-0123456789.partial-1") == []


def test_frames_of_another_link_replayed_do_not_check(tmp_path):
    """The same key, frames recorded on one link and sent on another (its own nonce): refused,
    and so is a frame dropped or sent twice within a link (they are numbered)."""
    a, b = socket.socketpair()
    with a, b:
        stage_link.Link.accepting(b, KEY)
        recorded = stage_link.Link.connecting(a, KEY)
        recorded.sock = _Tape()
        recorded.send(*_files(["w.bin", 1, None]))
        recorded.send(b"D", b"x")
    tape = recorded.sock.data
    f = _receive(tmp_path / "replayed", raw=tape)
    assert "whose tag does not check" in f.cause, f.cause
    # within one link: the second frame sent first (as if the first were dropped)
    a, b = socket.socketpair()
    with a, b:
        got = stage_link.Link.accepting(b, KEY)
        sender = stage_link.Link.connecting(a, KEY)
        sender.seq = 1
        sender.send(b"Z", b"")
        with pytest.raises(stage_link.BadFrame, match="tag does not check"):
            got.recv()


class _Tape:
    def __init__(self):
        self.data = b""

    def sendall(self, b: bytes) -> None:
        self.data += bytes(b)


def test_the_chain_port_takes_its_upstream_alone_whoever_connected_first(tmp_path):
    """Before the upstream: one connection that sends nothing, one that sends junk, one whose
    hello is under another key, one that names another node. Each is refused in a line that
    names its address, and the upstream's connection is the one taken."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    addr = listener.getsockname()
    logs: list[str] = []
    node = object.__new__(stage.Node)
    node.key, node.log = KEY, logs.append
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(got=node._accept(listener, "node1")))
    t.start()
    attackers = [socket.create_connection(addr) for _ in range(4)]
    attackers[1].sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(64))
    for sock, (key, name) in zip(attackers[2:], [(bytes(32), "node1"), (KEY, "node9")]):
        stage_link.Link.connecting(sock, key).send(b"O", name.encode())
    for sock in attackers[1:]:  # each refused, and so logged, before the upstream connects
        sock.settimeout(30)
        try:
            while sock.recv(4096):
                pass
        except ConnectionResetError:  # closed with the junk unread
            pass
    upstream = socket.create_connection(addr)
    link = stage_link.Link.connecting(upstream, KEY)
    link.send(b"O", b"node1")
    link.send(b"Z", b"")
    t.join(30)
    try:
        conn, got = result["got"]
        assert conn.getpeername() == upstream.getsockname()  # the upstream's, by its port
        assert got.recv() == (b"Z", b"")
        refused = [ln for ln in logs if ln.startswith("refused a connection from 127.0.0.1:")]
        ports = {a.getsockname()[1] for a in attackers[1:]}
        assert {int(ln.split()[4].split(":")[1]) for ln in refused} == ports, logs
        assert any("whose tag does not check" in ln for ln in refused), logs
        assert any("where node1's hello was due" in ln for ln in refused), logs
        conn.close()
    finally:
        for s in attackers + [upstream, listener]:
            s.close()


def test_the_staging_key_is_refused_unless_only_its_owner_can_read_it(tmp_path):
    path = str(tmp_path / "key")
    stage_link.new_key(path)
    assert os.stat(path).st_mode & 0o777 == 0o600 and len(stage_link.read_key(path)) == 32
    with pytest.raises(FileExistsError):
        stage_link.new_key(path)  # never written into a file that was there
    os.chmod(path, 0o640)
    with pytest.raises(sc.StageError, match="that only it can read .*mode 640"):
        stage_link.read_key(path)
    os.chmod(path, 0o600)
    link = str(tmp_path / "link")
    os.symlink(path, link)
    with pytest.raises(sc.StageError, match="cannot read the job's staging key"):
        stage_link.read_key(link)


def test_a_node_with_its_own_manifest_takes_names_sizes_and_hashes_from_it(tmp_path):
    """Where the node read the model's manifest itself, the upstream's list must name the same
    files and sizes, and the copy is checked against the hashes this node read, not the
    wire's (which here claims the hash of what it sends)."""
    import hashlib
    src = tmp_path / "model"
    src.mkdir()
    want = hashlib.sha256(b"y").hexdigest()
    (src / sc.MANIFEST).write_text(json.dumps({"version": 1, "files": [["w.bin", 1, want]]}))
    f = _receive(tmp_path / "other", _files(["x.bin", 1, None]), source=str(src))
    assert "differs from the model's manifest as this node read it" in f.cause, f.cause
    sent = hashlib.sha256(b"x").hexdigest()
    f = _receive(tmp_path / "hash", _files(["w.bin", 1, sent]), (b"D", b"x"),
                 (b"E", sent.encode()), source=str(src))
    assert (f.blame, f.file) == ("node2", "w.bin") and want[:16] in f.cause, f.cause
