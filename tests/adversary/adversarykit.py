"""The adversarial tests' other user and the shared places they meet the deployment's user in.

OTHER is a real second Unix user (`scripts/setup.sh`, run as root, makes it); `as_other` runs a
command as that user, `shared` is a directory everyone may create in, sticky, as /tmp or a
site's scratch, stage or file_sd directory is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

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
