"""ownport's listening sockets through sock_diag (netlink) against /proc/net/tcp{,6}, the same
kernel's other answer: the same inodes, listeners only, IPv4 and IPv6, and /proc/net when netlink
is refused or lists no listener where /proc/net shows some."""

from __future__ import annotations

import os
import socket

from hpcserve.runtime import ownport


def _listener(family: int, host: str) -> socket.socket:
    s = socket.socket(family)
    s.bind((host, 0))
    s.listen()
    return s


def test_sock_diag_finds_exactly_the_listeners_proc_net_lists():
    v4 = _listener(socket.AF_INET, "127.0.0.1")
    try:
        v6 = _listener(socket.AF_INET6, "::1")
    except OSError:
        v6 = None  # no IPv6 loopback here: the IPv4 half still proves the parse
    client = socket.create_connection(("127.0.0.1", v4.getsockname()[1]))
    peer, _ = v4.accept()
    mine = ownport.socket_inodes(os.getpid())
    try:
        for s in filter(None, (v4, v6)):
            port = s.getsockname()[1]
            found = ownport.diag_listening_inodes(port)
            # this process's own listening socket, by inode, and nothing else on that port
            # (the accepted connection shares the port but does not listen)
            assert found == ownport.proc_listening_inodes(port)
            assert len(found) == 1 and found <= mine, (port, found, mine)
        # a connected socket's own (ephemeral) port is not a listener
        assert ownport.diag_listening_inodes(client.getsockname()[1]) == set()
    finally:
        for s in filter(None, (client, peer, v4, v6)):
            s.close()


def test_listening_inodes_falls_back_to_proc_net_when_netlink_is_refused(monkeypatch):
    v4 = _listener(socket.AF_INET, "127.0.0.1")
    port = v4.getsockname()[1]

    def refused(*a, **k):
        raise PermissionError("netlink refused")
    try:
        monkeypatch.setattr(ownport.socket, "socket", refused)
        assert ownport.diag_listening_inodes(port) is None
        assert ownport.listening_inodes(port) == ownport.proc_listening_inodes(port) != set()
    finally:
        v4.close()


def test_listening_inodes_uses_proc_net_when_sock_diag_lists_no_listener(monkeypatch):
    # a kernel whose sock_diag answers without its TCP part: an empty list, never an error
    v4 = _listener(socket.AF_INET, "127.0.0.1")
    port = v4.getsockname()[1]
    try:
        monkeypatch.setattr(ownport, "_diag_works", None)
        monkeypatch.setattr(ownport, "diag_listening_inodes", lambda port: set())
        assert ownport.listening_inodes(port) == ownport.proc_listening_inodes(port) != set()
        assert ownport._diag_works is False
        # and a working one is trusted: every listener it lists includes ours
        monkeypatch.undo()
        monkeypatch.setattr(ownport, "_diag_works", None)
        assert ownport.listening_inodes(port) == ownport.proc_listening_inodes(port)
        assert ownport._diag_works is True
        assert ownport.proc_listening_inodes(port) <= ownport.diag_listening_inodes(None)
    finally:
        v4.close()
