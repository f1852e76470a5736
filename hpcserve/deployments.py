"""The local index of submitted deployments: job id -> job directory (and where it runs).

`hpcserve submit` appends one JSON line per submission; status/logs/cancel/list look jobs up here.
A job submitted with plain sbatch is found through `scontrol show job` instead (its --output
path lies in the job directory).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path


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


def record(entry: Entry) -> None:
    p = index_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        f.write(json.dumps(asdict(entry)) + "\n")


def entries() -> list[Entry]:
    try:
        lines = index_path().read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out: dict[tuple, Entry] = {}
    for ln in lines:
        try:
            d = json.loads(ln)
            e = Entry(**{k: d.get(k) for k in Entry.__dataclass_fields__})
        except (ValueError, TypeError):
            continue
        out[(e.remote, e.job_id)] = e
    return list(out.values())


def find(job_id: str, remote: str | None = None) -> Entry | None:
    """The entry of a job id; with `remote`, only on that cluster. The same id on two clusters
    is ambiguous without --remote: job ids are per cluster."""
    from .errors import HpcserveError
    job_id = job_id.split("+")[0]
    found = {e.remote: e for e in entries() if e.job_id == job_id
             and (remote is None or e.remote == remote)}
    if len(found) > 1:
        raise HpcserveError(f"job {job_id} exists on several clusters ("
                            f"{', '.join(r or 'local' for r in found)}); say which with --remote")
    return next(iter(found.values()), None)


def new_entry(job_id: str, name: str, job_dir: str, remote: str | None) -> Entry:
    return Entry(job_id=job_id, name=name, job_dir=job_dir, remote=remote, submitted_at=time.time())
