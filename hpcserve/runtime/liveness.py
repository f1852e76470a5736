"""While serving: every probe bounded in time, a hung engine told from an unreachable one, and
busy never taken for hung.

Each round probes every serving instance's liveness path and the router's readiness at once in
the job's pool, reading the engines' metrics beside their health; the serving loop (job.py)
starts a round when one is due and judges it once every answer is in, ticking the other
concerns meanwhile. An instance that fails `failures` rounds in a row is reported as an event
for recovery; the router's failure ends the deployment (Stop). `router_url` is the job's own
router only: an instance job (attach) probes its engines, and the router it joined is its
front job's to watch.
"""

from __future__ import annotations

from .autoscale_slots import slots_alone
from .events import InstanceFailed
from .failures import HUNG, Stop, UNHEALTHY, step_identity
from .probes import metrics_of, metrics_totals, probe
from .spec import Liveness as LivenessSpec
from .state import now


class Track:
    """One probe target's record across rounds: its failed rounds in a row, its last progress
    counter, and when it last showed a sign of progress (its counters moved, a health path
    that proves generation answered, or it answered holding no request)."""

    def __init__(self, at: float):
        self.failed = 0
        self.progress: float | None = None
        self.alive_at = at
        self.busy = False   # its last probe failed while its counters moved

    def judge(self, kind: str | None, detail: str, m: tuple | None, at: float,
              hung_after: float, proves_progress: bool):
        """(kind, detail, ripe) of a failure this round, or None; ripe: it has failed long
        enough to be taken out. Hung is not busy: an engine whose counters moved since the
        last round works, however slowly it answers; a timed-out probe, or an answer that
        proves nothing while requests stand still, is hung only after `hung_after` s without
        any sign of progress (a long step shows none until it ends)."""
        prev = self.progress
        moved = m is not None and m[0] is not None and prev is not None and m[0] > prev
        if m is not None and m[0] is not None:
            self.progress = m[0]
        held = m[1] if m is not None else None
        if moved or (kind is None and (proves_progress or held == 0)):
            self.alive_at = at
        self.busy = kind is not None and moved
        stalled = (kind is None and not proves_progress and bool(held) and not moved
                   and prev is not None)
        if moved or (kind is None and not stalled):
            self.failed = 0
            return None  # busy (it answers slowly because it works), or well
        self.failed += 1
        still = at - self.alive_at
        if stalled:
            return HUNG, (f"it answers its health path but holds {held:g} request(s) while "
                            f"its progress counters stand still ({still:.0f} s)"), \
                still >= hung_after
        if kind == HUNG:
            return kind, f"{detail}, no sign of progress for {still:.0f} s", still >= hung_after
        return kind, detail, True


