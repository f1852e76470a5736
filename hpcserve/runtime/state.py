"""state.json: the job's phase, its history and what the operator commands show, written
atomically (a reader never sees half a file). Its keys are declared in contract.STATE_SCHEMA.

Before the deployment serves, a write that fails ends the start (a job directory it cannot write
is a job that cannot be watched). Once it serves, engines that answer are worth more than a
current file: a failed write (a full disk, a quota) is counted in write_failures, said in the
job's log as the failures begin and end, and tried again (retry(), each tick of the serving
loop, at most every RETRY_S), never a reason to tear the deployment down."""

from __future__ import annotations

import json
import os
import time

RETRY_S = 5.0  # s between two tries to write state.json while writes fail and it serves


def now() -> float:
    return time.time()


def read_json(path: str) -> dict:
    """A JSON object from `path`: {} where there is none, half of one, or not an object."""
    try:
        with open(path) as f:
            got = json.load(f)
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def read_state(job_dir: str) -> dict:
    """Another job directory's state.json (a twin's, a slot's, the front's), as read_json."""
    return read_json(os.path.join(job_dir, "state.json"))


class State:
    def __init__(self, job_dir: str):
        self.path = os.path.join(job_dir, "state.json")
        try:
            with open(self.path) as f:
                self.data = json.load(f)
        except (OSError, ValueError):
            self.data = {}
        self.data.setdefault("history", [])
        self.data["job_id"] = os.environ.get("SLURM_JOB_ID")
        self.log = None    # the job's log once it serves: failed writes are then logged, not raised
        self.failing = False   # the last write failed (its time: write_failures.last_at)
        self.retry_at = 0.0

    def serving(self, log) -> None:
        """From here on a write that fails is counted and retried (the module's docstring)."""
        self.log = log

    def update(self, phase: str | None = None, **fields) -> None:
        if phase:
            self.data["phase"] = phase
            self.data["history"].append({"phase": phase, "at": round(now(), 3)})
        self.data.update(fields)
        self.flush()

    def flush(self) -> None:
        self.data["updated_at"] = round(now(), 3)
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(self.data, f, indent=1)
            os.replace(tmp, self.path)
        except OSError as e:
            if self.log is None:
                raise
            self._failed(e)
            return
        if self.failing:
            self.failing = False
            self.log(f"state.json written again, after {self.data['write_failures']['count']} "
                     "failed write(s) in all")

    def _failed(self, e: OSError) -> None:
        at = round(now(), 3)
        wf = self.data.get("write_failures") or {"count": 0, "first_at": at}
        wf.update(count=wf["count"] + 1, last_at=at, error=str(e))
        self.data["write_failures"] = wf  # in the file at the next write that succeeds
        self.retry_at = now() + RETRY_S
        if not self.failing:
            self.failing = True
            self.log(f"state.json cannot be written ({e}): the deployment serves on; "
                     f"tried again at each change and every {RETRY_S:g} s")

    def retry(self) -> None:
        """The serving loop's tick: while writes fail, state.json written again when due."""
        if self.failing and now() >= self.retry_at:
            self.flush()

    def record(self, log, phase: str | None = None, **fields) -> None:
        """update() for the stop path: a failed write is logged, never raised, so that it cannot
        skip the teardown that follows."""
        try:
            self.update(phase, **fields)
        except Exception as e:
            log(f"could not write state.json ({phase}): {e!r}")
