"""An instance job: engines that join a running deployment's router (plan.json attach, written by
`hpcserve scale --add`) instead of starting a router of their own.

Each instance, once its engine is ready, answers its instance smoke request (the one recovery
sends a restarted instance) and only then is registered with the front job's router through its
worker API; the job's endpoint is then that router's. Recovery takes a failed instance out of the
same router and puts its replacement back. Whatever stops the job, its instances leave that
router first (LEAVE_S in all; a router that is gone is said, not waited for), then the teardown
runs as in any job.
"""

from __future__ import annotations

import os
import threading

from .contract import SERVING_PHASES
from .failures import REGISTRATION_FAILED, SMOKE_FAILED, Stop, step_identity
from .spec import Attach as AttachSpec
from .state import now, read_state
from .table import REMOVED
from .workers import RouterWorkers, WorkerApiError

LEAVE_S = 5.0  # s for taking every instance of the job out of the front's router as it stops


class Attach:
    def __init__(self, job):
        self.job = job
        self.spec: AttachSpec | None = job.plan.attach

    def join(self) -> str:
        """Every instance's smoke request, then its registration with the front's router.
        Returns the deployment's endpoint (the front's router)."""
        job = self.job
        att = self.spec = self._resolved(self.spec)
        url = att.router_url
        router = job.membership.connect(url)
        if not router.live:  # `hpcserve scale` refuses such a front; a hand-made plan may not
            raise Stop("failed", f"the router at {url} cannot take a worker while it runs "
                                 f"(workers_api {router.kind}): no instance can join it",
                       {"role": "router", "reason": REGISTRATION_FAILED})
        names = [i.name for i in job.plan.instances]
        self._each(names, job.membership.smoke, SMOKE_FAILED,
                   "{} answered its smoke request")
        job.startup.mark("smoke_request")
        self._each(names, job.membership.register, REGISTRATION_FAILED,
                   "{} registered with the router at " + url)
        job.startup.mark("router_registration")
        job.log(f"joined {att.deployment} (front job {att.front_job_id}) at {url} with "
                f"{len(names)} instance(s)")
        return url

    def _resolved(self, att: AttachSpec) -> AttachSpec:
        """attach with the front's router URL and job id: an autoscale slot, rendered before
        its front ran, reads them from the front's state.json (the front submits it while it
        serves); state.json's attach says them from here on."""
        if att.router_url and att.front_job_id:
            return att
        path = os.path.join(att.front_job_dir, "state.json")
        st = read_state(att.front_job_dir)
        # a front with no engine of a role (instances: 0) serves only once its slots do: its
        # router's address is there from router_ready on
        url = st.get("router_url") or st.get("endpoint")
        if not url or st.get("phase") not in SERVING_PHASES | {"router_ready"}:
            raise Stop("failed", f"the front job's {path} names no serving router "
                                 f"(phase {st.get('phase')}): no router to join",
                       {"role": "router", "reason": REGISTRATION_FAILED,
                        "file": path})
        att = AttachSpec({**att.as_json(), "router_url": att.router_url or url,
                          "front_job_id": att.front_job_id or st.get("job_id") or ""})
        self.job.state.update(attach=att.as_json())
        return att

    def _each(self, names: list[str], fn, what: str, done: str) -> None:
        """fn(name) for every instance at once in the job's pool (its error words or None),
        waited for while the job's checks go on; the first error stops the job."""
        job = self.job
        futs = {n: job.pool.submit(fn, n) for n in names}
        while not all(f.done() for f in futs.values()):
            job.sleep(0.02)
        for name, f in futs.items():
            err = f.result()
            if err:
                raise Stop("failed", f"{name}: {what}: {err}",
                           {**step_identity(name), "reason": what, "detail": err})
            job.log(done.format(name))

    def leave(self, budget: float = LEAVE_S) -> None:
        """The job's instances that the front's router lists are taken out of it, within
        `budget` s in all (as the job stops: no new request may reach an engine going away)."""
        job = self.job
        router = job.membership.router
        heads = job.instances.heads
        if self.spec is None or router is None or not heads:
            return
        removed = {n for n, r in job.table.recs.items() if r.status == REMOVED}
        ours = {job.membership.worker_url(n): n for n in heads if n not in removed}
        if not ours:
            return
        # one call may not take the whole budget: a router that does not answer is gone
        api = RouterWorkers(router.kind, router.url, timeout=max(0.2, min(2.0, budget / 2)),
                            headers=router.headers)
        end = now() + budget
        t = threading.Thread(target=self._take_out, args=(api, ours, end),
                             name="hpcserve-leave", daemon=True)
        t.start()
        t.join(budget)
        if t.is_alive():
            job.log(f"the router at {router.url} did not take this job's instances out within "
                    f"{budget:g} s: tearing down all the same")

    def _take_out(self, api: RouterWorkers, ours: dict, end: float) -> None:
        log = self.job.log
        try:
            listed = [u for u in api.listed() if u in ours]
            for url in listed:
                api.remove(url, wait=max(0.1, end - now()))
                log(f"{ours[url]} removed from the router ({url})")
        except WorkerApiError as e:
            log(f"taking this job's instances out of the router at {api.url}: {e}")
