"""SSHRunner against a real sshd (conftest.py): commands, env, SFTP, refusals, jump host."""

from __future__ import annotations

import getpass
import json
import os
import pwd
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hpcserve.errors import HpcserveError
from hpcserve.slurm.runner import CommandError
from hpcserve.slurm.ssh import (Endpoint, SSHAuthError, SSHConnectError, SSHError, SSHHostKeyError,
                                SSHRunner, parse_target, remote_command)

from sshkit import Sshd, free_port


def assert_one_line(e: BaseException) -> None:
    assert isinstance(e, HpcserveError) and e.exit_code == 2
    assert "\n" not in str(e) and "Traceback" not in str(e)


def assert_nothing_ran(sshd: Sshd, offset: int, marker: Path, *, wait_for: str) -> str:
    """Nothing was authenticated or started on the server since offset; the marker is absent."""
    log = sshd.wait_log(offset, wait_for)
    assert wait_for in log, log
    assert not marker.exists()
    assert "Accepted publickey" not in log, log
    assert "Starting session" not in log, log
    return log


# ------------------------------------------------------------------------------- target parsing

@pytest.mark.parametrize("spec,want", [
    ("alice@login1", Endpoint("alice", "login1", 22)),
    ("alice@login1:2222", Endpoint("alice", "login1", 2222)),
    ("ssh://alice@login1:2222", Endpoint("alice", "login1", 2222)),
    ("login1", Endpoint(getpass.getuser(), "login1", 22)),
    ("alice@[::1]:2200", Endpoint("alice", "::1", 2200)),
    ("alice@::1", Endpoint("alice", "::1", 22)),
    ("a.b@c@host:7", Endpoint("a.b@c", "host", 7)),
])
def test_parse_target(spec: str, want: Endpoint) -> None:
    assert parse_target(spec) == want


@pytest.mark.parametrize("spec", ["alice@", "@host", "alice@host:", "alice@host:99999",
                                  "alice@host:x", "alice@[::1", "", "al ice@host"])
def test_parse_target_rejects(spec: str) -> None:
    with pytest.raises(SSHError, match="bad target") as ei:
        parse_target(spec)
    assert_one_line(ei.value)


def test_endpoint_known_hosts_name() -> None:
    assert Endpoint("u", "h", 22).known_hosts_name == "h"
    assert Endpoint("u", "127.0.0.1", 2222).known_hosts_name == "[127.0.0.1]:2222"
    assert str(Endpoint("u", "::1", 2222)) == "u@[::1]:2222"


def test_remote_command_quotes_and_env() -> None:
    assert remote_command(["echo", "a b", "$(x)"]) == "echo 'a b' '$(x)'"
    assert remote_command(["true"], {"K": "v w"}) == "env 'K=v w' true"
    with pytest.raises(SSHError, match="bad environment variable name"):
        remote_command(["true"], {"A;B": "x"})
    with pytest.raises(SSHError, match="empty command"):
        remote_command([])


