"""Drain requests: one serving instance leaves the deployment on request (`hpcserve scale
--remove`), without failing a request.

The operator command writes run/control/drain-<instance>.json (contract.CONTROL_DIR); the
orchestrator takes each request within half a second (renamed .taken, or .refused with the reason
in the job log) and moves the instance through these stages, one tick at a time while the others
serve and are probed:

  leaving:   out of the router (its worker API), so that no new request reaches it;
  settling:  its in-flight requests finish: its engine's `pending` and `queued` gauges
             (plan.json's instance metrics, read as liveness reads them) read 0 twice in a
             row, or the request's
             timeout_s passes; the log says which;
  stopping:  its step ended through Slurm (its engine's stop signal, TERM, as recovery stops a
             failed attempt; KILL after a grace).

Then its status is "removed": not restarted, not probed. An instance job (plan.json attach) with
none left ends "done" (the serving loop, job.py); a front job whose instances are all removed
keeps serving its router.
"""

from __future__ import annotations

import json
import math
import os
from collections import namedtuple
from concurrent.futures import Future

from .contract import CONTROL_DIR, DRAIN_PREFIX, DRAIN_SUFFIX, drain_request_path
from .probes import metrics_of, metrics_totals
from .state import now
from .stopper import STOPPING
from .table import DRAINING, REMOVED, SERVING

POLL_S = 0.2     # s between reads of a draining engine's pending gauges
ZEROS = 2        # reads of 0 in a row: a request the router sent just before it left is counted


class DrainRequestError(Exception):
    """A drain request file this runtime cannot act on; the message names the file and field."""


# A drain request as read: job_id, the Slurm job it is for (None: it names none)
Request = namedtuple("Request", "timeout_s requested_at job_id")


def write_request(job_dir: str, instance: str, timeout_s: float, job_id: str) -> None:
    """A drain request for `instance` of job `job_id` in `job_dir`, as `hpcserve scale --remove`
    writes one (a temporary file renamed: the job never reads half of it): renewal hands its
    own instances over this way, autoscale a slot's. It names its job, so that a request left
    in a directory another job runs in later (a renewal's twin, a slot) drains nothing there."""
    path = drain_request_path(job_dir, instance)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"timeout_s": round(timeout_s, 1), "requested_at": now(), "job_id": job_id}, f)
    os.replace(path + ".tmp", path)


def read_request(path: str) -> Request:
    """A drain request file: timeout_s a number >= 0; requested_at, when present, a number
    too; job_id, when present, a string."""
    try:
        with open(path) as f:
            req = json.load(f)
    except (OSError, ValueError) as e:
        raise DrainRequestError(f"{path}: not a JSON drain request: {e}") from None
    if not isinstance(req, dict):
        raise DrainRequestError(f"{path}: not a JSON object")
    for field, need in (("timeout_s", True), ("requested_at", False)):
        v = req.get(field)
        if v is None and not need:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < 0:
            raise DrainRequestError(f"{path}: {field} must be a number >= 0, not {v!r}")
    job_id = req.get("job_id")
    if job_id is not None and not isinstance(job_id, str):
        raise DrainRequestError(f"{path}: job_id must be a string, not {job_id!r}")
    return Request(float(req["timeout_s"]), req.get("requested_at"), job_id)


def requests_in(control_dir: str) -> list[tuple[str, str]]:
    """(instance name, path) of each drain request waiting in `control_dir`, by name."""
    try:
        files = sorted(os.listdir(control_dir))
    except OSError:
        return []
    return [(f[len(DRAIN_PREFIX):-len(DRAIN_SUFFIX)], os.path.join(control_dir, f))
            for f in files if f.startswith(DRAIN_PREFIX) and f.endswith(DRAIN_SUFFIX)
            and len(f) > len(DRAIN_PREFIX) + len(DRAIN_SUFFIX)]


class Drain:
    """One instance's drain under way."""

    def __init__(self, name: str, timeout_s: float, leaving: Future | None):
        self.name, self.timeout_s = name, timeout_s
        self.stage = "leaving"
        self.task: Future | None = leaving   # the removal from the router, then a metrics read
        self.left_at = 0.0
        self.deadline = 0.0
        self.next_poll = 0.0
        self.zeros = 0
        self.pending: float | None = None    # the last read of its pending gauges


