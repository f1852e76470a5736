"""Files in places other users can reach (a site-wide stage cache, Prometheus's file_sd
directory, a model's shared directory): written through a new file of a name nobody knew
beforehand and one rename, and read only where they are this user's alone. Standard library
only: it ships in the job directory (hpcserve_runtime/)."""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
import tempfile


def write_atomic(path: str, text: str, *, mode: int = 0o600, durable: bool = False) -> None:
    """`text` as `path` in one rename, through a dot-file beside it made by mkstemp (a name
    known beforehand could be a link another user planted, which open would follow; no glob
    such as *.json matches it), of `mode`. `durable`: the file on disk before the rename, and
    the rename too, so that a crash leaves the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".",
                               prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            os.fchmod(f.fileno(), mode)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(os.path.dirname(path))


def fsync_dir(path: str) -> None:
    """The directory's entries (files created, renamed into it) on disk."""
    fd = os.open(path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def foreign(path: str) -> str | None:
    """Why `path` is not this user's alone (a link, another owner, writable by others), or
    None where it is, or where nothing is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return "a link"
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = f"uid {st.st_uid}"
        return f"owner {owner}, mode {st.st_mode & 0o7777:o}"
    return None


def own_part(path: str) -> None:
    """`path`, a user's own part of a directory every user shares (<dir>/<user>), made 0700
    where missing, its parent 1777 where missing (as /tmp: anyone adds a directory, nobody
    removes another's; the directory above it must exist). OSError where it cannot be made;
    ValueError naming what is there where it is not this user's alone (a link, another owner,
    writable by others)."""
    parent = os.path.dirname(path.rstrip("/"))
    if not os.path.isdir(parent):
        # only the shared directory itself: a path above it made here would be this user's
        # alone (the job's umask is 077), and nobody else could reach their part through it
        with contextlib.suppress(FileExistsError):
            os.mkdir(parent)
            os.chmod(parent, 0o1777)   # mkdir's mode is masked by the umask
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    why = foreign(path)
    if why or not os.path.isdir(path):
        raise ValueError(why or "not a directory")
