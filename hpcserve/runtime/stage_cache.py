"""The node-local stage cache: the user's own part of the site's stage directory
(<site.paths.stage_dir>/<user>, 0700), one directory per staged model, its manifest, its lock,
its completion marker and its users; the least recently used model goes when the cache would
outgrow its bound. Stdlib only: it runs on every node in the stage step.

Layout of the cache, for a model staged under NAME:
  NAME/              the complete copy the engines read (NAME/.hpcserve-manifest.json beside it)
  NAME.done          the completion marker (JSON); its mtime is the model's last use (LRU)
  NAME.lock          fcntl lock: one job at a time stages (or evicts) NAME on this node
  NAME.users/JOBID   a job using NAME, holding the time its allocation ends at the latest
  NAME.partial-*     the copy in progress (mkdtemp); renamed to NAME once every file matched the
                     manifest

The cache's directory is used only if it is this user's alone (one another user made first at
that name, or a link there, is refused), and so is every entry: an entry of another user's at
one of this model's names is refused in a line naming it and its owner, never trusted (a planted
copy is code the engines may run: trust_remote_code) and never removed; theirs under other names
are neither counted nor evicted. A lock held by another job waits LOCK_WAIT_S at most.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time

from . import owned
from .model_dir import TooManyFiles, model_files
from .owned import foreign, fsync_dir

MANIFEST = ".hpcserve-manifest.json"
LOCK_WAIT_S = 600.0   # s another job's staging of the same model on a node is waited for


class StageError(Exception):
    """A staging failure on this node: the file it concerns (or None) and the cause."""

    def __init__(self, file: str | None, cause: str):
        super().__init__(f"{file}: {cause}" if file else cause)
        self.file = file
        self.cause = cause


# ------------------------------------------------------------------------------- the manifest

def list_files(root: str) -> list:
    """[[relative path, size]] of every file under root (dot-files aside), sorted."""
    try:
        return sorted([rel, os.path.getsize(full)] for rel, full in model_files(root))
    except TooManyFiles as e:
        raise StageError(None, str(e)) from None


def file_sha256(path: str, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def compute_manifest(source: str) -> dict:
    return {"version": 1, "source": source,
            "files": [[rel, size, file_sha256(os.path.join(source, rel))]
                      for rel, size in list_files(source)]}


def manifest_places(source: str, stage_dir: str, name: str) -> list:
    """Where a model's manifest is kept: beside the model, else in the stage cache."""
    return [os.path.join(source, MANIFEST), os.path.join(stage_dir, name + ".manifest.json")]


def load_manifest(source: str, stage_dir: str, name: str) -> dict | None:
    for p in manifest_places(source, stage_dir, name):
        try:
            with open(p) as f:
                m = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(m, dict) and m.get("version") == 1 and isinstance(m.get("files"), list):
            return m
    return None


def save_manifest(m: dict, source: str, stage_dir: str, name: str) -> str:
    """Beside the model where it is writable, else in the stage cache; the path written."""
    text = json.dumps(m, indent=1)
    for p in manifest_places(source, stage_dir, name):
        try:
            write_atomic(p, text)
            return p
        except OSError:
            continue
    raise StageError(None, f"cannot write the manifest beside {source} or in {stage_dir}")


def check_listing(files: list, manifest: dict, where: str) -> None:
    """The model directory as it is now against its manifest: the same names and sizes."""
    have = {rel: size for rel, size in files}
    want = {rel: size for rel, size, _ in manifest["files"]}
    for rel in sorted(set(have) | set(want)):
        if rel not in want:
            raise StageError(rel, f"in {where} but not in its manifest (a changed model: "
                                  "remove the manifest to accept it)")
        if rel not in have:
            raise StageError(rel, f"in the manifest but not in {where}")
        if have[rel] != want[rel]:
            raise StageError(rel, f"{have[rel]} bytes in {where}, {want[rel]} in the manifest")


