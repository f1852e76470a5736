"""Another user (hpcserve-b, a real second Unix user) in a node's stage cache that everyone can
write (a site-wide stage_dir, sticky as /tmp is): what they plant at this model's names (a
complete-looking copy with its marker, the lock as a link or a file of theirs) is refused in a
line naming it and its owner, never trusted and never followed; what they keep under other
names is neither counted against the cache's bound nor removed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from hpcserve.runtime import stage_cache as sc

OTHER = "hpcserve-b"
NAME = "tiny-0123456789"


@pytest.fixture
def stage_dir():
    d = Path(tempfile.mkdtemp(prefix="hpcserve-stage-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d)


def as_other(script: str) -> None:
    r = subprocess.run(["runuser", "-u", OTHER, "--", "sh", "-c", script], capture_output=True,
                       text=True, timeout=30, cwd="/")
    assert r.returncode == 0, (f"as {OTHER} (scripts/setup.sh makes it, as root)", script, r)


def plant_copy(d: Path, name: str, size: int) -> None:
    """A copy of `name` as a finished staging leaves it, made by the other user: a file the
    engine would import (trust_remote_code) and a marker whose listing matches it."""
    listing = {"version": 1, "files": [["modeling_x.py", size, None]]}
    marker = json.dumps({"manifest": "x", "bytes": size, "listing": listing})
    as_other(f"umask 022; mkdir {d}/{name} && head -c {size} /dev/zero > {d}/{name}/modeling_x.py"
             f" && printf '%s' '{marker}' > {d}/{name}.done")


def test_a_copy_another_user_planted_at_this_models_name_is_refused_not_trusted(stage_dir):
    plant_copy(stage_dir, NAME, 10)
    cache = sc.Cache(str(stage_dir), 1 << 30)
    with pytest.raises(sc.StageError) as e:
        cache.warm(NAME, None)
    assert f"{stage_dir / NAME}.done is not this user's (owner {OTHER}, mode 644)" in str(e.value)
    with pytest.raises(sc.StageError, match=f"owner {OTHER}"):
        cache.remove(NAME)  # nor removed: it is theirs
    assert (stage_dir / NAME / "modeling_x.py").exists()


def test_a_lock_another_user_planted_is_refused_and_never_followed(stage_dir):
    victim = stage_dir / "victim"
    victim.write_text("keep\n")
    victim.chmod(0o600)
    as_other(f"ln -s {victim} {stage_dir}/{NAME}.lock && touch {stage_dir}/other-0123456789.lock")
    cache = sc.Cache(str(stage_dir), 1 << 30)
    with pytest.raises(sc.StageError, match=f"{stage_dir / NAME}.lock is not this user's "
                                            r"\(a link\)"):
        cache.try_lock(NAME)
    with pytest.raises(sc.StageError, match=f"other-0123456789.lock is not this user's "
                                            f"\\(owner {OTHER}, mode 644\\)"):
        cache.lock("other-0123456789", deadline=0)
    assert victim.read_text() == "keep\n" and victim.stat().st_mode & 0o777 == 0o600


def test_another_users_models_are_neither_counted_nor_evicted(stage_dir):
    """Their 900-byte model in a 1000-byte cache: this user's 500 bytes still fit, and their
    model is left where it is."""
    plant_copy(stage_dir, "theirs-0123456789", 900)
    cache = sc.Cache(str(stage_dir), 1000)
    assert cache.models() == []
    assert cache.make_room(NAME, 500) == []
    assert (stage_dir / "theirs-0123456789" / "modeling_x.py").stat().st_size == 900
