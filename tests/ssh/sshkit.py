"""Helpers for SSHRunner's tests: start a real OpenSSH sshd on 127.0.0.1:<free port> (the
fixtures are in conftest.py), generate keys, read its log."""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f",
                    str(path)], check=True)
    return path


def host_line(name: str, pubkey_file: Path) -> str:
    kind, b64 = pubkey_file.read_text().split()[:2]
    return f"{name} {kind} {b64}\n"


@dataclass
class Sshd:
    dir: Path
    port: int
    proc: subprocess.Popen
    user: str
    user_key: Path          # accepted
    other_key: Path         # a valid key the server does not know
    known_hosts: Path       # has this server's key
    empty_known_hosts: Path
    wrong_known_hosts: Path  # has a different key under this server's name
    log: Path
    runners: list[Any] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def runner(self, **kw: Any) -> Any:
        """An SSHRunner to this server with the accepted key; no agent, only our known_hosts."""
        from hpcserve.slurm.ssh import SSHRunner
        kw.setdefault("key_filenames", [str(self.user_key)])
        kw.setdefault("allow_agent", False)
        kw.setdefault("known_hosts", str(self.known_hosts))
        kw.setdefault("connect_timeout", 5)
        r = SSHRunner(kw.pop("target", self.target), **kw)
        self.runners.append(r)
        return r

    def log_offset(self) -> int:
        return self.log.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def wait_log(self, offset: int, needle: str, timeout: float = 5.0) -> str:
        """The log after offset once it contains needle (sshd writes asynchronously)."""
        end = time.monotonic() + timeout
        while True:
            text = self.log_since(offset)
            if needle in text or time.monotonic() > end:
                return text
            time.sleep(0.02)


def start_sshd(base: Path, name: str, keys: dict[str, Path], extra: str = "",
               user: str | None = None) -> Sshd:
    """A real sshd on 127.0.0.1 that lets `user` (default: this one) in with keys["user"]
    (sshd reads authorized_keys as `user`: `base` must let them reach it)."""
    d = base / name
    d.mkdir()
    hostkey = keygen(d / "host_ed25519")
    (d / "authorized_keys").write_text(keys["user"].with_suffix(".pub").read_text())
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    last = ""
    for _ in range(5):  # the port is free when picked; another process could take it first
        port = free_port()
        cfg = d / "sshd_config"
        cfg.write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {hostkey}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
UseDNS no
Subsystem sftp internal-sftp
LogLevel VERBOSE
MaxStartups 100
{extra}
""")
        log = d / "sshd.log"
        log.write_text("")
        proc = subprocess.Popen([SSHD, "-D", "-E", str(log), "-f", str(cfg)],
                                stdin=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while time.monotonic() < end and proc.poll() is None:
            if f"Server listening on 127.0.0.1 port {port}" in log.read_text(errors="replace"):
                kh = d / "known_hosts"
                kh.write_text(host_line(f"[127.0.0.1]:{port}", hostkey.with_suffix(".pub")))
                (d / "known_hosts.empty").write_text("")
                (d / "known_hosts.wrong").write_text(
                    host_line(f"[127.0.0.1]:{port}", keys["impostor"].with_suffix(".pub")))
                return Sshd(d, port, proc, user or getpass.getuser(), keys["user"],
                            keys["other"], kh,
                            d / "known_hosts.empty", d / "known_hosts.wrong", log)
            time.sleep(0.02)
        stop(proc)
        last = log.read_text(errors="replace")
        if "Address already in use" not in last:
            break
    pytest.fail(f"sshd did not start:\n{last}")


def children(pid: int) -> list[int]:
    """PIDs whose parent is pid (for sshd: its per-connection processes)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End the sshd we started, by its PID. Its per-connection processes are let finish first (the
    runners are closed by then): orphaned, they would be re-parented to a PID 1 that may never reap
    them. Any still there after the grace period are ended by PID too."""
    if proc.poll() is None:
        end = time.monotonic() + grace
        while children(proc.pid) and time.monotonic() < end:
            time.sleep(0.05)
        for c in children(proc.pid):
            try:
                os.kill(c, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 2
        while children(proc.pid) and time.monotonic() < end:
            time.sleep(0.05)
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
