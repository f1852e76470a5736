"""Serving that heals: one failed instance is taken out, replaced and put back while the rest
serve.

Once the deployment serves, a failure of one instance (its step exited, it hung, its node was
lost, its port was taken) no longer ends the job. The instance goes through these stages, one
tick at a time, so that the others are probed and served meanwhile:

  out:        taken out of the router first (its worker API), so no new request reaches it;
  stopping:   its step ended through Slurm (stopper.py; an instance of several nodes, or one
              MPI world, stops and restarts as one);
  waiting:    the role's backoff (doubling with each restart of the instance);
  starting:   a new attempt as a new named step, on its nodes or with a spare node in the place
              of a lost one; its leader must answer its health path as its own process;
  checking:   one request to the instance itself (the engine's instance smoke);
  router:     only for a router that takes no worker while it runs: the serving loop (job.py)
              restarts it with the serving set;
  registering: put back into the router; then it serves again.

Each instance's status lives in the instance table (table.py), its place in the router in
membership.py; a failure reaches recovery as an event of the serving loop (events.py).

The deployment's phase says how it serves meanwhile: degraded (an instance is out), recovering
(a role has fewer serving instances than its minimum), failed only once an instance that its
role needs has spent its restarts. state.json's "instances" keeps each instance's status and
every attempt. An instance drained on request (drain.py) leaves through the same steps, without
a restart, and no longer counts against its role's minimum.
"""

from __future__ import annotations

import os

from . import caches
from .events import RouterRestartAsked
from .failures import (NODE_LOST, PORT_TAKEN, READINESS_TIMEOUT, REGISTRATION_FAILED, SMOKE_FAILED,
                       Stop, step_identity)
from .probes import probe
from .state import now
from .table import DRAINING, FAILED, OUT, REMOVED, RESTARTING, SERVING, Rec

