"""Where the Slurm output samples live (tests/data/slurm; its README says which are recorded)."""

from __future__ import annotations

import calendar
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
REC = DATA / "22.05"


def rec(name: str) -> str:
    """A recorded 22.05 output by file name."""
    return (REC / name).read_text()


def sample(rel: str) -> str:
    return (DATA / rel).read_text()


def utc_epoch(text: str) -> int:
    """'2026-11-22T04:07:35' read as UTC, independently of the parser's own code."""
    import time
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
