"""A real OpenSSH sshd on 127.0.0.1:<free port> for the session, for SSHRunner's tests.

It has its own host key, accepts one test-generated ed25519 user key (publickey only, no PAM),
serves SFTP with internal-sftp, allows TCP forwarding (so it is its own jump host), and logs at
VERBOSE to a file, which the tests read to prove what the server did (or did not) run. It is ended
by the PID it was started with. A second sshd, with AllowTcpForwarding no, plays a jump host that
refuses to forward.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from sshkit import SSHD, Sshd, keygen, start_sshd, stop  # noqa: E402


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
        # These tests must run wherever the suite runs (CI included): a missing sshd is a failure.
        pytest.fail("OpenSSH server not installed (scripts/setup.sh installs openssh-server)")
    d = tmp_path_factory.mktemp("sshkeys")
    return {n: keygen(d / f"{n}_ed25519") for n in ("user", "other", "impostor")}


def _serve(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path], name: str,
           extra: str) -> Iterator[Sshd]:
    s = start_sshd(tmp_path_factory.mktemp("sshd"), name, keys, extra)
    assert int((s.dir / "sshd.pid").read_text()) == s.proc.pid
    try:
        yield s
    finally:
        for r in s.runners:
            r.close()
        stop(s.proc)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, ssh_keys: dict[str, Path]) -> Iterator[Sshd]:
    yield from _serve(tmp_path_factory, ssh_keys, "main", "AllowTcpForwarding yes")


# What login nodes' start-up files print (module systems, conda init, banners): on both streams,
# a line left open, and a trap that speaks when the shell exits. sshd runs it in the user's shell
# in place of the command (ForceCommand), and it runs the command itself in between, as a shell
# reads its start-up files before the command it was given.
NOISY_LOGIN = """\
echo 'Welcome to the login node: lmod loaded 12 modules'
echo "pyenv: cannot rehash: /root/.pyenv/shims isn't writable" >&2
printf 'conda: (base) '
printf 'a warning left open' >&2
trap 'echo bye from .bashrc; echo bye on stderr >&2' EXIT
bash -c "$SSH_ORIGINAL_COMMAND"
"""


@pytest.fixture(scope="session")
def sshd_noisy(tmp_path_factory: pytest.TempPathFactory,
               ssh_keys: dict[str, Path]) -> Iterator[Sshd]:
    login = tmp_path_factory.mktemp("login") / "noisy-login.sh"
    login.write_text(NOISY_LOGIN)
    yield from _serve(tmp_path_factory, ssh_keys, "noisy", f"ForceCommand bash {login}")


@pytest.fixture(scope="session")
def sshd_nofwd(tmp_path_factory: pytest.TempPathFactory,
               ssh_keys: dict[str, Path]) -> Iterator[Sshd]:
    yield from _serve(tmp_path_factory, ssh_keys, "nofwd", "AllowTcpForwarding no")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        s = getattr(item, "funcargs", {}).get("sshd")
        if isinstance(s, Sshd):
            report.sections.append(("sshd log (tail)", s.log.read_text(errors="replace")[-4000:]))
