"""The adversarial tests' two users and the shared places they meet in.

OWNER and OTHER are real unprivileged Unix users (`scripts/setup.sh`, run as root, makes them):
deployments under test run as OWNER, as every test job does (`as_owner`: jobkit.submitter),
OTHER plays another user of the same cluster (`as_other` runs a command as them). `shared` is a directory everyone may create in, sticky, as /tmp or a
site's scratch, stage or file_sd directory is.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from jobkit import OWNER, submitter  # noqa: E402,F401 (OWNER: the tests')

OTHER = "hpcserve-b"


def as_other(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """`argv` run as OTHER (from /, which they may read); with `check`, it must succeed."""
    r = subprocess.run(["runuser", "-u", OTHER, "--", *argv], capture_output=True, text=True,
                       timeout=30, cwd="/")
    if check:
        assert r.returncode == 0, (f"as {OTHER} (scripts/setup.sh makes it, as root)", argv, r)
    return r


@pytest.fixture
def shared():
    """A sticky directory everyone may create in, removed with what anyone left in it."""
    assert subprocess.run(["id", "-u", OTHER], capture_output=True).returncode == 0, (
        f"no user {OTHER}: run scripts/setup.sh as root, which makes the adversarial tests' "
        "two users")
    d = Path(tempfile.mkdtemp(prefix="hpcserve-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d)


@contextlib.contextmanager
def others_job(env: dict) -> Iterator[tuple[str, Path]]:
    """(job id, its directory): a job of OTHER's on the cluster `env` reaches (submitted for them
    with sbatch --uid, as root may), running `sleep`, with a job directory of the shape hpcserve
    renders (logs/batch-<id>.out, deployment.yaml); cancelled and removed at the end."""
    theirs = Path(tempfile.mkdtemp(prefix="hpcserve-theirs-", dir="/tmp"))
    (theirs / "logs").mkdir()
    (theirs / "deployment.yaml").write_text("name: theirs\n")
    script = theirs / "job.sbatch"
    script.write_text("#!/bin/sh\nexec sleep 600\n")
    script.chmod(0o755)
    shutil.chown(theirs, OTHER, OTHER)
    shutil.chown(theirs / "logs", OTHER, OTHER)
    r = subprocess.run(["sbatch", "--parsable", f"--uid={OTHER}", f"--gid={OTHER}",
                        "--job-name=theirs", f"--output={theirs}/logs/batch-%j.out",
                        f"--chdir={theirs}", str(script)],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r
    jid = r.stdout.strip().split(";")[0]
    try:
        yield jid, theirs
    finally:
        subprocess.run(["scancel", jid], env=env, capture_output=True, timeout=30)
        subprocess.run(["scontrol", "wait_job", jid], env=env, capture_output=True, timeout=60)
        shutil.rmtree(theirs)


def listening(ns: str, uid: int) -> list[tuple[str, int]]:
    """(address, port) of each TCP socket listening in network namespace `ns` that `uid` owns."""
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-ltnHe"], capture_output=True,
                         text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        m = re.search(r"\s(\S+):(\d+)\s+\S+\s.*\buid:(\d+)\b", line)
        if m and int(m.group(3)) == uid:
            found.append((m.group(1).strip("[]"), int(m.group(2))))
    return sorted(set(found))


@pytest.fixture
def as_owner(dev_cluster, site_python, tmp_path):
    """Submit a deployment as OWNER (jobkit.submitter); each job cancelled, awaited and removed
    at the end."""
    with submitter(dev_cluster, tmp_path, site_python) as submit:
        yield submit