class Drains:
    def __init__(self, job):
        self.job = job
        self.dir = os.path.join(job.dir, CONTROL_DIR)
        self.under_way: dict[str, Drain] = {}

    # -- every job.SCAN_S while serving
    def scan(self) -> None:
        """Take every drain request waiting, each once."""
        for name, path in requests_in(self.dir):
            self._take(name, path)

    def _take(self, name: str, path: str) -> None:
        job, members = self.job, self.job.membership
        try:
            req = read_request(path)
        except DrainRequestError as e:
            return self._refuse(path, name, str(e))
        timeout_s, stale = req.timeout_s, self._stale(req)
        if stale:
            return self._refuse(path, name, stale)
        rec = job.table.get(name)
        if rec is None:
            return self._refuse(path, name, f"this job has no instance {name}")
        if rec.status != SERVING:
            return self._refuse(path, name, f"{name} is {rec.status}, not serving")
        if not members.removes:
            return self._refuse(path, name, "the router cannot take a worker out while it "
                                            f"runs (workers_api {members.router.kind})")
        self._rename(path, ".taken")
        job.log(f"draining {name}: out of the router, then up to {timeout_s:g} s for its "
                "in-flight requests")
        job.table.set_status(rec, DRAINING, f"on request, timeout {timeout_s:g} s")
        self.under_way[name] = Drain(name, timeout_s, members.deregister(rec))

    def _stale(self, req: Request) -> str | None:
        """Why a request is not for this job: it names another (it was left in this directory
        for a job that ran here before), or, naming none, it was written before this job began."""
        own = self.job.job_id
        if req.job_id is not None:
            return None if req.job_id == own else \
                f"it is for job {req.job_id}, this is job {own or '(none)'}: left here, ignored"
        if req.requested_at is not None and req.requested_at < self.job.t0:
            return "it names no job and was written before this job began: left here, ignored"
        return None

    def _refuse(self, path: str, name: str, why: str) -> None:
        self.job.log(f"drain request for {name} refused: {why}")
        self._rename(path, ".refused")

    def _rename(self, path: str, suffix: str) -> None:
        try:
            os.replace(path, path[:-len(DRAIN_SUFFIX)] + suffix)
        except OSError as e:  # taken once all the same: this process remembers it
            self.job.log(f"could not rename {path}: {e}")

    # -- while the job waits between rounds
    def tick(self) -> None:
        for d in list(self.under_way.values()):
            getattr(self, f"_{d.stage}")(d, self.job.table.recs[d.name])

    def _leaving(self, d: Drain, rec) -> None:
        if d.task is not None and not d.task.done():
            return
        d.task = None
        d.stage, d.left_at = "settling", now()
        d.deadline = d.left_at + d.timeout_s
        if not self._metrics(d.name):
            self.job.log(f"{d.name}: its engine has no pending gauges: waiting its "
                         f"{d.timeout_s:g} s")

    def _settling(self, d: Drain, rec) -> None:
        job = self.job
        if rec.stage == STOPPING or d.name not in job.steps:  # it ended meanwhile
            return self._stop(d, rec)
        if d.task is not None:
            if not d.task.done():
                return
            got, d.task = d.task.result(), None
            d.pending = got and got[1]
            d.zeros = d.zeros + 1 if got is not None and got[1] == 0 else 0
        waited = now() - d.left_at
        if d.zeros >= ZEROS:
            job.log(f"{d.name}: no request in flight {waited:.1f} s after it left the router: "
                    "stopping it")
            return self._stop(d, rec)
        if now() >= d.deadline:
            held = "an unknown number of" if d.pending is None else f"{d.pending:g}"
            job.log(f"{d.name}: {held} request(s) still in flight after its drain timeout "
                    f"({d.timeout_s:g} s): stopping it")
            return self._stop(d, rec)
        m = self._metrics(d.name)
        if m and now() >= d.next_poll:
            # what it runs and what waits in it: its stop would fail either
            m = {**m, "pending": list(m["pending"]) + list(m["queued"])}
            d.task = job.pool.submit(metrics_totals, m, job.plan.liveness.timeout)
            d.next_poll = now() + POLL_S

    def _metrics(self, name: str) -> dict | None:
        inst = self.job.instances
        return metrics_of(self.job.plan, inst.heads, inst.spec(name))

    def _stop(self, d: Drain, rec) -> None:
        d.stage = "stopping"
        # the engine's graceful stop, as the teardown's (a hung engine's KILL does not apply)
        sig = self.job.instances.spec(d.name).stop_signal
        self.job.stopper.stop(rec, sig)

    def _stopping(self, d: Drain, rec) -> None:
        if rec.stage == STOPPING:  # the stopper's tick ends the step (KILL after a grace)
            return
        del self.under_way[d.name]
        self.job.table.end_attempt(rec, "drained", None, now())
        self.job.log(f"{d.name} removed: drained on request")
        self.job.table.set_status(rec, REMOVED, "drained on request")
