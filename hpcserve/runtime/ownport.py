"""Whose process listens on a serving port (stdlib only, Python 3.7+).

Run as a script of its own (hpcserve_runtime/ownport.py in the job directory): each launch
script starts it in the background, on the node where its engine (or the router) serves, with
the script's own PID, which the engine takes over by exec:

    python3 -S -I hpcserve_runtime/ownport.py PID PORT[,PORT...] OUT [TIMEOUT]

Once something listens on one of the ports it writes OUT: "ours" when it is PID's process tree
on the first (serving) port, or "taken PORT by OWNER" when any of them is held by another
process (another deployment on a shared node, a stale engine), named as far as /proc shows
it. The runtime counts the instance ready only on "ours". It exits 1 without writing when
PID ends before anything listens (its step's exit says why), or at TIMEOUT.

A file of its own, small and without third-party or heavy imports, so that it starts in a few
milliseconds beside an engine that may bind its port within a second.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time

UNKNOWN = "another user's process"  # what owner_of says when no readable process holds it

# sock_diag over netlink (linux/sock_diag.h, linux/inet_diag.h; what ss(8) asks): the kernel
# lists only the listening sockets, where reading /proc/net/tcp{,6} walks the whole TCP hash
# table, about 5 ms a table on a host with many sockets, every 20 ms while an engine starts on the
# same cores (a third of one). /proc/net stays the fallback where netlink is refused, or where
# it lists no listener at all while /proc/net shows some.
_SOCK_DIAG, _BY_FAMILY, _DUMP_REQUEST, _ERROR, _DONE = 4, 20, 0x301, 2, 3
_LISTEN = 10  # TCP_LISTEN
_DIAG_MSG = 72  # struct inet_diag_msg: 4 bytes, the 48-byte inet_diag_sockid, 5 x u32
_diag_works = None  # whether sock_diag sees the listeners /proc/net shows: asked once


def listening_inodes(port: int) -> set:
    """Socket inodes listening on TCP `port` in this network namespace."""
    global _diag_works
    if _diag_works is None:
        # A kernel whose sock_diag answers without its TCP part would list no listener ever.
        every = diag_listening_inodes(None)
        _diag_works = every is not None and (bool(every) or not proc_listening_inodes(None))
    found = diag_listening_inodes(port) if _diag_works else None
    return proc_listening_inodes(port) if found is None else found


def diag_listening_inodes(port):
    """listening_inodes through sock_diag (every port's for None); None where it cannot be
    asked."""
    found: set = set()
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _SOCK_DIAG) as s:
            s.settimeout(2)
            for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
                # inet_diag_req_v2: family, protocol, ext, pad, the states wanted, then a zeroed
                # inet_diag_sockid (any address, any port)
                req = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 1 << _LISTEN)
                req += bytes(48)
                s.sendall(struct.pack("=IHHII", 16 + len(req), _BY_FAMILY, _DUMP_REQUEST, seq,
                                      0) + req)
                if not _read_dump(s, port, found):
                    return None
    except (OSError, AttributeError, struct.error):
        return None
    return found


def _read_dump(s, port, found: set) -> bool:
    """Add the inodes of the dump's sockets on `port`; False on an error or a short answer."""
    while True:
        data = s.recv(65536)
        if not data:
            return False
        off = 0
        while off + 16 <= len(data):
            length, kind = struct.unpack_from("=IH", data, off)
            if kind == _DONE:
                return True
            if kind == _ERROR or length < 16 + _DIAG_MSG or off + length > len(data):
                return False
            # the sockid starts with the source port, in network byte order; the inode is last
            if port is None or struct.unpack_from(">H", data, off + 20)[0] == port:
                found.add(str(struct.unpack_from("=I", data, off + 16 + _DIAG_MSG - 4)[0]))
            off += (length + 3) & ~3


def proc_listening_inodes(port) -> set:
    """listening_inodes from /proc/net/tcp{,6} (every port's for None)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    f = line.split()
                    if len(f) > 9 and f[3] == "0A" and (
                            port is None or int(f[1].rsplit(":", 1)[1], 16) == port):
                        found.add(f[9])
        except (OSError, ValueError):
            continue
    return found


def socket_inodes(pid: int) -> set:
    """The sockets process pid holds open, as far as this user may see."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


def process_tree(root: int) -> set:
    """root and every process descended from it (engines bind in a child process too)."""
    children: dict = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
    tree, todo = set(), [root]
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo.extend(children.get(p, []))
    return tree


def owner_of(inodes: set) -> str:
    """Who holds a socket: 'process PID (comm) of Slurm job J' as far as /proc shows it; another
    user's processes are not readable."""
    for d in os.listdir("/proc"):
        if d.isdigit() and socket_inodes(int(d)) & inodes:
            try:
                with open(f"/proc/{d}/comm") as fh:
                    comm = fh.read().strip()
                with open(f"/proc/{d}/environ", "rb") as fh:
                    env = fh.read().split(b"\0")
            except OSError:
                return f"process {d}"
            job = next((e[13:].decode() for e in env if e.startswith(b"SLURM_JOB_ID=")), None)
            return f"process {d} ({comm})" + (f" of Slurm job {job}" if job else "")
    return UNKNOWN


def port_verdict(pid: int, ports: list, seen: set | None = None) -> str | None:
    """'ours' once the first port listens in pid's process tree; 'taken PORT by OWNER' once
    any of the ports listens elsewhere first; None while neither. `seen` collects the sockets
    found in the tree so far, which stay ours: a dying engine's socket outlives its fd table."""
    listening = {p: listening_inodes(p) for p in ports}
    if not any(listening.values()):
        return None
    ours = set().union(*(socket_inodes(p) for p in process_tree(pid)))
    if seen is not None:
        seen |= ours
        ours = ours | seen
    for p, inodes in listening.items():
        if inodes and not inodes & ours:
            return f"taken {p} by {owner_of(inodes)}"
    return "ours" if listening[ports[0]] else None


def alive(pid: int) -> bool:
    """pid runs (a zombie has closed its sockets already)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def settled(pid: int, ports: list, verdict: str | None, seen: set) -> str | None:
    """A "taken" verdict whose holder no readable process is must hold while pid lives, three
    looks 50 ms apart: it may be the socket of an engine of ours that is dying (still listed a
    moment after its process let go of it) rather than another user's. A holder that is found
    is a live process outside the tree: that needs no second look."""
    if not verdict or not verdict.endswith(UNKNOWN):
        return verdict
    for _ in range(3):
        time.sleep(0.05)
        if not alive(pid) or port_verdict(pid, ports, seen) != verdict:
            return None
    return verdict


def main(argv: list) -> int:
    try:
        pid, ports = int(argv[0]), [int(p) for p in argv[1].split(",")]
        out, timeout = argv[2], float(argv[3]) if len(argv) > 3 else 3600.0
    except (IndexError, ValueError):
        sys.stderr.write("usage: ownport.py PID PORT[,PORT...] OUT [TIMEOUT]\n")
        return 2
    start = time.monotonic()
    verdict = None
    seen: set = set()
    while verdict is None and time.monotonic() < start + timeout:
        running = alive(pid)
        verdict = settled(pid, ports, port_verdict(pid, ports, seen), seen)
        if verdict is None and not running:
            return 1
        # two /proc tables are cheap to read: look often while a fast engine may bind, then
        # settle for a slower pace through a long weight load
        time.sleep(0 if verdict else 0.02 if time.monotonic() - start < 10 else 0.2)
    if verdict is None:
        return 1
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(verdict + "\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