def write_atomic(path: str, text: str) -> None:
    """A stage cache file (marker, user, manifest): never through a name known beforehand, on
    disk before its rename and the rename too, so that a crash never leaves a marker without
    the bytes it vouches for."""
    owned.write_atomic(path, text, durable=True)


def check_own(path: str) -> None:
    """StageError unless `path` is this user's alone (or absent)."""
    why = foreign(path)
    if why:
        raise StageError(None, f"{path} is not this user's ({why}): a stage cache entry "
                               "another user could have made or can change is never used")


# ------------------------------------------------------------------------------- the cache

class Cache:
    def __init__(self, stage_dir: str, max_bytes: int):
        self.dir = stage_dir
        self.max_bytes = max_bytes

    def own_dir(self) -> None:
        """The cache's directory: this user's part of the site's stage_dir (<stage_dir>/<user>),
        made where missing; StageError where it cannot be, or is not this user's alone."""
        try:
            owned.own_part(self.dir)
        except OSError as e:
            raise StageError(None, f"cannot make {self.dir}, your part of the stage directory: "
                                   f"{e.strerror or e} (the site's stage_dir must let every "
                                   "user add a directory, as /tmp does)") from None
        except ValueError as e:
            raise StageError(None, f"{self.dir} is not this user's ({e}): a stage cache "
                                   "another user could have made or can change is never used"
                             ) from None

    def path(self, name: str, suffix: str = "") -> str:
        return os.path.join(self.dir, name + suffix)

    # -- the per-model lock
    def try_lock(self, name: str):
        """The model's lock, held by the returned file object, or None while another holds it.
        A lock file that is a link or another user's is refused (StageError), not followed."""
        self.own_dir()
        path = self.path(name, ".lock")
        check_own(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise StageError(None, f"cannot open the stage lock {path}: {e.strerror or e}"
                             ) from None
        f = os.fdopen(fd, "r+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return None
        return f

    def lock(self, name: str, deadline: float, check=lambda: None):
        """The model's lock, waiting for another job's staging to end (until `deadline`, and
        LOCK_WAIT_S at most: a job's time limit may be days)."""
        limit = min(deadline, time.time() + LOCK_WAIT_S)
        while True:
            f = self.try_lock(name)
            if f is not None:
                return f
            if time.time() > limit:
                waited = (f"for {LOCK_WAIT_S:g} s (the most a job waits for another's copy)"
                          if limit < deadline else "until this job's deadline")
                raise StageError(None, "another job held this node's stage lock "
                                       f"{self.path(name, '.lock')} {waited}")
            check()
            time.sleep(0.05)

    def _check_own(self, name: str) -> None:
        """The model's marker, copy and users: StageError unless each is this user's alone."""
        for suffix in (".done", "", ".users"):
            check_own(self.path(name, suffix))

    # -- the completion marker
    def warm(self, name: str, manifest: dict | None) -> bool:
        """A complete copy of this manifest's files is here (a marker, and the sizes agree).
        A marker or copy that is not this user's alone is refused (StageError), not trusted."""
        self._check_own(name)
        try:
            with open(self.path(name, ".done")) as f:
                done = json.load(f)
        except (OSError, ValueError):
            return False
        if manifest is not None and done.get("manifest") != manifest_digest(manifest):
            return False
        try:
            check_listing(list_files(self.path(name)), done["listing"], "the staged copy")
        except (StageError, OSError, KeyError):
            return False
        return True

    def mark_done(self, name: str, manifest: dict) -> None:
        write_atomic(self.path(name, ".done"), json.dumps({
            "manifest": manifest_digest(manifest), "staged_at": time.time(),
            "bytes": sum(f[1] for f in manifest["files"]), "listing": manifest}))

    def touch(self, name: str) -> None:
        os.utime(self.path(name, ".done"))

    # -- who uses a model
    def add_user(self, name: str, job_id: str, until: float) -> None:
        d = self.path(name, ".users")
        os.makedirs(d, exist_ok=True)
        write_atomic(os.path.join(d, job_id or "none"), f"{until:.0f}\n")

    def in_use(self, name: str, now: float) -> bool:
        """A job whose allocation has not ended yet uses it."""
        d = self.path(name, ".users")
        try:
            entries = os.listdir(d)
        except OSError:
            return False
        for e in entries:
            try:
                with open(os.path.join(d, e)) as f:
                    if float(f.read().strip() or 0) > now:
                        return True
            except (OSError, ValueError):
                continue
        return False

    # -- the size bound
    def models(self) -> list:
        """[(last use, bytes, name)] of every complete model, least recently used first. A
        marker whose name is no model's (`..done` names ".", `...done` "..": the cache itself
        and its parent) is nobody's model: never counted, never removed."""
        out = []
        for entry in os.listdir(self.dir):
            if entry.endswith(".done") and plain_name(entry[:-5]) and \
                    not foreign(self.path(entry[:-5], ".done")):
                name = entry[:-5]
                try:
                    with open(self.path(name, ".done")) as f:
                        size = int(json.load(f)["bytes"])
                    out.append((os.path.getmtime(self.path(name, ".done")), size, name))
                except (OSError, ValueError, KeyError):
                    continue
        return sorted(out)

    def make_room(self, name: str, need: int, log=lambda _m: None) -> list:
        """Remove the least recently used models (never `name`, never one in use, never one
        another job holds the lock of) until `need` more bytes fit in the bound. The names
        removed; a StageError when they cannot be made to fit."""
        if need > self.max_bytes:
            raise StageError(None, f"the model ({need / 1e9:.2f} GB) is larger than the stage "
                                   f"cache's bound ({self.max_bytes / 1e9:.2f} GB, "
                                   "site.paths.stage_max_gb)")
        models = [m for m in self.models() if m[2] != name]
        used = sum(m[1] for m in models)
        gone = []
        for _, size, victim in models:
            if used + need <= self.max_bytes:
                break
            if self.in_use(victim, time.time()):
                continue
            held = self.try_lock(victim)
            if held is None:
                continue
            try:
                self.remove(victim)
            finally:
                held.close()
            used -= size
            gone.append(victim)
            log(f"removed {victim} ({size / 1e9:.2f} GB, least recently used) from the cache")
        if used + need > self.max_bytes:
            raise StageError(None, f"the stage cache cannot hold the model: {used / 1e9:.2f} GB "
                                   f"of models in use by running jobs plus {need / 1e9:.2f} GB "
                                   f"exceed its bound of {self.max_bytes / 1e9:.2f} GB")
        return gone

    def remove(self, name: str) -> None:
        """A model out of the cache: its marker first, so that nobody takes half a copy as
        complete."""
        if not plain_name(name):
            raise StageError(None, f"{name!r} is no model's name in the stage cache: not removed")
        self._check_own(name)
        for suffix in (".done", ".manifest.json"):
            try:
                os.unlink(self.path(name, suffix))
            except FileNotFoundError:
                pass
        shutil.rmtree(self.path(name), ignore_errors=True)
        shutil.rmtree(self.path(name, ".users"), ignore_errors=True)

    def install(self, name: str, partial: str, manifest: dict) -> None:
        """A verified copy in place, then its marker: the copy's files (each fsynced as it
        was written) and directories on disk before the rename, the rename before the marker,
        so that a marker never survives a crash that the bytes it vouches for did not."""
        shutil.rmtree(self.path(name), ignore_errors=True)
        write_atomic(os.path.join(partial, MANIFEST), json.dumps(manifest, indent=1))
        for d, _, _ in os.walk(partial):
            fsync_dir(d)
        os.rename(partial, self.path(name))
        fsync_dir(self.dir)
        self.mark_done(name, manifest)


def plain_name(name: str) -> bool:
    """Whether `name` is one path component that names neither its directory itself nor the
    parent: what a model's entry in stage_dir, or each part of a file's path in a model, is."""
    return name not in ("", ".", "..") and "/" not in name and "\0" not in name


def manifest_digest(manifest: dict) -> str:
    return hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()
