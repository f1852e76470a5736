"""The Runner over SSH (paramiko): the same interface as LocalRunner, on a remote login node.

- The target is `[user@]host[:port]` (IPv6 as `[addr]:port`); a jump host is given the same way and
  the target connection is carried by a `direct-tcpip` channel through it (OpenSSH's ProxyJump).
- Host keys are checked against known_hosts (default ~/.ssh/known_hosts and
  /etc/ssh/ssh_known_hosts); an unknown key and a changed key are both refused, before anything is
  authenticated or run. There is no "add it automatically" mode.
- A command is its argv joined with shlex.join; environment variables travel as `env K=V ... cmd`
  on the command line (servers silently drop SSH env requests they do not AcceptEnv). Its output
  is what it printed between two markers of its own: what the login shell's start-up files print
  (module systems, conda init, banners) is not the command's.
- Files go over SFTP; put_tree uploads to a hidden sibling and renames it into place, so a job
  directory appears whole or not at all, with each file's mode (job scripts stay executable).
- paramiko is imported on first connection only, so `hpcserve --help` stays fast. The connection
  itself is opened on first use, and opened again if it dropped between calls.

Every failure is an HpcserveError (SSHError) with one line, reported with exit code 2.
"""

from __future__ import annotations

import getpass
import logging
import os
import posixpath
import re
import secrets
import shlex
import socket
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import HpcserveError
from .runner import CommandError, Result, Runner

DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SSHError(HpcserveError):
    """An SSH connection or transfer failed (one line, exit code 2)."""


class SSHConnectError(SSHError):
    """The host could not be reached, or did not speak SSH."""


class SSHHostKeyError(SSHError):
    """The server's host key is unknown or does not match known_hosts: refused."""


class SSHAuthError(SSHError):
    """The server refused every key offered."""


class _Timeout(Exception):
    """A command outlived its timeout (internal; reported as an HpcserveError)."""


@dataclass(frozen=True)
class Endpoint:
    user: str
    host: str
    port: int = 22

    @property
    def hostport(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return h if self.port == 22 else f"{h}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH and paramiko look this host up by in known_hosts."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user}@{self.hostport}"


def parse_target(spec: str, *, what: str = "target") -> Endpoint:
    """`[ssh://][user@]host[:port]`, host may be `[v6addr]`; the user defaults to the local one."""
    s = spec.strip()
    if s.startswith("ssh://"):
        s = s[len("ssh://"):].rstrip("/")
    bad = SSHError(f"ssh: bad {what} {spec!r}: expected USER@HOST[:PORT]")
    user, at, rest = s.rpartition("@")
    if at and not user:
        raise bad
    if not at:
        user, rest = getpass.getuser(), s
    port_s = ""
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or (tail and not tail.startswith(":")):
            raise bad
        port_s = tail[1:] if tail else ""
        if tail and not port_s:
            raise bad
    elif rest.count(":") == 1:
        host, _, port_s = rest.partition(":")
        if not port_s:
            raise bad
    elif ":" in rest:  # a bare IPv6 address, no port
        host = rest
    else:
        host = rest
    if not host or any(c.isspace() for c in host + user) or "/" in host:
        raise bad
    port = 22
    if port_s:
        if not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise SSHError(f"ssh: bad {what} {spec!r}: port {port_s!r} is not a number "
                           f"between 1 and 65535")
        port = int(port_s)
    return Endpoint(user, host, port)


def _tilde(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if path == home or path.startswith(home + "/") else path


def remote_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The command line the remote shell parses: argv, quoted, behind `env K=V ...` if any."""
    if not argv:
        raise SSHError("ssh: empty command")
    words = [str(a) for a in argv]
    if env:
        for k in env:
            if not _ENV_NAME.match(k):
                raise SSHError(f"ssh: bad environment variable name {k!r}")
        words = ["env", *[f"{k}={v}" for k, v in env.items()], *words]
    if any("\0" in w for w in words):
        raise SSHError("ssh: a command argument contains a NUL byte")
    return shlex.join(words)


def marked_command(cmd: str, mark: str) -> str:
    """`cmd` between two marker lines on both streams: the remote shell's start-up files (module
    systems, conda and pyenv init, banners) print before it, a trap of theirs may print after,
    and own_output keeps only what the command printed. The command's exit code is kept."""
    begin = shlex.quote(mark + ":begin")
    end = shlex.quote(mark + ":end")
    return (f"printf '%s\\n' {begin}; printf '%s\\n' {begin} >&2; {cmd}\n"
            f"hpcserve_rc=$?; printf '\\n%s\\n' {end}; printf '\\n%s\\n' {end} >&2; "
            "exit $hpcserve_rc")


