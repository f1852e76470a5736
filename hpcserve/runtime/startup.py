"""The start-up in phases: where the time from the batch script's start to `serving` went, for the
deployment and for each engine instance (state.json "startup" and the job log).

Deployment phases partition that time: each ends where the next begins, so they sum to the
measured start-up (serving_after_s) by construction; work that ran beside another phase (the
image import beside discovery) counts only for the time the start-up waited for it, and its own
duration is kept under "overlapped". An instance's phases run from its step's start to the moment
the runtime saw it healthy, split at the lines its engine prints when the weights are loaded and
when the server is ready (plan.json's startup_lines: the engine adapter's patterns, verified in
the pinned release's source). A line the release does not print, or that never appeared, makes
its phases unknown (null) and their time "unknown_s": never guessed.

The engine lines are seen by reading each instance leader's log while the runtime waits for the
engines, once per poll: a line's time is when it was seen, within one poll_interval of when the
engine wrote it. Restarts of an instance by recovery are not part of the start-up.
"""

from __future__ import annotations

import os
import re

from .slurm_scontrol import parse_scontrol_fields
from .slurm_values import parse_timestamp
from .spec import StartupLines
from .state import now

# The engine's lines, in the order the engine prints them (plan.json startup_lines keys).
LINES = ("weights_loaded", "ready")


def _round(s: float | None) -> float | None:
    return None if s is None else round(max(0.0, s), 3)


def phases_between(start: float, marks: list[tuple[str, float | None]]) -> tuple[dict, float]:
    """(phase -> seconds or None, unknown seconds): each phase from the previous known mark to
    its own; a phase whose mark is unknown is None, and its time goes to the next known phase's
    start being earlier (it is counted in unknown_s instead)."""
    out: dict = {}
    unknown = 0.0
    last, pending = start, []
    for name, at in marks:
        if at is None:
            pending.append(name)
            continue
        at = max(at, last)  # a line seen in the poll of the answer after it: never negative
        for p in pending:
            out[p] = None
        if pending:
            unknown += at - last
        else:
            out[name] = at - last
        out.setdefault(name, None)
        last, pending = at, []
    for p in pending:
        out[p] = None
    return {k: _round(v) for k, v in out.items()}, round(unknown, 3)


class EngineLog:
    """One instance leader's log read forward from where this try's start found it, the first
    time each startup line appears noted."""

    def __init__(self, path: str, patterns: dict, started: float):
        self.path = path
        self.started = started
        self.patterns = {k: re.compile(v) for k, v in patterns.items() if v}
        self.offset = os.path.getsize(path) if os.path.exists(path) else 0
        self.partial = b""
        self.seen: dict[str, float] = {}
        self.healthy: float | None = None

    def scan(self, at: float) -> None:
        if self.healthy is not None or len(self.seen) == len(self.patterns):
            return
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()  # a line the engine is still writing
        for line in lines:
            text = line.decode(errors="replace")
            for key, rx in self.patterns.items():
                if key not in self.seen and rx.search(text):
                    self.seen[key] = at

    def record(self) -> dict:
        """Its phases: engine_load (step start to the weights line), engine_warmup (to the ready
        line, or to healthy where the release prints none), health_wait (ready line to healthy,
        only where there is one)."""
        ready = "ready" in self.patterns
        marks = [("engine_load", self.seen.get("weights_loaded")),
                 ("engine_warmup", self.seen.get("ready") if ready else self.healthy)]
        if ready:
            marks.append(("health_wait", self.healthy))
        phases, unknown = phases_between(self.started, marks)
        total = (self.healthy or self.started) - self.started
        return {"phases": phases, "unknown_s": unknown, "total_s": round(total, 3),
                "lines_seen": sorted(self.seen), "lines_known": sorted(self.patterns)}


