"""state.json: the job's phase, its history and what the operator commands show, written
atomically (a reader never sees half a file). Its keys are declared in contract.STATE_SCHEMA."""

from __future__ import annotations

import json
import os
import time


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

    def update(self, phase: str | None = None, **fields) -> None:
        if phase:
            self.data["phase"] = phase
            self.data["history"].append({"phase": phase, "at": round(now(), 3)})
        self.data.update(fields)
        self.data["updated_at"] = round(now(), 3)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)

    def record(self, log, phase: str | None = None, **fields) -> None:
        """update() for the stop path: a failed write is logged, never raised, so that it cannot
        skip the teardown that follows."""
        try:
            self.update(phase, **fields)
        except Exception as e:
            log(f"could not write state.json ({phase}): {e!r}")
