"""Another user (hpcserve-b, a real second Unix user) in a node's stage directory, which every
user shares (a site-wide stage_dir, sticky as /tmp is). Each user's models are in their own
part of it (<stage_dir>/<user>, 0700): a part they made first at this user's name, or a link
there, is refused in a line naming it and its owner, and nothing is made or followed in it.
Within a directory others could write all the same, what they plant at this model's names (a
complete-looking copy with its marker) is refused, never trusted, and what they keep under other
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


@pytest.mark.parametrize("plant", ["directory", "link"])
def test_a_part_another_user_made_at_this_users_name_is_refused_and_never_followed(shared,
                                                                                   plant):
    import getpass
    mine = shared / getpass.getuser()
    theirs = shared / "theirs"
    if plant == "directory":
        as_other("sh", "-c", f"umask 022; mkdir {mine}")
    else:
        as_other("sh", "-c", f"umask 077; mkdir {theirs} && ln -s {theirs} {mine}")
    cache = sc.Cache(str(mine), 1 << 30)
    why = f"owner {OTHER}, mode 755" if plant == "directory" else "a link"
    with pytest.raises(sc.StageError, match=f"{mine} is not this user's \\({why}\\)"):
        cache.lock(NAME, deadline=0)
    assert not list(Path(mine).iterdir() if plant == "directory" else theirs.iterdir())


def test_this_users_part_is_made_theirs_alone_in_a_directory_every_user_shares(shared):
    import getpass
    mine = shared / getpass.getuser()
    cache = sc.Cache(str(mine), 1 << 30)
    lock = cache.lock(NAME, deadline=0)
    lock.close()
    assert mine.stat().st_mode & 0o777 == 0o700 and mine.stat().st_uid == os.getuid()
    assert as_other("ls", str(mine), check=False).returncode != 0


def test_another_users_models_are_neither_counted_nor_evicted(shared):
    """Their 900-byte model in a 1000-byte cache: this user's 500 bytes still fit, and their
    model is left where it is."""
    plant_copy(shared, "theirs-0123456789", 900)
    cache = sc.Cache(str(shared), 1000)
    assert cache.models() == []
    assert cache.make_room(NAME, 500) == []
    assert (shared / "theirs-0123456789" / "modeling_x.py").stat().st_size == 900
