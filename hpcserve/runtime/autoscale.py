"""Scaling on load: the front job adds and removes instance jobs of an autoscaled role
(plan.json autoscale, rendered at submit by hpcserve's autoscale.py) while it serves.

Every interval_s the orchestrator reads the role's signal from each serving instance's own
Prometheus metrics (the front's own instances and its slots' jobs', in its probe pool) and,
between liveness rounds, decides:

  add:     the signal summed over the serving instances, divided by the role's capacity (its
           kept instances, plus each slot submitted, pending or starting: counted once, so a
           slot on its way is never asked for twice), is above target and the capacity below
           max; or the capacity is below min, whatever the signal. `sbatch <slot>/job.sbatch`
           on the first free slot (one whose last job ended, or that never ran).
  remove:  one instance fewer would still read below target (every serving instance read),
           and the capacity is above min: a drain request (drain.write_request) to the
           newest serving slot's instance; that job drains it (runtime/drain.py) and ends
           "done".

decide() is that rule, pure (autoscale_decide.py; tests/unit/test_autoscale_decide.py); a slot
and the jobs it runs are read in autoscale_slots.py. Never a decision within cool_down_s of the
last one. Each decision is one line of the job log and kept in state.json's autoscale (what,
why, the value read), with every slot's job id and status, where `hpcserve status` and `cancel`
find the slot jobs. The front, as it stops, cancels the slot jobs it submitted: their router
goes with it.

With renew: a slot is a pair of directories (runtime/renew.py): its job is the one the pair runs
now, followed to the successor the job submitted once that serves (or the job ended); a renewal
is neither an add nor a remove, and no remove is decided while one hands over.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from .autoscale_decide import COMING, capacity, decide, signal_value
from .autoscale_slots import Slot, ended, job_instance, pair_jobs
from .contract import SCALED_IN, SERVING_PHASES, TERMINAL_PHASES
from .drain import write_request
from .failures import READINESS_TIMEOUT, Stop
from .probes import metrics_of, router_auth
from .spec import AutoscaleRole
from .state import now, read_state
from .table import FAILED, SERVING

DECISIONS_KEPT = 20   # the newest decisions state.json keeps per role
ALIVE_S = 30.0        # s between two asks whether a slot's running job still is, per slot


class Role:
    def __init__(self, name: str, spec: AutoscaleRole):
        self.name, self.spec = name, spec
        self.slots = [Slot(d) for d in spec.slots]
        self.last_at = 0.0       # the last decision (cool-down)
        self.renewed_at = 0.0    # a slot's last renewal (no remove within the cool-down)
        self.value: float | None = None
        self.capacity = 0
        self.decisions: list[dict] = []


class Autoscaler:
    def __init__(self, job):
        self.job = job
        roles = job.plan.autoscale if job.plan.autoscale is not None else {}
        self.roles = {r: Role(r, s) for r, s in sorted(roles.items())}
        self.reading = None      # the readings under way (a future of the probe pool)
        self.next_at = 0.0

    # -- a front that holds no engine of a role (roles.<role>.instances: 0): slots_alone()
    def bring_up(self) -> None:
        """Before the front serves: `min` slots of each such role submitted at once (Slurm
        queues them side by side), again for one whose job ended before it served; returns
        once every autoscaled role has a serving instance, or stops the job after
        readiness.engine_timeout (queue wait and a cold start)."""
        job = self.job
        limit = job.plan.readiness.engine_timeout
        deadline = now() + limit
        while True:
            for role in self.roles.values():
                self._fill_min(role)
            missing = [n for n, r in self.roles.items() if not self._serves(r)]
            if not missing:
                job.log("every autoscaled role serves: " + ", ".join(
                    f"{n} {[s.name for s in r.slots if s.status == 'serving']}"
                    for n, r in self.roles.items()))
                return
            if now() > deadline:
                raise Stop("failed", f"no instance of {', '.join(missing)} serves within "
                                     f"{limit} s (readiness.engine_timeout): its slot jobs "
                                     "did not start or did not serve",
                           {"role": missing[0], "reason": READINESS_TIMEOUT})
            self.tick()
            job.sleep(0.1)

    def _fill_min(self, role: Role) -> None:
        """Free slots submitted until the role's instances and coming slots make its min."""
        own = [r for r in self.job.table.kept(role.name) if r.status != FAILED]
        coming = [s for s in role.slots if s.status in COMING]
        free = [s for s in role.slots if s.status == "free" and s.task is None]
        role.capacity = len(own) + len(coming)
        for s in free[:max(0, role.spec.min - role.capacity)]:
            self._add(role, s, f"the front holds {len(own)} instance(s) of {role.name} and "
                               f"{len(coming)} slot(s) come: min {role.spec.min}")

    def _serves(self, role: Role) -> bool:
        own = self.job.table.kept(role.name)
        return any(r.status == SERVING for r in own) or \
            any(s.status == "serving" for s in role.slots)

    # -- between liveness rounds
    def tick(self) -> None:
        job = self.job
        if not self.roles or not job.table.active:
            return
        for role in self.roles.values():
            for s in role.slots:
                if s.task is not None and s.task.done():
                    self._submitted(role, s)
        if self.reading is not None:
            if not self.reading.done():
                return
            try:
                readings = self.reading.result()
            except Exception as e:  # a bug in one round's reading must not end the deployment
                job.log(f"autoscale: reading the signal failed, this round skipped: {e!r}")
                readings = {}
            self.reading = None
            for name, got in readings.items():
                self._decide(self.roles[name], *got)
            self._save()
        elif now() >= self.next_at:
            self.next_at = now() + min(r.spec.interval_s for r in self.roles.values())
            targets = {n: self._targets(r) for n, r in self.roles.items()}
            self.reading = job.pool.submit(self._read, targets)

    def _targets(self, role: Role) -> list[tuple[str | None, str]]:
        """(slot name or None for the front's own, metrics URL) of every serving instance."""
        job = self.job
        out = []
        for inst in job.plan.instances:
            rec = job.table.recs.get(inst.name)
            m = metrics_of(job.plan, job.instances.heads, inst)
            if inst.role == role.name and m and rec is not None and rec.status == SERVING:
                out.append((None, m["gauges_url"] or m["url"]))
        for s in role.slots:
            if s.status in ("serving", "draining"):
                out += [(s.name, u) for u in map(self._slot_metrics_url, pair_jobs(s)) if u]
        return out

    def _slot_metrics_url(self, job: tuple) -> str | None:
        """The metrics URL of the slot's instance in the job (id, dir), while it serves: while
        a renewal hands over, the pair's two jobs share the slot's load."""
        jid, job_dir = job
        st, inst = read_state(job_dir), job_instance(job_dir)
        name = inst.name if inst is not None else None
        if st.get("job_id") != jid or (st.get("instances") or {}).get(
                name, {}).get("status") != "serving":
            return None
        health = (st.get("health_urls") or {}).get(name)
        if not health or inst.metrics is None:
            return None
        u, m = urlsplit(health), inst.metrics
        return f"{u.scheme}://{u.netloc}{m.gauges_path or m.path}"

    def _read(self, targets: dict) -> dict:
        """In the probe pool: every slot's status (its state.json, Slurm for a queued one), then
        every serving instance's signal. role -> (values, None where one did not answer;
        slots' statuses)."""
        timeout = self.job.plan.liveness.timeout
        out = {}
        for name, role in self.roles.items():
            statuses = {s.name: (s.job_id, *self._slot_status(s)) for s in role.slots}
            sig = role.spec.signal
            values = [signal_value(url, sig.kind, sig.metrics, timeout,
                                   router_auth(self.job.plan)) for _, url in targets[name]]
            out[name] = (values, statuses)
        return out

    def _slot_status(self, s: Slot) -> tuple:
        """(job id, its dir, status): the job the slot runs now (renewals followed) and where
        it stands: its state.json once it runs, Slurm's queue before. Free only when neither
        directory of a pair runs a job."""
        if s.status in ("free", "submitting"):
            return s.job_id, s.job_dir, s.status
        if s.prev and not ended(*s.prev) and self._gone(s, s.prev[0]):
            s.prev = None  # the job a renewal took over from was killed without a word
        jid, job_dir = self._current(s)
        st = read_state(job_dir)
        if st.get("job_id") != jid:  # not started yet: still queued?
            alive = self.job.slurm.job_alive(jid)
            return (jid, job_dir, "pending") if alive is not False else self._left(s, jid,
                                                                                    job_dir)
        phase = st.get("phase")
        if phase in TERMINAL_PHASES or self._gone(s, jid):
            return self._left(s, jid, job_dir)
        if s.status == "draining" and s.drained == jid:
            return jid, job_dir, "draining"
        inst = (st.get("instances") or {}).get(s.instance_name()) or {}
        if phase in SERVING_PHASES and inst.get("status") == "serving":
            return jid, job_dir, "serving"
        return jid, job_dir, "starting"

    def _current(self, s: Slot) -> tuple:
        """(job id, dir) the slot's pair runs now: the job's successor (its state.json renew)
        once that serves or the job ended, else the job itself."""
        st = read_state(s.job_dir)
        sent = st.get("renew") or {}
        succ, twin = sent.get("successor_job_id"), sent.get("twin_dir")
        if st.get("job_id") != s.job_id or not succ or succ == s.job_id or not twin or \
                st.get("reason") == SCALED_IN:  # drained on request: its successor cancelled
            return s.job_id, s.job_dir
        tst = read_state(twin)
        inst = (tst.get("instances") or {}).get(s.instance_name()) or {}
        if st.get("phase") in TERMINAL_PHASES or (
                tst.get("job_id") == succ and inst.get("status") == "serving"):
            return succ, twin
        return s.job_id, s.job_dir

    def _left(self, s: Slot, jid, job_dir: str) -> tuple:
        """The slot's job ended: free, unless the other directory of its pair runs a job
        Slurm still knows (a successor whose record was lost): that one is the slot's then."""
        other = s.other(job_dir) if s.status != "draining" else None  # removed: not its twin
        st = read_state(other) if other else {}
        oid = st.get("job_id")
        if oid and oid != jid and st.get("phase") not in TERMINAL_PHASES and \
                self.job.slurm.job_alive(oid):
            return oid, other, "starting"
        return jid, job_dir, "free"

    def _gone(self, s: Slot, jid) -> bool:
        """Whether a job whose state.json stopped short of an end (killed with its node, or by
        SIGKILL: its orchestrator wrote nothing more) has ended for Slurm; asked every ALIVE_S
        per slot, not at every reading."""
        if now() - s.asked_at < ALIVE_S:
            return False
        s.asked_at = now()
        return self.job.slurm.job_alive(jid) is False

    # -- the decision
    def _decide(self, role: Role, values: list, statuses: dict) -> None:
        for s in role.slots:
            read_for, jid, job_dir, new = statuses.get(s.name, (None, s.job_id, s.job_dir,
                                                                s.status))
            # read before this slot was submitted (or while it was): not its job's status
            if s.task is not None or s.status == "submitting" or read_for != s.job_id:
                continue
            if jid != s.job_id:
                self._renewed(role, s, jid, job_dir, new)
            if new == s.status:
                continue
            if new == "free":
                self.job.log(f"autoscale {role.name}: {s.name} (job {s.job_id}) ended")
                s.job_id, s.job_dir, s.prev = None, s.dir, None
            s.status = new
        kept = self.job.table.kept(role.name)
        own = len(kept) - sum(1 for r in kept if r.status == "failed")
        role.capacity = capacity(own, [s.status for s in role.slots])
        read = [v for v in values if v is not None]
        role.value = round(sum(read) / max(role.capacity, 1), 3) if read else None
        got = decide(role.spec, own, [(s.name, s.status, s.submitted_at) for s in role.slots],
                     values, now(), role.last_at)
        if got is not None and got[0] == "remove" and self._handing_over(role):
            return
        if got is not None:
            action, name, why = got
            slot = next(s for s in role.slots if s.name == name)
            (self._add if action == "add" else self._remove)(role, slot, why)

    def _handing_over(self, role: Role) -> bool:
        """Whether a slot of the role renewed within cool_down_s, or the job it took over from
        still runs: its load moves from one job to the other (the old one out of the router,
        the new one taking its first requests), so a reading then counts too few: no remove."""
        return now() < role.renewed_at + role.spec.cool_down_s or any(
            s.prev and not ended(*s.prev) for s in role.slots)

    def _renewed(self, role: Role, s: Slot, jid: str, job_dir: str, new: str) -> None:
        """The slot's job handed over to its successor (renew): the same slot, the same
        capacity, neither an add nor a remove. A drain asked of the old job is lost with it."""
        self.job.log(f"autoscale {role.name}: {s.name} renewed: job {jid} in {job_dir} "
                     f"takes over from job {s.job_id}" + (
                         f"; the drain asked of job {s.drained} went with it, {s.name} serves "
                         "on" if s.status == "draining" and new != "draining" else ""))
        s.prev, s.job_id, s.job_dir = (s.job_id, s.job_dir), jid, job_dir
        role.renewed_at = now()

    def _add(self, role: Role, s: Slot, why: str) -> None:
        s.status, s.submitted_at = "submitting", now()
        s.task = self.job.pool.submit(self.job.slurm.submit,
                                               os.path.join(s.dir, "job.sbatch"))
        self._decided(role, "add", why, s)

    def _submitted(self, role: Role, s: Slot) -> None:
        task, s.task = s.task, None
        try:
            s.job_id = task.result()
        except Exception as e:
            s.status = "free"
            self.job.log(f"autoscale {role.name}: sbatch of {s.name} failed: {e}")
            return
        s.status, s.job_dir, s.prev, s.drained = "pending", s.dir, None, None
        self.job.log(f"autoscale {role.name}: {s.name} submitted as job {s.job_id}")
        for d in role.decisions[-1:]:
            if d["slot"] == s.name and d["job_id"] is None:
                d["job_id"] = s.job_id
        self._save()

    def _remove(self, role: Role, s: Slot, why: str) -> None:
        try:
            write_request(s.job_dir, s.instance().name, role.spec.drain_timeout_s, s.job_id)
        except OSError as e:
            self.job.log(f"autoscale {role.name}: cannot ask {s.name} to drain: {e}")
            return
        s.status, s.drained = "draining", s.job_id
        self._decided(role, "remove", why, s)

    def _decided(self, role: Role, what: str, why: str, s: Slot) -> None:
        role.last_at = now()
        self.job.log(f"autoscale {role.name}: {what} {s.name}"
                     + (f" (job {s.job_id})" if s.job_id else "")
                     + f": {why}; capacity was {role.capacity}")
        role.decisions = (role.decisions + [{
            "at": round(now(), 3), "action": what, "slot": s.name, "job_id": s.job_id,
            "why": why, "value": role.value, "capacity": role.capacity}])[-DECISIONS_KEPT:]

    def _save(self) -> None:
        self.job.state.record(self.job.log, autoscale={
            n: {"value": r.value, "capacity": r.capacity,
                "slots": {s.name: s.as_state() for s in r.slots}, "decisions": r.decisions}
            for n, r in self.roles.items()})

    # -- as the front stops
    def cancel_slots(self) -> None:
        """scancel every slot job this front submitted that may still run (bounded: one
        command, not retried); their instances leave the router first, as any instance
        job's."""
        ids = sorted({jid for r in self.roles.values() for s in r.slots if s.status != "free"
                      for jid, d in pair_jobs(s) if not ended(jid, d)}, key=int)
        if not ids:
            return
        err = self.job.slurm.command(["scancel", *ids], retry=False)
        self.job.log(f"cancelled the slot job(s) {', '.join(ids)}" + (f": {err}" if err else ""))