def test_paramiko_is_imported_lazily() -> None:
    code = ("import sys; from hpcserve.slurm.ssh import SSHRunner; "
            "SSHRunner('u@h:2222', jump='j'); assert 'paramiko' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------- commands

def test_run_returns_rc_stdout_stderr(sshd: Sshd) -> None:
    r = sshd.runner()
    res = r.run(["sh", "-c", "echo out; echo err >&2; exit 0"])
    assert (res.rc, res.out, res.err) == (0, "out\n", "err\n")
    assert res.argv == ("sh", "-c", "echo out; echo err >&2; exit 0")
    assert r.run(["sh", "-c", "exit 5"], check=False).rc == 5


def test_nonzero_exit_raises_command_error(sshd: Sshd) -> None:
    r = sshd.runner()
    with pytest.raises(CommandError) as ei:
        r.run(["sh", "-c", "echo boom >&2; exit 3"])
    msg = str(ei.value)
    assert msg == (f"`sh -c 'echo boom >&2; exit 3'` on {sshd.target} failed with exit code 3: "
                   f"boom")
    assert ei.value.result.rc == 3
    assert_one_line(ei.value)


def test_missing_command_is_named(sshd: Sshd) -> None:
    with pytest.raises(HpcserveError, match=r"`no-such-cmd-xyz` not found on ") as ei:
        sshd.runner().run(["no-such-cmd-xyz", "--version"])
    assert_one_line(ei.value)


HOSTILE = ["two words", "it's \"quoted\"", "$(touch {m})", "`touch {m}`", "x; touch {m}",
           "a && touch {m}", "new\nline", "", "*", "~", "\\", "-n", "é ✓"]


def test_hostile_argv_and_env_arrive_literally(sshd: Sshd, tmp_path: Path) -> None:
    m = tmp_path / "pwned"
    values = [v.format(m=m) for v in HOSTILE]
    env = {f"V{i}": v for i, v in enumerate(values)}
    r = sshd.runner(env={"FROM_CTOR": "c; $(touch " + str(m) + ")", "V0": "overridden"})
    code = "import json, os, sys; print(json.dumps([sys.argv[1:], dict(os.environ)]))"
    res = r.run(["python3", "-c", code, *values], env=env)
    argv, got = json.loads(res.out)
    assert argv == values
    for k, v in env.items():
        assert got[k] == v
    assert got["FROM_CTOR"] == "c; $(touch " + str(m) + ")"
    assert not m.exists()


def test_concurrent_runs_on_one_runner(sshd: Sshd) -> None:
    r = sshd.runner()
    cmds = [["sh", "-c", f"echo out{i}; echo err{i} >&2; exit {i % 3}"] for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: r.run(c, check=False), cmds))
    for i, res in enumerate(results):
        assert (res.rc, res.out, res.err) == (i % 3, f"out{i}\n", f"err{i}\n")


def test_start_up_files_that_print_never_reach_the_command_output(sshd_noisy: Sshd) -> None:
    r = sshd_noisy.runner()
    assert r.run(["sh", "-c", "echo out"]).out == "out\n"
    res = r.run(["sh", "-c", "printf 'no newline'; printf err >&2; exit 4"], check=False)
    assert (res.rc, res.out, res.err) == (4, "no newline", "err")
    cmds = [["sh", "-c", f"echo out{i}; echo err{i} >&2; exit {i % 3}"] for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: r.run(c, check=False), cmds))
    for i, res in enumerate(results):
        assert (res.rc, res.out, res.err) == (i % 3, f"out{i}\n", f"err{i}\n")


