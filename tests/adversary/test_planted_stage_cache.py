"""Another user (hpcserve-b, a real second Unix user) in a node's stage cache that everyone can
write (a site-wide stage_dir, sticky as /tmp is): what they plant at this model's names (a
complete-looking copy with its marker, the lock as a link or a file of theirs) is refused in a
line naming it and its owner, never trusted and never followed; what they keep under other
names is neither counted against the cache's bound nor removed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from adversarykit import OTHER, as_other, shared  # noqa: F401  (shared: a fixture)
from hpcserve.runtime import stage_cache as sc

NAME = "tiny-0123456789"


def plant_copy(d: Path, name: str, size: int) -> None:
    """A copy of `name` as a finished staging leaves it, made by the other user: a file the
    engine would import (trust_remote_code) and a marker whose listing matches it."""
    listing = {"version": 1, "files": [["modeling_x.py", size, None]]}
    marker = json.dumps({"manifest": "x", "bytes": size, "listing": listing})
    as_other("sh", "-c", f"umask 022; mkdir {d}/{name} && head -c {size} /dev/zero "
             f"> {d}/{name}/modeling_x.py && printf '%s' '{marker}' > {d}/{name}.done")


def test_a_copy_another_user_planted_at_this_models_name_is_refused_not_trusted(shared):
    plant_copy(shared, NAME, 10)
    cache = sc.Cache(str(shared), 1 << 30)
    with pytest.raises(sc.StageError) as e:
        cache.warm(NAME, None)
    assert f"{shared / NAME}.done is not this user's (owner {OTHER}, mode 644)" in str(e.value)
    with pytest.raises(sc.StageError, match=f"owner {OTHER}"):
        cache.remove(NAME)  # nor removed: it is theirs
    assert (shared / NAME / "modeling_x.py").exists()


def test_a_lock_another_user_planted_is_refused_and_never_followed(shared):
    victim = shared / "victim"
    victim.write_text("keep\n")
    victim.chmod(0o600)
    as_other("sh", "-c", f"ln -s {victim} {shared}/{NAME}.lock && "
                         f"touch {shared}/other-0123456789.lock")
    cache = sc.Cache(str(shared), 1 << 30)
    with pytest.raises(sc.StageError, match=f"{shared / NAME}.lock is not this user's "
                                            r"\(a link\)"):
        cache.try_lock(NAME)
    with pytest.raises(sc.StageError, match=f"other-0123456789.lock is not this user's "
                                            f"\\(owner {OTHER}, mode 644\\)"):
        cache.lock("other-0123456789", deadline=0)
    assert victim.read_text() == "keep\n" and victim.stat().st_mode & 0o777 == 0o600


def test_another_users_models_are_neither_counted_nor_evicted(shared):
    """Their 900-byte model in a 1000-byte cache: this user's 500 bytes still fit, and their
    model is left where it is."""
    plant_copy(shared, "theirs-0123456789", 900)
    cache = sc.Cache(str(shared), 1000)
    assert cache.models() == []
    assert cache.make_room(NAME, 500) == []
    assert (shared / "theirs-0123456789" / "modeling_x.py").stat().st_size == 900