def own_output(text: str, mark: str) -> str:
    """What a marked_command's command printed on one stream. Without the markers (the shell
    failed before the command ran) the whole text, so the shell's own words are kept."""
    begin, end = f"{mark}:begin\n", f"\n{mark}:end\n"
    start = text.find(begin)
    if start < 0:
        return text
    body = text[start + len(begin):]
    stop = body.rfind(end)
    return body[:stop] if stop >= 0 else body


def _paramiko() -> Any:
    """paramiko, imported on first use (keeps `hpcserve --help` fast), or a one-line error."""
    try:
        import paramiko
    except ImportError:
        raise SSHError("ssh: remote use needs paramiko: pip install 'hpcserve[ssh]'") from None
    _quiet_paramiko_logging()
    return paramiko


def _quiet_paramiko_logging() -> None:
    # paramiko logs transport failures (with tracebacks) at ERROR; with no handler anywhere Python's
    # last-resort handler would print them to stderr next to our one-line error.
    lg = logging.getLogger("paramiko")
    if not lg.handlers:
        lg.addHandler(logging.NullHandler())


class SSHRunner(Runner):
    """Runs commands and moves files on `user@host[:port]` over SSH (see the module docstring)."""

    def __init__(self, target: str, *, jump: str | None = None,
                 key_filenames: str | Sequence[str] | None = None,
                 allow_agent: bool = True, look_for_keys: bool | None = None,
                 known_hosts: str | Sequence[str] | None = None,
                 connect_timeout: float = 15.0, env: Mapping[str, str] | None = None):
        self.target = parse_target(target)
        self.jump = parse_target(jump, what="jump host") if jump else None
        if isinstance(key_filenames, str):
            key_filenames = [key_filenames]
        self.key_filenames = [os.path.expanduser(k) for k in (key_filenames or [])]
        self.allow_agent = allow_agent
        # Like ssh -i with IdentitiesOnly: given keys replace the ~/.ssh/id_* search.
        self.look_for_keys = not self.key_filenames if look_for_keys is None else look_for_keys
        if known_hosts is None:
            files = list(DEFAULT_KNOWN_HOSTS)
        elif isinstance(known_hosts, str):
            files = [known_hosts]
        else:
            files = list(known_hosts)
        self.known_hosts = [os.path.expanduser(f) for f in files]
        self.connect_timeout = connect_timeout
        self.env = dict(env or {})
        self.name = str(self.target)
        self._where = f" on {self.target}"
        self._lock = threading.RLock()
        self._client: Any = None
        self._jump_client: Any = None
        self._sftp: Any = None
        self._home: str | None = None

    # ---------------------------------------------------------------------------- connecting

    def __enter__(self) -> "SSHRunner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        """Open the connection now (otherwise it opens on first use)."""
        self._transport()

    def _transport(self) -> Any:
        with self._lock:
            if self._client is not None:
                t = self._client.get_transport()
                if t is not None and t.is_active():
                    return t
                self.close()  # dropped since the last call: connect again
            self._check_keys()
            paramiko = _paramiko()
            sock = None
            if self.jump is not None:
                self._jump_client = self._open(paramiko, self.jump, None, role="jump host ")
                try:
                    sock = self._jump_client.get_transport().open_channel(
                        "direct-tcpip", (self.target.host, self.target.port), ("127.0.0.1", 0),
                        timeout=self.connect_timeout)
                except paramiko.ChannelException as e:
                    self.close()
                    raise SSHConnectError(
                        f"ssh: jump host {self.jump} could not open a connection to "
                        f"{self.target.hostport}: {e.text or 'refused'}") from None
                except (paramiko.SSHException, OSError, EOFError) as e:
                    self.close()
                    raise SSHConnectError(
                        f"ssh: jump host {self.jump} could not open a connection to "
                        f"{self.target.hostport}: {e or type(e).__name__}") from None
            try:
                self._client = self._open(paramiko, self.target, sock, role="")
            except BaseException:
                self.close()
                raise
            t = self._client.get_transport()
            t.set_keepalive(30)
            return t

    def _check_keys(self) -> None:
        for k in self.key_filenames:
            if not os.path.isfile(k):
                raise SSHAuthError(f"ssh: identity file {k} does not exist")
            if not os.access(k, os.R_OK):
                raise SSHAuthError(f"ssh: identity file {k} is not readable")

    def _known_hosts_text(self) -> str:
        return " or ".join(_tilde(f) for f in self.known_hosts) or "(no known_hosts file)"

    def _open(self, paramiko: Any, ep: Endpoint, sock: Any, *, role: str) -> Any:
        class Refuse(paramiko.RejectPolicy):
            offered: Any = None

            def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
                Refuse.offered = key
                super().missing_host_key(client, hostname, key)

        client = paramiko.SSHClient()
        for f in self.known_hosts:
            if os.path.isfile(f):
                try:
                    client.load_system_host_keys(f)
                except (OSError, paramiko.SSHException) as e:
                    raise SSHHostKeyError(f"ssh: cannot read known_hosts file {f}: {e}") from None
        client.set_missing_host_key_policy(Refuse())
        who = f"{role}{ep}"
        try:
            client.connect(ep.host, port=ep.port, username=ep.user,
                           key_filename=self.key_filenames or None,
                           allow_agent=self.allow_agent, look_for_keys=self.look_for_keys,
                           timeout=self.connect_timeout, banner_timeout=self.connect_timeout,
                           auth_timeout=self.connect_timeout, channel_timeout=self.connect_timeout,
                           sock=sock)
            return client
        except BaseException as e:
            client.close()
            if Refuse.offered is not None:
                k = Refuse.offered
                raise SSHHostKeyError(
                    f"ssh: host key for {role}{ep.known_hosts_name} is not in "
                    f"{self._known_hosts_text()}; refusing to connect (add it with "
                    f"`ssh-keyscan -p {ep.port} {ep.host}` after checking its fingerprint: the "
                    f"server offered {k.get_name()} {k.fingerprint})") from None
            raise self._connect_error(paramiko, e, ep, who, role) from None

    def _connect_error(self, paramiko: Any, e: BaseException, ep: Endpoint, who: str,
                       role: str) -> BaseException:
        hp = f"{role}{ep.hostport}"
        if isinstance(e, paramiko.BadHostKeyException):
            return SSHHostKeyError(
                f"ssh: host key for {role}{ep.known_hosts_name} does not match "
                f"{self._known_hosts_text()}: the server offered {e.key.get_name()} "
                f"{e.key.fingerprint}, known_hosts has {e.expected_key.fingerprint}; refusing to "
                f"connect (if the host was reinstalled, remove the old key with "
                f"`ssh-keygen -R '{ep.known_hosts_name}'` and add the new one after checking it)")
        if isinstance(e, paramiko.BadAuthenticationType):
            return SSHAuthError(f"ssh: {who} does not accept public-key authentication "
                                f"(it allows: {', '.join(e.allowed_types) or 'nothing'})")
        if isinstance(e, paramiko.PasswordRequiredException):
            return SSHAuthError(f"ssh: authentication failed for {who}: a private key is "
                                f"encrypted; load it into ssh-agent (ssh-add) instead")
        if isinstance(e, paramiko.AuthenticationException) or (
                isinstance(e, paramiko.SSHException)
                and str(e) == "No authentication methods available"):
            return SSHAuthError(f"ssh: authentication failed for {who} with {self._offered()}; "
                                f"is the public key in that user's ~/.ssh/authorized_keys?")
        if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
            return SSHConnectError(f"ssh: cannot connect to {hp}: connection refused "
                                   f"(is sshd listening on port {ep.port}?)")
        if isinstance(e, socket.gaierror):
            return SSHConnectError(f"ssh: cannot resolve {role}host name {ep.host!r}: "
                                   f"{e.strerror or e}")
        if isinstance(e, (socket.timeout, TimeoutError)):
            return SSHConnectError(f"ssh: connecting to {hp} timed out after "
                                   f"{self.connect_timeout:g} s")
        if isinstance(e, OSError):
            return SSHConnectError(f"ssh: cannot connect to {hp}: {e.strerror or e}")
        if isinstance(e, paramiko.SSHException) and "banner" in str(e).lower():
            return SSHConnectError(f"ssh: {hp} did not answer like an SSH server ({e})")
        if isinstance(e, (paramiko.SSHException, EOFError)):
            return SSHConnectError(f"ssh: connection to {hp} failed: {e or type(e).__name__}")
        if isinstance(e, KeyboardInterrupt):
            return e
        return SSHConnectError(f"ssh: connection to {hp} failed: {type(e).__name__}: {e}")

    def _offered(self) -> str:
        parts = []
        if self.key_filenames:
            parts.append(("key " if len(self.key_filenames) == 1 else "keys ")
                         + ", ".join(self.key_filenames))
        if self.allow_agent and os.environ.get("SSH_AUTH_SOCK"):
            parts.append("the ssh-agent's keys")
        if self.look_for_keys:
            parts.append("~/.ssh/id_*")
        if not parts:
            return "no key at all (give one with -i, or use ssh-agent)"
        return " and ".join(parts)

    def _sftp_client(self) -> Any:
        with self._lock:
            t = self._transport()
            if self._sftp is None or self._sftp.get_channel() is None or \
                    self._sftp.get_channel().closed:
                paramiko = _paramiko()
                try:
                    self._sftp = paramiko.SFTPClient.from_transport(t)
                except (paramiko.SSHException, EOFError, OSError) as e:
                    raise SSHError(f"ssh: SFTP is not available{self._where} ({e}); the server "
                                   f"needs a `Subsystem sftp` line in sshd_config") from None
                if self._sftp is None:
                    raise SSHError(f"ssh: SFTP is not available{self._where}")
            return self._sftp

    def close(self) -> None:
        with self._lock:
            for obj in (self._sftp, self._client, self._jump_client):
                if obj is not None:
                    try:
                        obj.close()
                    except Exception:
                        pass
            self._sftp = self._client = self._jump_client = None

    # ---------------------------------------------------------------------------- commands

    def run_once(self, argv: list[str], *, check: bool = True, timeout: float = 60.0,
                 env: Mapping[str, str] | None = None) -> Result:
        mark = f"hpcserve-{secrets.token_hex(8)}"
        cmd = marked_command(remote_command(argv, {**self.env, **(env or {})}), mark)
        res_argv = tuple(str(a) for a in argv)
        t = self._transport()
        paramiko = _paramiko()
        try:
            chan = t.open_session(timeout=self.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.close()
            raise SSHError(f"ssh: cannot open a session{self._where}: {e}") from None
        out, err = bytearray(), bytearray()
        done = threading.Event()
        try:
            chan.exec_command(cmd)
            chan.shutdown_write()  # stdin: nothing (like LocalRunner's DEVNULL)
            # stdout here, stderr in a thread: neither can fill the channel window and stall the
            # other. EOF comes after all output; the exit status may come before the last of it.
            deadline = time.monotonic() + timeout
            chan.settimeout(0.2)
            pump_err = threading.Thread(target=self._pump, args=(chan.recv_stderr, err, done),
                                        daemon=True)
            pump_err.start()
            self._pump(chan.recv, out, done, deadline)
            pump_err.join(max(0.0, deadline - time.monotonic()))
            if pump_err.is_alive() or not chan.status_event.wait(
                    max(0.0, deadline - time.monotonic())):
                raise _Timeout()
            rc = chan.recv_exit_status()
        except _Timeout:
            raise HpcserveError(f"`{shlex.join(res_argv)}`{self._where} did not finish within "
                                f"{timeout:.0f} s") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.close()
            raise SSHError(f"ssh: `{shlex.join(res_argv)}`{self._where}: connection lost "
                           f"({e or type(e).__name__})") from None
        finally:
            done.set()
            chan.close()
        res = Result(res_argv, rc, own_output(out.decode("utf-8", "replace"), mark),
                     own_output(err.decode("utf-8", "replace"), mark))
        if rc == 127 and re.search(r"not found|No such file", res.err):
            raise HpcserveError(f"`{res_argv[0]}` not found{self._where}: is Slurm's client "
                                f"installed and on the PATH of non-interactive SSH sessions?")
        if rc == -1:  # closed without an exit status (killed by a signal)
            raise CommandError(res, self._where + " (ended without an exit status)")
        if check and rc != 0:
            raise CommandError(res, self._where)
        return res

    def _pump(self, recv: Any, buf: bytearray, done: threading.Event,
              deadline: float | None = None) -> None:
        """recv into buf until EOF (b""), done is set, or the deadline passes (raises)."""
        while not done.is_set():
            try:
                data = recv(65536)
            except socket.timeout:
                if deadline is not None and time.monotonic() > deadline:
                    raise _Timeout() from None
                continue
            if not data:
                return
            buf += data

    # ---------------------------------------------------------------------------- files

    def read_text(self, path: str) -> str | None:
        sftp = self._sftp_client()
        with self._lock:
            try:
                with sftp.open(path, "rb") as f:
                    data = f.read()
            except OSError:
                return None
            except Exception as e:
                self._lost(e)
        return data.decode("utf-8", "replace")

    def list_dir(self, path: str) -> list[str]:
        sftp = self._sftp_client()
        with self._lock:
            try:
                return sorted(sftp.listdir(path))
            except OSError:
                return []
            except Exception as e:
                self._lost(e)

    def _lost(self, e: BaseException) -> None:
        paramiko = _paramiko()
        if isinstance(e, (paramiko.SSHException, EOFError)):
            self.close()
            raise SSHError(f"ssh: SFTP connection{self._where} lost ({e or type(e).__name__})"
                           ) from None
        raise e

    def put_tree(self, local_dir: str, remote_dir: str) -> None:
        """Copy local_dir to remote_dir with file modes and times. remote_dir must not exist
        (not even as a link or an empty directory); its parents are created. The tree is
        uploaded beside it and renamed into place, so it appears complete or not at all."""
        if not os.path.isdir(local_dir):
            raise HpcserveError(f"{local_dir} is not a directory")
        sftp = self._sftp_client()
        rdir = posixpath.normpath(remote_dir)
        if rdir in ("/", ".", ""):
            raise HpcserveError(f"refusing to upload into {remote_dir!r}{self._where}")
        with self._lock:
            try:
                if self._stat(sftp, rdir, follow=False) is not None:
                    raise HpcserveError(f"{rdir}{self._where} exists: a job directory is made "
                                        "new, never one that was there; refusing to write "
                                        "into it")
                parent, name = posixpath.split(rdir)
                self._makedirs(sftp, parent)
                tmp = posixpath.join(parent, f".{name}.upload-{secrets.token_hex(4)}")
                try:
                    self._upload(sftp, local_dir, tmp)
                    sftp.posix_rename(tmp, rdir)
                except BaseException:
                    self._remove_tree(sftp, tmp)
                    raise
            except HpcserveError:
                raise
            except OSError as e:
                raise HpcserveError(f"cannot upload {local_dir} to {rdir}{self._where}: "
                                    f"{e.strerror or e}") from None
            except Exception as e:
                self._lost(e)

    @staticmethod
    def _stat(sftp: Any, path: str, follow: bool = True) -> Any:
        """What is at `path` (not following a link there, dangling or not, unless `follow`),
        None where nothing is."""
        try:
            return sftp.stat(path) if follow else sftp.lstat(path)
        except FileNotFoundError:
            return None

    def _makedirs(self, sftp: Any, d: str) -> None:
        if d in ("", "/", "."):
            return
        st = self._stat(sftp, d)
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                raise HpcserveError(f"{d}{self._where} exists and is not a directory")
            return
        self._makedirs(sftp, posixpath.dirname(d))
        try:
            sftp.mkdir(d)
        except OSError:
            if self._stat(sftp, d) is None:  # not a lost race with another mkdir
                raise

    def _upload(self, sftp: Any, local_dir: str, remote_dir: str) -> None:
        # Like shutil.copytree(symlinks=False): links are followed, their targets copied.
        dir_modes: list[tuple[str, os.stat_result]] = []
        for root, dirs, files in os.walk(local_dir, followlinks=True):
            dirs.sort()
            rel = os.path.relpath(root, local_dir)
            rroot = remote_dir if rel == "." else posixpath.join(remote_dir, *rel.split(os.sep))
            sftp.mkdir(rroot, 0o700)
            dir_modes.append((rroot, os.stat(root)))
            for fn in sorted(files):
                lp = os.path.join(root, fn)
                rp = posixpath.join(rroot, fn)
                lst = os.stat(lp)
                if not stat.S_ISREG(lst.st_mode):
                    raise HpcserveError(f"{lp} is not a regular file; cannot upload it")
                sftp.put(lp, rp, confirm=True)
                sftp.chmod(rp, stat.S_IMODE(lst.st_mode))
                sftp.utime(rp, (lst.st_atime, lst.st_mtime))
        for rroot, dst in reversed(dir_modes):  # last: a read-only dir would block its contents
            sftp.chmod(rroot, stat.S_IMODE(dst.st_mode))
            sftp.utime(rroot, (dst.st_atime, dst.st_mtime))

    def _remove_tree(self, sftp: Any, path: str) -> None:
        try:
            st = sftp.lstat(path)
        except Exception:
            return
        try:
            if stat.S_ISDIR(st.st_mode):
                sftp.chmod(path, 0o700)
                for n in sftp.listdir(path):
                    self._remove_tree(sftp, posixpath.join(path, n))
                sftp.rmdir(path)
            else:
                sftp.remove(path)
        except Exception:
            pass

    # ---------------------------------------------------------------------------- paths

    def expand_path(self, path: str) -> str:
        """Absolute, `~` expanded on the remote side, symlinks resolved; relative paths are taken
        from the remote home (the SFTP session's directory). Need not exist."""
        sftp = self._sftp_client()
        with self._lock:
            try:
                if self._home is None:
                    self._home = sftp.normalize(".")
                if path == "~" or path.startswith("~/"):
                    path = self._home + path[1:]
                elif path.startswith("~"):
                    user, _, rest = path[1:].partition("/")
                    home = self._user_home(user)
                    if home:
                        path = home + ("/" + rest if rest else "")
                if not path.startswith("/"):
                    path = posixpath.join(self._home, path)
                return self._realpath(sftp, path)
            except OSError as e:
                raise HpcserveError(f"cannot resolve {path}{self._where}: {e.strerror or e}"
                                    ) from None
            except HpcserveError:
                raise
            except Exception as e:
                self._lost(e)
                raise  # unreachable

    def _user_home(self, user: str) -> str | None:
        if not _ENV_NAME.match(user.replace("-", "_").replace(".", "_")):
            return None
        res = self.run(["getent", "passwd", user], check=False)
        fields = res.out.strip().split(":")
        return fields[5] if res.rc == 0 and len(fields) >= 7 else None

    def _realpath(self, sftp: Any, p: str) -> str:
        try:
            return sftp.normalize(p)
        except FileNotFoundError:
            pass  # does not exist (yet): resolve its parent, keep the name
        head, tail = posixpath.split(p.rstrip("/") or "/")
        if not tail:
            return posixpath.normpath(p)
        base = self._realpath(sftp, head or "/")
        if tail == "..":
            return posixpath.dirname(base)
        if tail == ".":
            return base
        return posixpath.join(base, tail)
