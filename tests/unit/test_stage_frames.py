"""The staging chain's receiving end against frames its own chain never sends (what anyone on
the network could send to a node's chain port): each is refused as the upstream's failure,
before anything is allocated for it or written outside the copy in progress."""

from __future__ import annotations

import json
import os
import socket
import threading
from types import SimpleNamespace

import pytest

from hpcserve.runtime import stage
from hpcserve.runtime import stage_cache as sc


def _receive(tmp_path, *frames: tuple[bytes, bytes], raw: bytes = b"") -> stage.Failed:
    """The frames sent from "node1" to a receiver on "node2"; the failure it raised."""
    cache = sc.Cache(str(tmp_path / "stage"), 1 << 30)
    os.makedirs(cache.dir)
    node = SimpleNamespace(cache=cache, name="m-0123456789", me="node2", log=lambda m: None,
                           spec={"source": "/models/m"})
    partial = cache.path(node.name, ".partial-1")
    os.makedirs(partial)
    a, b = socket.socketpair()

    def send() -> None:
        try:
            for k, p in frames:
                stage.send(a, k, p)
            a.sendall(raw)
        except OSError:
            pass  # the receiver refused and closed: what these tests expect of it
        finally:
            a.close()

    sender = threading.Thread(target=send)
    sender.start()
    try:
        with pytest.raises(stage.Failed) as e:
            stage._Receiver(node, b, "node1", partial, None).run()
    finally:
        b.close()
        sender.join()
    return e.value


def _files(*entries) -> tuple[bytes, bytes]:
    return b"H", json.dumps({"files": list(entries)}).encode()


def test_a_frame_longer_than_its_kind_allows_is_refused_before_it_is_read(tmp_path):
    # a header announcing 2**60 bytes of file list: refused on the header alone
    f = _receive(tmp_path / "long", raw=stage.FRAME.pack(b"H", 1 << 60))
    assert (f.blame, f.file) == ("node1", None)
    assert f.cause == f"node1 sent a frame of kind b'H' and {1 << 60} bytes", f.cause
    f = _receive(tmp_path / "unknown", raw=stage.FRAME.pack(b"X", 0))
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
    with pytest.raises(stage.BadFrame, match="leads out of the copy through a link"):
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