class Liveness:
    def __init__(self, job):
        self.job = job
        self.tracks: dict[str, Track] = {}
        self.router_url: str | None = None
        self.next_at: float | None = None   # the next round's start; None: not serving yet
        self.under_way: list | None = None  # (name, url, probe future, metrics future)

    @property
    def lv(self) -> LivenessSpec:
        """plan.json liveness: the rounds' interval, each probe's timeout, failures in a row."""
        return self.job.plan.liveness

    def start(self, router_url: str | None) -> None:
        """Serving: the first round one interval from now."""
        self.router_url = router_url
        self.next_at = now() + self.lv.interval

    def due(self) -> bool:
        return self.next_at is not None and self.under_way is None and now() >= self.next_at

    def targets(self) -> list[tuple[str, str, dict | None]]:
        """(name, liveness URL, metrics URLs and names) of every serving instance, and the
        router's readiness."""
        job = self.job
        inst = job.instances
        out = []
        for i in job.plan.instances:
            if not job.table.serving(i.name):
                self.tracks.pop(i.name, None)  # its next attempt's counters start at 0
                continue
            out.append((i.name, inst.liveness_url(inst.heads, i),
                        metrics_of(job.plan, inst.heads, i)))
        if self.router_url:
            out.append(("router", self.router_url + job.plan.router.readiness.path, None))
        return out

    def start_round(self) -> None:
        """Every target's health probe and metrics read at once, each bounded by `timeout`."""
        pool, timeout = self.job.pool, self.lv.timeout
        self.under_way = [(name, url, pool.submit(probe, url, timeout),
                           m and pool.submit(metrics_totals, m, timeout))
                          for name, url, m in self.targets()]

    def round_done(self) -> bool:
        return self.under_way is not None and all(
            f.done() and (g is None or g.done()) for _, _, f, g in self.under_way)

    def judge_round(self) -> None:
        """Each answer judged (a failure ripe for recovery reported as an event; the router's
        raises Stop), the health record written, the next round one interval from now."""
        job, lv = self.job, self.lv
        futs, self.under_way = self.under_way, None
        for name, url, f, g in futs:
            self._judge(name, url, (*f.result(), g and g.result()))
        job.state.record(job.log, health={
            n: ("ok" if t.failed == 0 else f"failing {t.failed}/{lv.failures}")
            for n, t in self.tracks.items() if job.table.serving(n)})
        self.next_at = now() + lv.interval

    def _judge(self, name: str, url: str, res: tuple) -> None:
        job, lv = self.job, self.lv
        kind, detail, m = res
        if name not in self.tracks:  # alive since it went serving (its readiness, or its
            rec = job.table.recs.get(name)  # replacement's smoke request): its last sign
            self.tracks[name] = Track(rec.since if rec else now())
        t = self.tracks[name]
        if name == "router" and kind == UNHEALTHY and (
                not job.table.all_serving() or slots_alone(job.plan)):
            kind = None  # its readiness counts the workers: one is out, on purpose
        if name != "router" and not job.table.serving(name):
            self.tracks.pop(name, None)
            return  # taken out meanwhile (its step ended while the round ran)
        was, was_busy = t.failed, t.busy
        live = None if name == "router" else job.instances.spec(name).liveness
        verdict = t.judge(kind, detail, m, now(), 0 if live is None else live.hung_after,
                          False if live is None else live.proves_progress)
        if t.busy and not was_busy:
            job.log(f"{name}: busy, not hung: {kind} ({detail}) at {url}, but its progress "
                    "counters moved")
        if verdict is None:
            if was or (was_busy and not t.busy):
                job.log(f"{name} answers again at {url}")
            return
        kind, detail, ripe = verdict
        count = t.failed
        job.log(f"{name}: {kind} ({detail}) at {url}, {count} of {lv.failures}")
        if count >= lv.failures and ripe:
            self.tracks.pop(name, None)
            stop = self._gone(name, kind, url, detail, count)
            if not job.table.handles(name):
                raise stop
            job.events.put(InstanceFailed(name, (stop.failure or {}).get("reason") or kind,
                                          stop.failure))

    def _gone(self, name: str, kind: str, url: str, detail: str, count: int) -> Stop:
        """The Stop that a target's failure means: a lost node where its step cannot end or
        its node's slurmd does not answer; else its own kind (hung, unreachable, unhealthy)."""
        sup, steps = self.job.supervisor, self.job.steps
        try:
            if name in steps and steps.terminating(name):
                sup.step_lost(name)  # not the engine's fault: a node or task is gone
            if name in steps:  # an engine on a crashed node does not answer either
                sup.raise_if_node_lost(name, sup.failure_of(name, None))
        except Stop as s:
            return s
        if kind == HUNG:
            sup.hung_steps.add(name)
        return Stop("failed", f"{name} {kind}: {detail}, {count} probes of {url} in a row",
                    self.probe_failure(name, kind, url, detail))

    def probe_failure(self, name: str, kind: str, url: str, detail: str) -> dict:
        inst = self.job.instances
        f = {**step_identity(name), "node": inst.leader_node(name), "node_rank": 0}
        f.update(reason=kind, probe=url, detail=detail, exit_code=None,
                 log=inst.log_file(name, 0, f["node"]))
        self.job.supervisor.last_words(f)
        return f