def test_the_start_up_noise_is_really_printed_on_both_streams(sshd_noisy: Sshd) -> None:
    """The test above proves something only if that server's shell prints around commands: a
    plain ssh client sees it."""
    out = subprocess.run(["ssh", "-p", str(sshd_noisy.port), "-i", str(sshd_noisy.user_key),
                          "-o", f"UserKnownHostsFile={sshd_noisy.known_hosts}",
                          "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                          f"{sshd_noisy.user}@127.0.0.1", "echo mine"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Welcome to the login node") and "mine" in out.stdout
    assert "bye from .bashrc" in out.stdout
    assert "cannot rehash" in out.stderr and "bye on stderr" in out.stderr


class LateOutputChannel:
    """A channel whose exit status arrives before its output, as OpenSSH sometimes sends it
    (seen for ~5% of short commands): a runner that stops at the exit status loses output."""

    def __init__(self) -> None:
        self.status_event = threading.Event()
        self.lock = threading.Condition()
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.eof = False
        self.timeout = None

    def exec_command(self, cmd: str) -> None:
        def serve() -> None:
            self.status_event.set()
            time.sleep(0.1)
            with self.lock:
                self.out.append(b"late out\n")
                self.err.append(b"late err\n")
                self.eof = True
                self.lock.notify_all()
        threading.Thread(target=serve, daemon=True).start()

    def settimeout(self, t: float) -> None:
        self.timeout = t

    def _recv(self, q: list[bytes]) -> bytes:
        with self.lock:
            if not self.lock.wait_for(lambda: q or self.eof, self.timeout):
                raise socket.timeout()
            return q.pop(0) if q else b""

    def recv(self, n: int) -> bytes:
        return self._recv(self.out)

    def recv_stderr(self, n: int) -> bytes:
        return self._recv(self.err)

    def recv_exit_status(self) -> int:
        return 0

    def shutdown_write(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_output_after_the_exit_status_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    r = SSHRunner("u@h", allow_agent=False)

    class FakeTransport:
        def open_session(self, timeout: float) -> LateOutputChannel:
            return LateOutputChannel()

    monkeypatch.setattr(r, "_transport", lambda: FakeTransport())
    res = r.run(["anything"])
    assert (res.rc, res.out, res.err) == (0, "late out\n", "late err\n")


def test_stdin_is_closed(sshd: Sshd) -> None:
    res = sshd.runner().run(["cat"], timeout=10)
    assert (res.rc, res.out) == (0, "")


def test_large_stdout_and_stderr_together(sshd: Sshd) -> None:
    code = ("import sys\nfor i in range(400):\n sys.stdout.write('o' * 5000)\n"
            " sys.stderr.write('e' * 5000)\n")
    res = sshd.runner().run(["python3", "-c", code], timeout=30)
    assert len(res.out) == len(res.err) == 2_000_000


def test_timeout(sshd: Sshd) -> None:
    r = sshd.runner()
    with pytest.raises(HpcserveError, match=r"`sleep 3` on .* did not finish within 0 s"):
        r.run(["sleep", "3"], timeout=0.3)
    assert r.run(["echo", "still usable"]).out == "still usable\n"


def test_reconnects_after_close(sshd: Sshd) -> None:
    r = sshd.runner()
    assert r.run(["true"]).rc == 0
    r.close()
    r.close()
    assert r.run(["echo", "again"]).out == "again\n"


# ------------------------------------------------------------------------------- files

def make_tree(root: Path) -> dict[str, tuple[bytes, int]]:
    spec = {
        "job.sbatch": (b"#!/bin/bash\necho hi\n", 0o755),
        "hpcserve_job.py": (b"print('x')\n", 0o755),
        "plan.json": (b'{"a": 1}\n', 0o644),
        "secret.env": (b"TOKEN=x\n", 0o600),
        "empty": (b"", 0o640),
        "bin/blob": (bytes(range(256)) * 100, 0o444),
        "sub/deeper/run.sh": (b"#!/bin/sh\n", 0o750),
    }
    for rel, (data, mode) in spec.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
        p.chmod(mode)
    (root / "sub").chmod(0o750)
    return spec


def test_put_tree_preserves_contents_and_modes(sshd: Sshd, tmp_path: Path) -> None:
    src = tmp_path / "src"
    spec = make_tree(src)
    dst = tmp_path / "remote" / "jobs" / "job-1"  # parents do not exist yet
    sshd.runner().put_tree(str(src), str(dst))
    for rel, (data, mode) in spec.items():
        assert (dst / rel).read_bytes() == data, rel
        assert stat.S_IMODE((dst / rel).stat().st_mode) == mode, rel
    assert stat.S_IMODE((dst / "sub").stat().st_mode) == 0o750
    assert os.access(dst / "job.sbatch", os.X_OK)
    assert sorted(os.listdir(dst.parent)) == ["job-1"]  # no upload leftovers
    assert (dst / "plan.json").stat().st_mtime == pytest.approx((src / "plan.json").stat().st_mtime,
                                                                abs=1)


def test_put_tree_refuses_non_empty_destination(sshd: Sshd, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_tree(src)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep").write_text("mine")
    with pytest.raises(HpcserveError, match="exists: a job directory is made new") as ei:
        sshd.runner().put_tree(str(src), str(dst))
    assert_one_line(ei.value)
    assert sorted(os.listdir(dst)) == ["keep"]
    assert sorted(os.listdir(tmp_path)) == ["dst", "src"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(HpcserveError, match="exists: a job directory is made new"):
        sshd.runner().put_tree(str(src), str(tmp_path / "file"))


def test_put_tree_refuses_an_empty_directory_or_a_link_that_was_there(sshd: Sshd,
                                                                      tmp_path: Path) -> None:
    """Whoever made the path first (another user, on a shared file system) could change the
    job's scripts once they are in it: an empty directory or a link there is refused and left
    as it was, a dangling link too."""
    src = tmp_path / "src"
    make_tree(src)
    (tmp_path / "empty").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("empty", "link", "dangling"):
        with pytest.raises(HpcserveError, match="exists: a job directory is made new"):
            sshd.runner().put_tree(str(src), str(tmp_path / name))
    assert os.listdir(tmp_path / "empty") == [] == os.listdir(tmp_path / "elsewhere")
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "dangling").is_symlink()


def test_read_text_and_list_dir(sshd: Sshd, tmp_path: Path) -> None:
    r = sshd.runner()
    (tmp_path / "b.log").write_bytes("héllo\n".encode() + b"\xff\n")
    (tmp_path / ".hidden").write_text("")
    (tmp_path / "a").mkdir()
    assert r.read_text(str(tmp_path / "b.log")) == "héllo\n\ufffd\n"
    assert r.read_text(str(tmp_path / "missing")) is None
    assert r.read_text(str(tmp_path / "a")) is None
    assert r.list_dir(str(tmp_path)) == [".hidden", "a", "b.log"]
    assert r.list_dir(str(tmp_path / "missing")) == []


def test_expand_path_uses_the_remote_home(sshd: Sshd, tmp_path: Path) -> None:
    r = sshd.runner()
    home = os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir)  # the session's, not $HOME
    assert r.expand_path("~") == home
    assert r.expand_path("~/hpcserve-jobs/x") == f"{home}/hpcserve-jobs/x"
    assert r.expand_path(f"~{sshd.user}/y") == f"{home}/y"
    assert r.expand_path("rel/z") == f"{home}/rel/z"  # relative to the remote home
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    real = os.path.realpath(tmp_path / "real")
    assert r.expand_path(str(tmp_path / "link" / "new" / ".." / "f")) == f"{real}/f"


# ------------------------------------------------------------------------------- refusals

def test_unknown_host_key_is_refused_and_nothing_runs(sshd: Sshd, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    off = sshd.log_offset()
    r = sshd.runner(known_hosts=str(sshd.empty_known_hosts))
    with pytest.raises(SSHHostKeyError) as ei:
        r.run(["touch", str(marker)])
    msg = str(ei.value)
    assert msg.startswith(f"ssh: host key for [127.0.0.1]:{sshd.port} is not in ")
    assert "refusing to connect" in msg and f"ssh-keyscan -p {sshd.port} 127.0.0.1" in msg
    assert "SHA256:" in msg
    assert_one_line(ei.value)
    assert_nothing_ran(sshd, off, marker, wait_for="[preauth]")
    assert not sshd.empty_known_hosts.read_text()  # nothing was added


def test_hashed_known_hosts_entries_are_accepted(sshd: Sshd, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"  # as Debian's HashKnownHosts=yes writes them
    kh.write_text(sshd.known_hosts.read_text())
    subprocess.run(["ssh-keygen", "-H", "-f", str(kh)], check=True, capture_output=True)
    assert kh.read_text().startswith("|1|")
    assert sshd.runner(known_hosts=str(kh)).run(["echo", "ok"]).out == "ok\n"


def test_missing_known_hosts_file_refuses_too(sshd: Sshd, tmp_path: Path) -> None:
    with pytest.raises(SSHHostKeyError, match="is not in .*nonexistent"):
        sshd.runner(known_hosts=str(tmp_path / "nonexistent")).run(["true"])
    assert not (tmp_path / "nonexistent").exists()


def test_changed_host_key_is_refused_and_nothing_runs(sshd: Sshd, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    off = sshd.log_offset()
    with pytest.raises(SSHHostKeyError) as ei:
        sshd.runner(known_hosts=str(sshd.wrong_known_hosts)).run(["touch", str(marker)])
    msg = str(ei.value)
    assert msg.startswith(f"ssh: host key for [127.0.0.1]:{sshd.port} does not match ")
    assert "refusing to connect" in msg and f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in msg
    assert_one_line(ei.value)
    assert_nothing_ran(sshd, off, marker, wait_for="[preauth]")


def test_wrong_user_key_is_refused_and_nothing_runs(sshd: Sshd, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    off = sshd.log_offset()
    with pytest.raises(SSHAuthError) as ei:
        sshd.runner(key_filenames=[str(sshd.other_key)]).run(["touch", str(marker)])
    assert str(ei.value) == (
        f"ssh: authentication failed for {sshd.target} with key {sshd.other_key}; is the public "
        f"key in that user's ~/.ssh/authorized_keys?")
    assert_one_line(ei.value)
    log = assert_nothing_ran(sshd, off, marker, wait_for="[preauth]")
    assert "Failed publickey" in log or "Connection closed by authenticating user" in log, log


def test_missing_identity_file(sshd: Sshd, tmp_path: Path) -> None:
    with pytest.raises(SSHAuthError, match=r"identity file .*nope does not exist") as ei:
        sshd.runner(key_filenames=[str(tmp_path / "nope")]).run(["true"])
    assert_one_line(ei.value)


def test_closed_port_is_a_clear_error() -> None:
    port = free_port()
    r = SSHRunner(f"u@127.0.0.1:{port}", allow_agent=False, look_for_keys=False)
    with pytest.raises(SSHConnectError) as ei:
        r.run(["true"])
    assert str(ei.value) == (f"ssh: cannot connect to 127.0.0.1:{port}: connection refused "
                             f"(is sshd listening on port {port}?)")
    assert_one_line(ei.value)


def test_unresolvable_host() -> None:
    r = SSHRunner("u@no-such-host.invalid", allow_agent=False, look_for_keys=False,
                  connect_timeout=5)
    with pytest.raises(SSHConnectError, match=r"cannot resolve host name 'no-such-host.invalid'"):
        r.run(["true"])


# ------------------------------------------------------------------------------- jump host

def test_jump_host(sshd: Sshd, tmp_path: Path) -> None:
    import paramiko
    off = sshd.log_offset()
    r = sshd.runner(jump=sshd.target)
    assert r.run(["echo", "via jump"]).out == "via jump\n"
    r.put_tree(str(tmp_path), str(tmp_path.parent / (tmp_path.name + "-copy")))
    # the target's transport runs over a direct-tcpip channel of the jump connection
    assert isinstance(r._client.get_transport().sock, paramiko.Channel)
    assert sshd.wait_log(off, "Starting session").count("Accepted publickey") == 2


def test_jump_host_that_refuses_forwarding(sshd: Sshd, sshd_nofwd: Sshd) -> None:
    r = sshd.runner(jump=sshd_nofwd.target,
                    known_hosts=[str(sshd.known_hosts), str(sshd_nofwd.known_hosts)])
    with pytest.raises(SSHConnectError) as ei:
        r.run(["true"])
    assert str(ei.value).startswith(
        f"ssh: jump host {sshd_nofwd.target} could not open a connection to 127.0.0.1:{sshd.port}:")
    assert_one_line(ei.value)


def test_jump_host_key_is_checked_too(sshd: Sshd, sshd_nofwd: Sshd, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    off = sshd_nofwd.log_offset()
    # only the target's key is known: the jump host's is refused before anything else
    r = sshd.runner(jump=sshd_nofwd.target, known_hosts=str(sshd.known_hosts))
    with pytest.raises(SSHHostKeyError,
                       match=rf"^ssh: host key for jump host \[127.0.0.1\]:{sshd_nofwd.port} is "
                             rf"not in "):
        r.run(["touch", str(marker)])
    assert_nothing_ran(sshd_nofwd, off, marker, wait_for="[preauth]")


# ------------------------------------------------------------------------------- through the CLI

def test_cli_reports_a_refusal_in_one_line_with_exit_code_2(sshd: Sshd, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path)}
    env.pop("SSH_AUTH_SOCK", None)
    cli = str(Path(sys.executable).parent / "hpcserve")
    p = subprocess.run([cli, "--remote", sshd.target, "-i", str(sshd.user_key),
                        "--known-hosts", str(sshd.empty_known_hosts), "status", "123"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "refusing to connect" in lines[0], p.stderr