class Recovery:
    """The restart machine: one failed instance through its stages, one tick at a time. Its
    status lives in the instance table (table.py), its router membership in membership.py."""

    def __init__(self, job):
        self.job = job
        self.table, self.membership, self.events = job.table, job.membership, job.events
        self.stopper = job.stopper
        self.pool = job.pool
        self.drained: set[str] = set()

    # -- a failure
    def failed(self, name: str, reason: str, failure: dict) -> None:
        """Instance `name` failed (`reason`: "exited with code 137", "hung", "node lost"...):
        out of the router at once, its step stopped; restarted later by tick()."""
        rec = self.table.recs[name]
        lost = self._lost_nodes(failure)
        rec.lost |= lost
        for node in lost:
            self._drain(node, failure.get("slurm_state") or "its slurmd does not answer")
        if rec.status in (OUT, FAILED, REMOVED):
            return  # already out: a second word on the same failure
        job, at = self.job, now()
        self.table.end_attempt(rec, reason, failure, at)
        if rec.status == DRAINING:  # out of the router already, and not to be restarted
            job.log(f"{name} {reason} while draining")
            self.stopper.stop(rec)
            return
        where = f" on node {failure['node']}" if failure.get("node") else ""
        job.log(f"{name} {reason}{where}: taking it out")
        if rec.status == SERVING:
            rec.failed_at = at
        rec.why_first = reason
        if not rec.taken_out:
            self.membership.deregister(rec)
        rec.taken_out = False
        self.stopper.stop(rec)
        pol = job.plan.recovery[rec.role]
        if not pol.restart or rec.restarts >= pol.max_restarts:
            spent = (f"its {pol.max_restarts} restart(s) are spent" if pol.restart
                     else "restart: false")
            self.table.set_status(rec, FAILED, f"{reason}; {spent}")
        else:
            rec.next_try_at = at + pol.backoff_s * 2 ** rec.restarts
            self.table.set_status(rec, OUT, reason)
        self._judge(rec, failure)

    def node_lost(self, node: str, state: str) -> None:
        """Slurm reports `node` down: every instance with a rank there fails as node lost, and a
        spare there is no one's replacement."""
        job = self.job
        job.instances.drop_spare(node)
        for name in job.instances.using(node):
            if name in self.table.recs:
                rank = next(int(r[0]) for r in job.instances.nodes[name] if r[1] == node)
                job.supervisor.lost_steps.add(name)
                self.failed(name, NODE_LOST, {
                    **step_identity(name), "node": node, "node_rank": rank,
                    "reason": NODE_LOST, "exit_code": None, "slurm_state": state})
        self._drain(node, state)

    # -- one step forward for every instance that is not serving
    def tick(self) -> None:
        if not self.table.active:
            return
        for rec in list(self.table.recs.values()):
            if rec.status in (OUT, RESTARTING):  # its step's end is stopper.py's
                step = getattr(self, f"_{rec.stage}", None)
                if step:
                    step(rec)

    def _waiting(self, rec: Rec) -> None:
        if now() < (rec.next_try_at or 0):
            return
        why = self.job.instances.move(rec.name, rec.lost) if rec.lost else None
        if why:
            # With --no-kill Slurm takes a lost node out of the allocation for good: the
            # instance cannot come back in this job (a requeue may, on other nodes).
            self.job.log(f"{rec.name} cannot restart: {why}")
            rec.stage = None
            self.table.set_status(rec, FAILED, f"{rec.why_first}; {why}")
            self._judge(rec, rec.attempts[-1]["failure"] or step_identity(rec.name))
            return
        self._start_attempt(rec)

    def _start_attempt(self, rec: Rec) -> None:
        job = self.job
        rec.attempt += 1
        rec.restarts += 1
        rec.lost = set()
        rec.nodes = [r[1] for r in job.instances.nodes[rec.name]]
        rec.next_try_at = None
        # what the teardown knew of the last attempt (hung: KILL; lost: its srun client only)
        job.supervisor.hung_steps.discard(rec.name)
        job.supervisor.lost_steps.discard(rec.name)
        try:
            os.unlink(os.path.join(job.dir, "run", "ports", rec.name))
        except FileNotFoundError:
            pass
        job.instances.start(job.steps, rec.name, rec.attempt)
        spec = job.instances.spec(rec.name)
        job.state.data.setdefault("health_urls", {})[rec.name] = job.instances.health_url(
            job.instances.heads, spec)
        rec.attempts.append(self.table.attempt_entry(rec, now()))
        rec.deadline = now() + job.plan.readiness.engine_timeout
        rec.stage = "starting"
        job.log(f"{rec.name}: attempt {rec.attempt} on {', '.join(rec.nodes)}")
        self.table.set_status(rec, RESTARTING, f"attempt {rec.attempt} starting")

    def _starting(self, rec: Rec) -> None:
        """Its leader's health path, polled every readiness.poll_interval, until it answers as
        this attempt's own process."""
        job = self.job
        if now() > rec.deadline:
            self.failed(rec.name, READINESS_TIMEOUT, {
                **step_identity(rec.name), "reason": READINESS_TIMEOUT,
                "detail": f"not healthy within {job.plan.readiness.engine_timeout} s"})
            return
        if rec.task is None:
            if now() >= rec.next_poll:
                url = job.instances.health_url(job.instances.heads, job.instances.spec(rec.name))
                rec.task = self.pool.submit(probe, url, 2.0)
                rec.next_poll = now() + job.plan.readiness.poll_interval
            return
        if not rec.task.done():
            return
        kind, _ = rec.task.result()
        rec.task = None
        try:
            ours = kind is None and job.instances.owns_port(rec.name, wait=0.0)
        except Stop as s:  # another process holds its port on that node
            self.failed(rec.name, PORT_TAKEN, s.failure or step_identity(rec.name))
            return
        if ours:
            job.log(f"{rec.name}: attempt {rec.attempt} healthy")
            rec.stage = "checking"
            rec.task = self.pool.submit(self.membership.smoke, rec.name)

    def _checking(self, rec: Rec) -> None:
        if not rec.task.done():
            return
        err = rec.task.result()
        rec.task = None
        if err:
            self.failed(rec.name, SMOKE_FAILED, {
                **step_identity(rec.name), "reason": SMOKE_FAILED, "detail": err})
            return
        self.job.log(f"{rec.name}: attempt {rec.attempt} answered its smoke request")
        if not self.membership.adds:
            # The router cannot take a worker while it runs: the serving loop starts it again
            # with the serving set (it starts a step and waits for its readiness), then
            # router_restarted() goes on.
            rec.stage = "router"
            self.events.put(RouterRestartAsked(rec.name))
            return
        self.router_restarted(rec.name)

    def router_restarted(self, name: str) -> None:
        """The router takes `name` now (its worker API, or its restart with the serving set
        included it): registered, then it serves."""
        rec = self.table.recs[name]
        rec.stage = "registering"
        rec.task = self.pool.submit(self.membership.register, rec.name)

    def _registering(self, rec: Rec) -> None:
        if not rec.task.done():
            return
        err = rec.task.result()
        rec.task = None
        if err:
            self.failed(rec.name, REGISTRATION_FAILED, {
                **step_identity(rec.name), "reason": REGISTRATION_FAILED,
                "detail": err})
            return
        at = now()
        rec.attempts[-1]["serving_at"] = round(at, 3)
        warm = caches.for_attempt(self.job, rec.name, rec.attempt)
        if warm is not None:
            rec.attempts[-1]["caches"] = warm
        rec.recover_s = round(at - rec.failed_at, 3) if rec.failed_at else None
        rec.stage = None
        self.job.log(f"{rec.name} serves again (attempt {rec.attempt}, "
                     f"{rec.recover_s} s after it failed)")
        self.table.set_status(rec, SERVING, None)

    # -- the parts of a failure
    @staticmethod
    def _lost_nodes(failure: dict) -> set[str]:
        return {failure["node"]} if failure.get("reason") == NODE_LOST and \
            failure.get("node") else set()

    def _judge(self, rec: Rec, failure: dict) -> None:
        """The deployment fails once a role is below its minimum with nothing left to restart."""
        pol = self.job.plan.recovery[rec.role]
        mine = self.table.kept(rec.role)
        serving = sum(r.status == SERVING for r in mine)
        if serving >= self.table.needed(pol, mine) or any(r.status != FAILED for r in mine
                                                    if r.status != "serving"):
            return
        node = failure.get("node")
        where = f" (node {node} lost)" if failure.get("reason") == NODE_LOST and node else ""
        raise Stop("failed", f"{rec.role} has {serving} serving instance(s) of the "
                             f"{pol.min_serving} it needs: {rec.name} {rec.why}{where}",
                   {**failure, **step_identity(rec.name)})

    def _drain(self, node: str, state: str) -> None:
        """A lost node is drained with the reason, once, where the site lets users do it
        (mostly it does not: that is said, not an error)."""
        if node in self.drained:
            return
        self.drained.add(node)
        err = self.job.slurm.command(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                                      f"Reason=hpcserve job {self.job.job_id}: lost ({state})"],
                                     retry=False)
        self.job.log(f"node {node} drained" if not err else
                     f"node {node} not drained (the site does not let this user): {err}")