class Startup:
    """Marks on the way to serving (Startup.mark(phase) ends that phase now), the engines' lines,
    and the record written once the deployment serves."""

    def __init__(self, job):
        self.job = job
        self.marks: list[tuple[str, float]] = []
        self.overlapped: dict[str, float] = {}
        self.engines_at: float | None = None
        self.logs: dict[str, EngineLog] = {}

    def mark(self, phase: str, at: float | None = None) -> None:
        self.marks.append((phase, now() if at is None else at))

    def overlap(self, what: str, seconds: float) -> None:
        self.overlapped[what] = round(seconds, 3)

    # -- the engines
    def instance_started(self, name: str, log_rel: str, lines: StartupLines) -> None:
        if self.engines_at is None:
            self.engines_at = now()
        patterns = {"weights_loaded": lines.weights_loaded, "ready": lines.ready}
        self.logs[name] = EngineLog(os.path.join(self.job.dir, log_rel), patterns, now())
        self.logs[name].rel = log_rel

    def scan(self) -> None:
        """Read each waiting instance's new log lines (before its health probe, so that a line
        and the answer seen in one poll keep their order)."""
        t = now()
        for log in self.logs.values():
            log.scan(t)

    def healthy(self, name: str) -> None:
        log = self.logs.get(name)
        if log is not None and log.healthy is None:
            t = now()  # a line the engine wrote as it began to answer: seen, at this time
            log.scan(t)
            log.healthy = t

    # -- the record
    def record(self, serving_at: float) -> dict:
        t0 = self.job.t0
        instances = {n: {**log.record(), "log": log.rel} for n, log in self.logs.items()}
        # the engines' phases of the deployment are those of the instance it waited for last
        last = max(self.logs, key=lambda n: self.logs[n].healthy or 0, default=None)
        marks = list(self.marks)
        if last is not None:
            log = self.logs[last]
            ready = [m for m in marks if m[0] == "engines"]
            marks = [m for m in marks if m[0] != "engines"]
            i = next((k for k, m in enumerate(self.marks) if m[0] == "engines"), len(marks))
            marks[i:i] = [("engine_load", log.seen.get("weights_loaded")),
                          ("engine_warmup", ready[0][1] if ready else log.healthy)]
        marks.append(("final", serving_at))
        phases, unknown = phases_between(t0, marks)
        final = phases.pop("final", 0.0) or 0.0
        last = next((p for p in reversed(list(phases)) if phases[p] is not None), None)
        if last:  # the state writes after the last mark: the last phase's
            phases[last] = round(phases[last] + final, 3)
        return {"total_s": round(serving_at - t0, 3), "phases": phases, "unknown_s": unknown,
                "overlapped": dict(self.overlapped), "queue_wait_s": None,
                "instances": instances, "slowest": self._slowest(instances)}

    @staticmethod
    def _slowest(instances: dict) -> dict | None:
        """The instance whose start-up took longest, and its longest known phase."""
        name = max(instances, key=lambda n: instances[n]["total_s"], default=None)
        if name is None:
            return None
        ph = {k: v for k, v in instances[name]["phases"].items() if v is not None}
        worst = max(ph, key=ph.get, default=None)
        return {"instance": name, "total_s": instances[name]["total_s"],
                "phase": worst if worst else "unknown",
                "phase_s": ph[worst] if worst else instances[name]["unknown_s"]}

    def finish(self, serving_at: float) -> dict | None:
        """Written into state.json and the log just before the deployment says it serves (a
        reader that sees "serving" finds it); the record, for add_queue_wait."""
        job = self.job
        try:
            rec = self.record(serving_at)
        except Exception as e:  # a measurement must never stop a deployment that serves
            job.log(f"start-up phases not recorded: {e!r}")
            return None
        job.state.update(startup=rec)
        for line in summary(rec):
            job.log(line)
        return rec

    def add_queue_wait(self, rec: dict | None) -> None:
        """Slurm's queue wait added to the record once the deployment serves (one scontrol
        query, not retried: the deployment serves meanwhile)."""
        if rec is None:
            return
        job = self.job
        wait = self.queue_wait()
        if wait is not None:
            rec["queue_wait_s"] = wait
            job.state.update(startup=rec)
            job.log(f"queue wait (Slurm's SubmitTime to StartTime): {wait:g} s")

    def queue_wait(self) -> float | None:
        """StartTime - SubmitTime of this job (the het job's first component) as `scontrol show
        job` gives them (whole seconds); None in an allocation the user holds, whose queue wait
        was not the deployment's, or where Slurm does not answer."""
        job = self.job
        if job.plan.in_allocation or not job.job_id:
            return None
        try:
            out = job.slurm.run(["scontrol", "-o", "show", "job", job.job_id], retry=False)
        except Exception as e:
            job.log(f"queue wait unknown: {e}")
            return None
        for rec in parse_scontrol_fields(out):
            sub, start = (parse_timestamp(rec.get(k)) for k in ("SubmitTime", "StartTime"))
            if sub is not None and start is not None:
                return float(max(0, start - sub))
        return None


def _fmt(s: float | None) -> str:
    return "unknown" if s is None else f"{s:.1f} s"


def summary(rec: dict) -> list[str]:
    """The start-up in the job log: the deployment's phases, then each instance's."""
    ph = ", ".join(f"{k} {_fmt(v)}" for k, v in rec["phases"].items())
    out = [f"start-up {rec['total_s']:.1f} s: {ph}" +
           (f", unknown {rec['unknown_s']:.1f} s" if rec["unknown_s"] else "")]
    for name, inst in rec["instances"].items():
        ip = ", ".join(f"{k} {_fmt(v)}" for k, v in inst["phases"].items())
        out.append(f"  {name}: {inst['total_s']:.1f} s ({ip})")
    s = rec.get("slowest")
    if s:
        out.append(f"  slowest instance: {s['instance']} ({s['phase']} {s['phase_s']:.1f} s)")
    return out
