"""The router's workers, as this deployment wants them: compared once a liveness round while a
job that runs its own router serves.

A router's worker API is reachable by anyone who reaches its address, and not every router
guards it (vllm-router 0.1.17 lists and adds workers without its --api-key): another user could
add a worker of theirs, which then receives prompts, or take this deployment's workers out.
Each round the worker list is read (in recovery's pool, so the round never waits on it) and
set against what the deployment knows:

- a listed worker that is none of this job's instances nor any instance job's under its scale/
  (their state.json names every instance's URL before it registers: runtime/job.py) is removed
  when two readings in a row list it, and the log names it: an instance job's registration in
  flight is never undone;
- an instance of this job that serves but is not listed is put back at once, and the log says
  so: a PD router left without a decode answers nothing. An instance this job's recovery or
  drains are moving (not serving, taken out, registering) is theirs to put in or out.
"""

from __future__ import annotations

import glob
import os
from concurrent.futures import Future
from urllib.parse import urlsplit

from .contract import SCALE_DIR, TERMINAL_PHASES
from .state import now, read_state
from .table import SERVING
from .workers import WorkerApiError


def base(url: str) -> str:
    """http://host:port of a worker or health URL."""
    u = urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


class Reconcile:
    def __init__(self, job):
        self.job = job
        self.reading: Future | None = None
        self.read_at = 0.0               # when the reading in flight was asked for
        self.unknown: set[str] = set()   # what the last reading found, for the next to confirm
        self.acting: dict[str, Future] = {}  # url -> its removal or putting back, in flight

    def round(self) -> None:
        """Once a liveness round: the next reading of the worker list, unless one is in flight
        (a router slow to answer is waited for, not asked twice)."""
        members = self.job.membership
        if members.router is not None and members.router.live and self.reading is None:
            self.read_at, self.reading = now(), self.job.pool.submit(self._read)

    def poll(self) -> None:
        """Between rounds, as soon as a reading is in: act on it."""
        if self.reading is None or not self.reading.done():
            return
        listed, self.reading = self.reading.result(), None
        if listed is not None:
            self._compare({base(u) for u in listed})

    def _read(self) -> list[str] | None:
        try:
            return self.job.membership.router.listed()
        except WorkerApiError as e:
            self.job.log(f"reading the router's workers: {e}")
            return None

    def _compare(self, listed: set[str]) -> None:
        members, pool = self.job.membership, self.job.pool
        mine = {members.worker_url(n): r for n, r in self.job.table.recs.items()}
        unknown = listed - set(mine)
        if unknown:  # scale/'s state files read only when a worker is not this job's own
            unknown -= self._instance_jobs()
        # an instance of this job serving (since before the reading) and not listed is put back
        # at once: without it the router may answer nothing (a PD router with no decode)
        missing = {u for u, r in mine.items() if r.status == SERVING and not r.taken_out
                   and r.task is None and r.since < self.read_at} - listed
        self.acting = {u: f for u, f in self.acting.items() if not f.done()}
        # in the pool: a queued change may take seconds, and the rounds go on meanwhile
        for url in sorted((unknown & self.unknown) - set(self.acting)):
            self.acting[url] = pool.submit(self._remove, url)
        for url in sorted(missing - set(self.acting)):
            self.acting[url] = pool.submit(self._put_back, url, mine[url].name)
        self.unknown = unknown

    def _instance_jobs(self) -> set[str]:
        """Every instance URL the instance jobs under scale/ name while they run (one joining
        says its URLs before it registers, one leaving takes itself out before it ends). One
        that ended names none: a worker another user puts at its address later is unknown."""
        out = set()
        for d in glob.glob(os.path.join(self.job.dir, SCALE_DIR, "*", "")):
            st = read_state(d)
            if st.get("phase") not in TERMINAL_PHASES:
                out |= {base(u) for u in (st.get("health_urls") or {}).values()}
        return out

    def _remove(self, url: str) -> None:
        log = self.job.log
        try:
            self.job.membership.router.remove(url)
            log(f"router: removed {url}, a worker none of this deployment's instances is")
        except WorkerApiError as e:
            log(f"router: could not remove {url}, a worker none of this deployment's "
                f"instances is: {e}")

    def _put_back(self, url: str, name: str) -> None:
        err = self.job.membership.register(name)
        self.job.log(f"router: {name} ({url}) was no longer listed; "
                     + (f"putting it back failed: {err}" if err else "put back"))
