"""What sbatch prints, parsed (the other commands' output: runtime/slurm_queue.py,
  slurm_scontrol.py, slurm_cluster.py)."""

from __future__ import annotations

import re

from ..errors import HpcserveError

_JOB_ID = re.compile(r"^(\d+)(;[\w.-]+)?$")


def parse_job_id(out: str) -> str:
    """`sbatch --parsable` prints `ID` or `ID;cluster`; anything else is not a job id."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if not lines or not _JOB_ID.match(lines[-1]):
        raise HpcserveError(f"sbatch printed no job id: {out.strip()!r}")
    return _JOB_ID.match(lines[-1]).group(1)
