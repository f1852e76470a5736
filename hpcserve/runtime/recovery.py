"""Serving that heals: one failed instance is taken out, replaced and put back while the rest
serve.

Once the deployment serves, a failure of one instance (its step exited, it hung, its node was
lost, its port was taken) no longer ends the job. The instance goes through these stages, one
tick at a time, so that the others are probed and served meanwhile:

  out:        taken out of the router first (its worker API), so no new request reaches it;
  stopping:   its step ended through Slurm (an instance of several nodes, or one MPI world,
              stops and restarts as one);
  waiting:    the role's backoff (doubling with each restart of the instance);
  starting:   a new attempt as a new named step, on its nodes or with a spare node in the place
              of a lost one; its leader must answer its health path as its own process;
  checking:   one request to the instance itself (the engine's instance smoke);
  registering: put back into the router; then it serves again.

The deployment's phase says how it serves meanwhile: degraded (an instance is out), recovering
(a role has fewer serving instances than its minimum), failed only once an instance that its
role needs has spent its restarts. state.json's "instances" keeps each instance's status and
every attempt. An instance drained on request (drain.py) leaves through the same steps, without
a restart, and no longer counts against its role's minimum.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor

from . import caches
from .failures import Stop, step_identity
from .health import front_router, http_json, probe, router_auth
from .state import now
from .workers import RouterWorkers, WorkerApiError

STOP_WAIT_S = 10.0   # s an old attempt's step may take to end after its signal, then KILL


class Rec:
    """One instance's record: state.json's entry plus where its recovery stands."""

    def __init__(self, spec: dict, nodes: list[str], at: float):
        self.name, self.role, self.index = spec["name"], spec["role"], spec["index"]
        self.status, self.why, self.stage = "serving", None, None
        self.attempt, self.restarts = 0, 0
        self.nodes, self.since = nodes, at
        self.recover_s: float | None = None
        self.next_try_at: float | None = None
        self.failed_at: float | None = None
        self.deadline = 0.0
        self.next_poll = 0.0
        self.taken_out = False                # out of the router before its failure is judged
        self.lost: set[str] = set()
        self.task: Future | None = None       # the probe, smoke or registration under way
        self.old = None                       # the srun client of the attempt being stopped
        self.why_first: str | None = None     # what took it out, before any "cannot restart"
        self.attempts: list[dict] = []

    def as_state(self) -> dict:
        return {"role": self.role, "index": self.index, "status": self.status, "why": self.why,
                "attempt": self.attempt, "restarts": self.restarts, "nodes": self.nodes,
                "since": round(self.since, 3), "recover_s": self.recover_s,
                "next_try_at": self.next_try_at and round(self.next_try_at, 3),
                "attempts": self.attempts}


class Recovery:
    def __init__(self, job):
        self.job = job
        self.recs: dict[str, Rec] = {}
        self.active = False
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="hpcserve-recovery")
        self.router: RouterWorkers | None = None
        self.drained: set[str] = set()
        self._phase = "serving"

    # -- while serving
    def begin(self, router_url: str | None) -> None:
        """The deployment serves: from here on an instance failure is recovered, not fatal."""
        job = self.job
        at = now()
        for spec in job.plan["instances"]:
            rec = Rec(spec, [r[1] for r in job.instances.nodes[spec["name"]]], at)
            rec.attempts.append(self._attempt_entry(rec, at))
            rec.attempts[-1]["serving_at"] = round(at, 3)
            if job.plan.get("caches"):
                rec.attempts[-1]["caches"] = caches.read(job.dir, rec.name)
            self.recs[spec["name"]] = rec
        if router_url:
            self.connect(router_url)
        self.active = True
        self._save()

    def connect(self, router_url: str) -> RouterWorkers:
        """The worker API of the router the instances serve behind: the job's own, or the
        running one it joins (attach)."""
        # a router started with --api-key wants the key on its worker API too
        self.router = RouterWorkers(front_router(self.job.plan)["workers_api"], router_url,
                                    headers=router_auth(self.job.plan))
        return self.router

    def take_out(self, name: str) -> None:
        """Out of the router now (its failure is judged next): a serving instance whose step
        just ended."""
        rec = self.recs.get(name) if self.active else None
        if rec is not None and rec.status == "serving" and not rec.taken_out:
            rec.taken_out = True
            self.deregister(rec)

    def handles(self, name: str | None) -> bool:
        return self.active and name in self.recs

    def serving(self, name: str) -> bool:
        return self.recs[name].status == "serving" if name in self.recs else True

    def all_serving(self) -> bool:
        """Every instance serves: the router's readiness counts them all."""
        return all(r.status == "serving" for r in self.recs.values())

    def kept(self, role: str | None = None) -> list[Rec]:
        """The instances (of `role`) that are not leaving on request (draining or removed)."""
        return [r for r in self.recs.values()
                if r.status not in ("draining", "removed") and role in (None, r.role)]

    @staticmethod
    def needed(pol: dict, kept: list[Rec]) -> int:
        """The role's minimum of serving instances, lowered by those leaving on request."""
        return min(pol["min_serving"], len(kept))

    # -- a failure
    def failed(self, name: str, reason: str, failure: dict) -> None:
        """Instance `name` failed (`reason`: "exited with code 137", "hung", "node lost"...):
        out of the router at once, its step stopped; restarted later by tick()."""
        rec = self.recs[name]
        lost = self._lost_nodes(failure)
        rec.lost |= lost
        for node in lost:
            self._drain(node, failure.get("slurm_state") or "its slurmd does not answer")
        if rec.status in ("out", "failed", "removed"):
            return  # already out: a second word on the same failure
        job, at = self.job, now()
        self.end_attempt(rec, reason, failure, at)
        if rec.status == "draining":  # out of the router already, and not to be restarted
            job.log(f"{name} {reason} while draining")
            self.stop_step(rec)
            return
        where = f" on node {failure['node']}" if failure.get("node") else ""
        job.log(f"{name} {reason}{where}: taking it out")
        if rec.status == "serving":
            rec.failed_at = at
        rec.why_first = reason
        if not rec.taken_out:
            self.deregister(rec)
        rec.taken_out = False
        self.stop_step(rec)
        pol = job.plan["recovery"][rec.role]
        if not pol["restart"] or rec.restarts >= pol["max_restarts"]:
            spent = (f"its {pol['max_restarts']} restart(s) are spent" if pol["restart"]
                     else "restart: false")
            self.set_status(rec, "failed", f"{reason}; {spent}")
        else:
            rec.next_try_at = at + pol["backoff_s"] * 2 ** rec.restarts
            self.set_status(rec, "out", reason)
        self._judge(rec, failure)

    def node_lost(self, node: str, state: str) -> None:
        """Slurm reports `node` down: every instance with a rank there fails as node lost, and a
        spare there is no one's replacement."""
        job = self.job
        job.instances.drop_spare(node)
        for name in job.instances.using(node):
            if name in self.recs:
                rank = next(int(r[0]) for r in job.instances.nodes[name] if r[1] == node)
                job.supervisor.lost_steps.add(name)
                self.failed(name, "node lost", {
                    **step_identity(name), "node": node, "node_rank": rank,
                    "reason": "node lost", "exit_code": None, "slurm_state": state})
        self._drain(node, state)

    # -- one step forward for every instance that is not serving
    def tick(self) -> None:
        if not self.active:
            return
        for rec in list(self.recs.values()):
            if rec.status in ("out", "restarting") or rec.stage == "stopping":
                step = getattr(self, f"_{rec.stage}", None)
                if step:
                    step(rec)

    def _stopping(self, rec: Rec) -> None:
        old = rec.old
        if old is None or old.poll() is not None:
            rec.old = None
            rec.stage = "waiting" if rec.status == "out" else None
            return
        if now() > rec.deadline:
            self.job.log(f"{rec.name}: attempt {rec.attempt} did not end: SIGKILL to its srun")
            try:
                old.kill()
            except OSError:
                pass
            rec.deadline = now() + STOP_WAIT_S

    def _waiting(self, rec: Rec) -> None:
        if now() < (rec.next_try_at or 0):
            return
        why = self.job.instances.move(rec.name, rec.lost) if rec.lost else None
        if why:
            # With --no-kill Slurm takes a lost node out of the allocation for good: the
            # instance cannot come back in this job (a requeue may, on other nodes).
            self.job.log(f"{rec.name} cannot restart: {why}")
            rec.stage = None
            self.set_status(rec, "failed", f"{rec.why_first}; {why}")
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
        rec.attempts.append(self._attempt_entry(rec, now()))
        rec.deadline = now() + job.plan["readiness"]["engine_timeout"]
        rec.stage = "starting"
        job.log(f"{rec.name}: attempt {rec.attempt} on {', '.join(rec.nodes)}")
        self.set_status(rec, "restarting", f"attempt {rec.attempt} starting")

    def _starting(self, rec: Rec) -> None:
        """Its leader's health path, polled every readiness.poll_interval, until it answers as
        this attempt's own process."""
        job = self.job
        if now() > rec.deadline:
            self.failed(rec.name, "readiness timeout", {
                **step_identity(rec.name), "reason": "readiness timeout",
                "detail": f"not healthy within {job.plan['readiness']['engine_timeout']} s"})
            return
        if rec.task is None:
            if now() >= rec.next_poll:
                url = job.instances.health_url(job.instances.heads, job.instances.spec(rec.name))
                rec.task = self.pool.submit(probe, url, 2.0)
                rec.next_poll = now() + job.plan["readiness"]["poll_interval"]
            return
        if not rec.task.done():
            return
        kind, _ = rec.task.result()
        rec.task = None
        try:
            ours = kind is None and job.readiness.owns_port(rec.name, wait=0.0)
        except Stop as s:  # another process holds its port on that node
            self.failed(rec.name, "port taken", s.failure or step_identity(rec.name))
            return
        if ours:
            job.log(f"{rec.name}: attempt {rec.attempt} healthy")
            rec.stage = "checking"
            rec.task = self.pool.submit(self.smoke, rec.name)

    def _checking(self, rec: Rec) -> None:
        if not rec.task.done():
            return
        err = rec.task.result()
        rec.task = None
        if err:
            self.failed(rec.name, "smoke request failed", {
                **step_identity(rec.name), "reason": "smoke request failed", "detail": err})
            return
        self.job.log(f"{rec.name}: attempt {rec.attempt} answered its smoke request")
        if self.router is not None and not self.router.live:
            # The router cannot take a worker while it runs: started again with the serving
            # set, here in the job's own thread (it starts a step and waits for its readiness).
            try:
                self.job.restart_router()
            except Stop as e:
                self.failed(rec.name, "router restart failed", {
                    **step_identity("router"), "reason": "router restart failed",
                    "detail": e.reason})
                return
        rec.stage = "registering"
        rec.task = self.pool.submit(self.register, rec.name)

    def _registering(self, rec: Rec) -> None:
        if not rec.task.done():
            return
        err = rec.task.result()
        rec.task = None
        if err:
            self.failed(rec.name, "router registration failed", {
                **step_identity(rec.name), "reason": "router registration failed",
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
        self.set_status(rec, "serving", None)

    # -- the parts of a failure
    def _attempt_entry(self, rec: Rec, at: float) -> dict:
        inst = self.job.instances
        first = inst.nodes[rec.name][0]
        return {"attempt": rec.attempt, "nodes": list(rec.nodes), "started_at": round(at, 3),
                "serving_at": None, "ended_at": None, "end": None, "failure": None,
                "log": inst.log_file(rec.name, 0, first[1]),
                "srun_log": self.job.steps.srun_log_rel(rec.name)}

    def end_attempt(self, rec: Rec, reason: str, failure: dict, at: float) -> None:
        last = rec.attempts[-1]
        if last["ended_at"] is None:
            last.update(ended_at=round(at, 3), end=reason, failure=failure)

    @staticmethod
    def _lost_nodes(failure: dict) -> set[str]:
        return {failure["node"]} if failure.get("reason") == "node lost" and \
            failure.get("node") else set()

    def deregister(self, rec: Rec) -> Future | None:
        """Out of the router before anything else: no new request may reach it. The removal's
        future (its result: whether the router took it out), None without a router to ask."""
        if self.router is None or not self.router.removes:
            return None
        url = self.worker_url(rec.name)
        log = self.job.log

        def remove() -> bool:  # in the pool: a queued removal may take seconds to be done
            try:
                self.router.remove(url)
                log(f"{rec.name} removed from the router ({url})")
                return True
            except WorkerApiError as e:
                log(f"{rec.name}: the router did not remove {url}: {e}")
                return False

        return self.pool.submit(remove)

    def stop_step(self, rec: Rec, sig: str | None = None) -> None:
        """Its step ended through Slurm (by step id; through its srun client on a lost node):
        `sig`, else KILL for a hung engine (it answers no TERM), TERM for any other."""
        job = self.job
        rec.task = None
        if rec.name not in job.steps:
            return
        proc = job.steps[rec.name]
        if proc.poll() is None:
            lost = job.supervisor.lost_steps if rec.lost else set()
            sig = sig or ("KILL" if rec.why_first == "hung" else "TERM")
            job.steps.signal([rec.name], sig,
                             job.step_ids(errors=Exception), lost, job.slurm, job.log)
        rec.old = job.steps.retire(rec.name)
        rec.deadline = now() + STOP_WAIT_S
        rec.stage = "stopping"

    def set_status(self, rec: Rec, status: str, why: str | None) -> None:
        rec.status, rec.why, rec.since = status, why, now()
        self._save()

    def _judge(self, rec: Rec, failure: dict) -> None:
        """The deployment fails once a role is below its minimum with nothing left to restart."""
        pol = self.job.plan["recovery"][rec.role]
        mine = self.kept(rec.role)
        serving = sum(r.status == "serving" for r in mine)
        if serving >= self.needed(pol, mine) or any(r.status != "failed" for r in mine
                                                    if r.status != "serving"):
            return
        node = failure.get("node")
        where = f" (node {node} lost)" if failure.get("reason") == "node lost" and node else ""
        raise Stop("failed", f"{rec.role} has {serving} serving instance(s) of the "
                             f"{pol['min_serving']} it needs: {rec.name} {rec.why}{where}",
                   {**failure, **step_identity(rec.name)})

    def phase(self) -> str:
        """serving, degraded (an instance is out) or recovering (a role below its minimum); an
        instance drained on request is neither."""
        below = False
        for role, pol in self.job.plan["recovery"].items():
            mine = self.kept(role)
            below |= sum(r.status == "serving" for r in mine) < self.needed(pol, mine)
        kept_serving = all(r.status == "serving" for r in self.kept())
        return "recovering" if below else "serving" if kept_serving else "degraded"

    def _save(self) -> None:
        job = self.job
        phase = self.phase()
        job.state.record(job.log, phase if phase != self._phase else None,
                         instances={n: r.as_state() for n, r in self.recs.items()},
                         excluded_nodes=sorted(job.instances.moved) + sorted(
                             {n for r in self.recs.values() for n in r.lost}))
        if phase != self._phase:
            job.log(f"deployment {phase}")
        self._phase = phase
        job.file_sd.update()  # the site's Prometheus scrapes the instances in the router

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

    # -- in the pool's threads: what may take seconds
    def worker_url(self, name: str) -> str:
        inst = self.job.instances
        return f"http://{inst.heads[name]}:{inst.spec(name)['port']}"

    def smoke(self, name: str) -> str | None:
        """One request to the instance itself (the engine's instance smoke): its error words,
        or None."""
        job = self.job
        spec = job.instances.spec(name)
        smoke = spec.get("smoke") or {"kind": "get", "path": spec["health_path"]}
        url = self.worker_url(name) + smoke["path"]
        tokens = max(1, job.plan["readiness"]["smoke_tokens"])
        try:
            if smoke["kind"] == "get":
                code, _ = http_json(url, timeout=job.readiness.SMOKE_TIMEOUT)
                return None if code == 200 else f"HTTP {code} from {url}"
            body = {"model": job.plan["served_name"], "max_tokens": tokens,
                    "messages": [{"role": "user", "content": "hpcserve smoke test: say hello"}]}
            code, resp = http_json(url, body, timeout=job.readiness.SMOKE_TIMEOUT,
                                   headers=router_auth(job.plan))
        except Exception as e:  # urllib's many errors: each is a failed smoke request
            return f"{url}: {e}"
        got = ((resp or {}).get("usage") or {}).get("completion_tokens") or 0
        return None if got > 0 else f"{url} returned {got} tokens"

    def register(self, name: str) -> str | None:
        """Back into the router through its worker API: its error words, or None."""
        if self.router is None or not self.router.live:
            return None
        spec = self.job.instances.spec(name)
        try:
            self.router.add(self.worker_url(name), spec["role"], spec["ports"].get("bootstrap"))
        except WorkerApiError as e:
            return str(e)
        return None
