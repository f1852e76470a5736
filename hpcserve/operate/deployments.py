"""The local index of submitted deployments, keyed by where each runs (the remote login host and
Slurm's ClusterName), its job id and when it was submitted.

`hpcserve submit` appends one JSON line per submission; status/logs/cancel/list look jobs up here.
A job submitted with plain sbatch is found through `scontrol show job` instead (its --output
path lies in the job directory).

Job ids repeat: across clusters reached from one login host, after a controller's state is reset
(the local test cluster starts at 1 every time it comes up), and after MaxJobId wraps. So the
index keeps every submission, a deployment can be named by its job directory (unique: the
deployment's name and a timestamp), a bare job id that matches several entries is refused with
the candidates listed, and only the newest entry of a cluster's job id can be the job Slurm
lists under that id now.
"""

from __future__ import annotations

import fcntl
import json
import os
import posixpath
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from ..errors import HpcserveError


def index_path() -> Path:
    base = os.environ.get("HPCSERVE_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "hpcserve")
    return Path(base) / "deployments.jsonl"


@dataclass(frozen=True)
class Entry:
    job_id: str
    name: str
    job_dir: str
    remote: str | None = None
    submitted_at: float = 0.0
    cluster: str | None = None   # Slurm's ClusterName (None: not known, an older entry)
    allocation: str | None = None  # run as steps of this allocation (job_id is the same)
    # An instance job (`hpcserve scale`): its deployment's front job directory. None: a front
    # (the deployment as submitted). An instance job is keyed by its own job directory.
    front: str | None = None

    @property
    def handle(self) -> str:
        """The name that picks this deployment out where its job id does not: its job
        directory's name."""
        return posixpath.basename(self.job_dir.rstrip("/")) or self.job_id

    def where(self) -> str:
        site = f"cluster {self.cluster}" if self.cluster else "cluster unknown"
        return f"{site} {'via ' + self.remote if self.remote else 'from this host'}"

    def describe(self) -> str:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.submitted_at)) \
            if self.submitted_at else "at an unknown time"
        return f"{self.handle} ({self.where()}, submitted {at})"


def record(entry: Entry) -> None:
    """One line appended under an exclusive lock, on disk before it returns: submissions at
    once (a user's two shells, an autoscaling front's `hpcserve scale`) never interleave their
    lines, on an NFS home too (fcntl locks reach the server). The index is its user's alone:
    it lists every job directory and endpoint."""
    p = index_path()
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    with open(fd, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(asdict(entry)) + "\n")
        f.flush()
        os.fsync(f.fileno())


def entries() -> list[Entry]:
    """Every submission, oldest first (one line per job directory: a later line replaces it),
    read under a shared lock: never a line half written."""
    try:
        with open(index_path(), encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            lines = f.read().splitlines()
    except OSError:
        return []
    out: dict[tuple, Entry] = {}
    for ln in lines:
        try:
            d = json.loads(ln)
            e = Entry(**{k: d[k] for k in Entry.__dataclass_fields__ if k in d})
        except (ValueError, TypeError):
            continue
        out[(e.remote, e.job_dir or e.job_id)] = e
    return sorted(out.values(), key=lambda e: e.submitted_at or 0.0)


def newest_per_job(es: Iterable[Entry]) -> set[Entry]:
    """The entries that may still be the job Slurm lists under their id: of the submissions that
    got the same id on the same cluster, only the newest (a controller never gives out an id
    while it still remembers a job with it)."""
    newest: dict[tuple, Entry] = {}
    for e in es:
        key = (e.remote, e.cluster, e.job_id)
        if key not in newest or (e.submitted_at or 0.0) >= (newest[key].submitted_at or 0.0):
            newest[key] = e
    return set(newest.values())


def find(job: str, remote: str | None = None) -> Entry | None:
    """The entry named by a job id ('123', '123+1') or by its job directory (its name or path);
    with `remote`, only submissions through that login host. A job id that several submissions
    got is refused with each of them listed."""
    job_id = job.split("+")[0]
    mine = [e for e in entries() if remote is None or e.remote == remote]
    by_dir = [e for e in mine if job.rstrip("/") in (e.handle, e.job_dir.rstrip("/"))]
    if by_dir:
        return by_dir[-1]
    found = [e for e in mine if e.job_id == job_id]
    if len(found) > 1:
        raise HpcserveError(
            f"job {job_id} names {len(found)} deployments: "
            + "; ".join(e.describe() for e in reversed(found))
            + f"; name one by its job directory instead, e.g. {found[-1].handle}")
    return found[0] if found else None


def reference(entry: Entry) -> str:
    """How a command names this deployment: its job id where no other submission got the same
    id, else its job directory's name."""
    same = [e for e in entries() if e.job_id == entry.job_id and e.remote == entry.remote]
    return entry.job_id if len(same) <= 1 else entry.handle


def new_entry(job_id: str, name: str, job_dir: str, remote: str | None,
              cluster: str | None = None, allocation: str | None = None,
              front: str | None = None) -> Entry:
    return Entry(job_id=job_id, name=name, job_dir=job_dir, remote=remote,
                 submitted_at=time.time(), cluster=cluster, allocation=allocation, front=front)


def instance_jobs(front: Entry, among: Iterable[Entry] | None = None) -> list[Entry]:
    """The instance jobs `hpcserve scale` submitted for the deployment whose front is `front`,
    oldest first."""
    jd = front.job_dir.rstrip("/")
    return [e for e in (entries() if among is None else among)
            if e.front and e.front.rstrip("/") == jd and e.remote == front.remote]

