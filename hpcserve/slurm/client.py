"""Slurm's commands, each a small hook over a Runner: build argv, run, parse."""

from __future__ import annotations

import re

from ..errors import HpcserveError
from .runner import LocalRunner

_JOB_ID = re.compile(r"^(\d+)(;[\w.-]+)?$")


def parse_job_id(out: str) -> str:
    """`sbatch --parsable` prints `ID` or `ID;cluster`; anything else is not a job id."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    if not lines or not _JOB_ID.match(lines[-1]):
        raise HpcserveError(f"sbatch printed no job id: {out.strip()!r}")
    return _JOB_ID.match(lines[-1]).group(1)


class Slurm:
    def __init__(self, runner=None):
        self.runner = runner or LocalRunner()

    def sbatch(self, script: str, *, test_only: bool = False) -> str:
        argv = ["sbatch", "--parsable", script] if not test_only else ["sbatch", "--test-only",
                                                                        script]
        res = self.runner.run(argv)
        return parse_job_id(res.out) if not test_only else (res.err or res.out).strip()

    def scancel(self, job_id: str, *extra: str) -> None:
        self.runner.run(["scancel", *extra, job_id])

    def squeue_states(self, job_ids: list[str] | None = None) -> dict[str, tuple[str, str]]:
        """job id (het components folded to the leader) -> (state, reason or nodes)."""
        argv = ["squeue", "-h", "-t", "all", "-o", "%i|%T|%R"]
        if job_ids:
            argv += ["-j", ",".join(job_ids)]
        res = self.runner.run(argv, check=False)
        out: dict[str, tuple[str, str]] = {}
        for line in res.out.splitlines():
            parts = line.split("|")
            if len(parts) != 3:
                continue
            jid = parts[0].split("+")[0]
            out.setdefault(jid, (parts[1], parts[2]))
        return out
