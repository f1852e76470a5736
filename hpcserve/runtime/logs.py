"""The job's own log (logs/hpcserve-job.log) and reading the logs its steps write.

A step's srun log is appended to across requeues, so every reader takes an offset: the size the
file had when this try started the step.
"""

from __future__ import annotations

import os
import re
import sys
import time


class JobLog:
    """Timestamped lines to stdout (the batch log) and logs/hpcserve-job.log, measured from the
    batch script's start."""

    def __init__(self, job_dir: str, t0: float):
        self.t0 = t0
        self.fh = open(os.path.join(job_dir, "logs", "hpcserve-job.log"), "a", buffering=1)

    def __call__(self, msg: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{time.time() - self.t0:7.2f}s] {msg}"
        # Best-effort: a full disk or a closed stdout must not abort a teardown half-way.
        for out in (sys.stdout, self.fh):
            try:
                out.write(line + "\n")
                out.flush()
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        self.fh.close()


def read_from(path: str, offset: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def first_line(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.readline()
    except OSError:
        return ""


def tail(path: str, n: int = 20, offset: int = 0) -> list[str]:
    return read_from(path, offset).splitlines()[-n:]


_ERROR_LINE = re.compile(r"\b(ERROR|FATAL|CRITICAL|Error|Fatal|Segfault|Segmentation fault|"
                         r"Traceback|Aborted)\b")


def last_error(lines: list[str]) -> str | None:
    """The last line that reports an error (Python's, an engine logger's, a crash handler's),
    not a line of a stack trace."""
    for ln in reversed(lines):
        if _ERROR_LINE.search(ln) and not ln.lstrip().startswith(("File ", "at ", "#")):
            return ln.strip()[:500]
    return None
