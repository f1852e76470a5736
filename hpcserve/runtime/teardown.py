"""Ending the deployment in order: the benchmark client, then the router (no new request reaches
an engine that is going away), then every engine, each tier signalled through Slurm by step id
within a bounded grace, KILL after it; then what tasks left on their nodes (enroot containers of
SIGKILLed tasks, the engines' private temporary directories)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from .allocation import step_prefix
from .slurm import Unreachable
from .state import now
from .supervise import BENCH_STEP


class Teardown:
    CLEANUP_TIMEOUT = 60.0  # s at most for removing leftovers on the nodes

    def __init__(self, job):
        self.job = job

    def stop_signal(self, step: str) -> str:
        if step in self.job.supervisor.hung_steps:
            return "KILL"  # a hung engine answers no TERM: waiting for it only delays the end
        if step == "router":
            router = self.job.plan.router
            return router.stop_signal if router is not None else "TERM"
        inst = self.job.instances.spec(step)  # None: a step of no instance (discovery...)
        return inst.stop_signal if inst is not None else "TERM"

    def kill_wait(self) -> float | None:
        """Slurm's KillWait: after a plain scancel, Slurm SIGKILLs every process of the job (this
        one too) that long after its TERM, so the teardown must be over by then."""
        try:
            kw = (self.job.slurm.config("KillWait") or "").split()  # "5 sec"
        except (RuntimeError, Unreachable):
            return None
        return float(kw[0]) if kw and kw[0].isdigit() else None

    def budget(self) -> tuple[float, float]:
        """(seconds for the whole teardown, the time Slurm's own SIGKILL may end this process)."""
        sup = self.job.supervisor
        budget = max(2.0, float(self.job.plan.signal_grace) - 5)
        hard_end = float("inf")
        if sup.signal_seen and sup.signal_seen[0] == signal.SIGTERM and \
                sup.signal_reason != "time_limit":
            # TERM may be a plain scancel: Slurm's own SIGKILL follows after KillWait, and the
            # final state must be written before it. Slurm kills what is left anyway. The time
            # limit's TERM (--signal=B:TERM@grace) comes `grace` s before the end: that is the
            # budget then, not KillWait (draining 16 enroot nodes takes more than 15 s).
            kw = self.kill_wait()
            if kw is not None:
                hard_end = sup.signal_seen[1] + kw - 0.7
                budget = max(0.5, min(budget, (hard_end - now()) / 2))
        return budget, hard_end

    def run(self) -> None:
        job = self.job
        job.file_sd.remove()  # Prometheus stops scraping before the targets go away
        job.discovery.stop()
        job.discovery.stop_image_import()
        budget, hard_end = self.budget()
        end = now() + budget
        if not job.steps.live():
            job.steps.end_retired()
            return
        ids: dict[str, str] = {}
        try:
            ids = job.step_ids()  # the grace is running: asked once
            # The benchmark client first: its requests would only fail from here on. Then the
            # router, so no new request reaches an engine that is going away.
            tiers = [[BENCH_STEP], ["router"],
                     [n for n, _ in job.steps.items() if n not in ("router", BENCH_STEP)]]
            for tier in tiers:
                tier = [n for n in tier if n in job.steps and job.steps.running(n)]
                if tier:
                    self._signal_tier(tier, ids)
                    job.steps.wait(tier, min(end, now() + max(1.0, (end - now()) / 2)))
        finally:
            # Whatever went wrong above, nothing may outlive the grace period.
            self._kill_what_is_left(ids, end, hard_end)
            job.steps.end_retired()

    def _signal_tier(self, tier: list[str], ids: dict) -> None:
        # All engine steps get their stop signal at once (the spec's stop_signal, TERM for every
        # engine so far), and Slurm delivers it to every task of a step. An engine whose ranks
        # >= 1 ignore it (SGLang's wait for the rank-0 shutdown broadcast) still ends rank 0
        # first in effect.
        job = self.job
        for sig in dict.fromkeys(self.stop_signal(n) for n in tier):
            names = [n for n in tier if self.stop_signal(n) == sig]
            job.log(f"SIG{sig} to {', '.join(names)}")
            job.steps.signal(names, sig, ids, job.supervisor.lost_steps, job.slurm, job.log)

    def _kill_what_is_left(self, ids: dict, end: float, hard_end: float) -> None:
        job, steps = self.job, self.job.steps
        left = steps.live()
        if left:
            steps.wait(left, end)
            left = steps.live()
        if not left:
            return
        job.log(f"SIGKILL to {', '.join(left)} after the grace period")
        ids = job.step_ids(errors=Exception) or ids  # whatever failed, KILL follows
        steps.signal(left, "KILL", ids, job.supervisor.lost_steps, job.slurm, job.log)
        if not steps.wait(left, min(now() + 5.0, hard_end)):
            for n in left:
                if steps.running(n):
                    steps.kill_client(n)
            steps.wait(left, min(now() + 2, hard_end))

    # -- what tasks leave on their nodes
    def cleanup_nodes(self, timeout: float) -> None:
        """What tasks leave on their nodes when they end early: enroot containers of tasks that
        were SIGKILLed (srun's --kill-on-bad-exit, or the KILL tier above) before their
        container-task.sh could remove them, and the engine's private temporary directories
        (plan "scratch"). Each is listed by a file under run/ while it exists. Best-effort."""
        plan = self.job.plan
        jd = os.path.abspath(self.job.dir)
        if plan.container.runtime == "enroot":
            self._cleanup("container", "containers",
                          ["bash", os.path.join(jd, "launch", "container-task.sh"), "--cleanup"],
                          timeout)
        if plan.scratch:
            self._cleanup("scratch", "scratch",
                          ["bash", os.path.join(jd, "launch", "scratch-cleanup.sh")], timeout)

    def _cleanup(self, what: str, marks: str, argv: list[str], timeout: float) -> None:
        job = self.job
        made = os.path.join(job.dir, "run", marks)  # one file per thing not removed yet
        left = _listing(made)
        if not left:
            return
        job.log(f"{what} left behind: {', '.join(left)}; removing them")
        procs = self._cleanup_steps(what, argv)
        end = now() + timeout
        while now() < end and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                job.log(f"{what} cleanup still running after {timeout:.0f} s: stopping it")
                _end(p)
        left = _listing(made)
        job.log(f"{what} cleanup: " + (f"still left: {', '.join(left)} (see "
                                       f"logs/{what}-cleanup.log)" if left else "none left"))

    def _cleanup_steps(self, what: str, argv: list[str]) -> list[subprocess.Popen]:
        """One step per component on all its nodes: each removes only the leftovers of the node
        it runs on, so every node must run it."""
        comps = self.job.plan.components
        procs = []
        with open(os.path.join(self.job.dir, "logs", f"{what}-cleanup.log"), "ab") as out:
            for c in comps:
                cmd = ["srun", *self.job.allocation.srun_args(c),
                       f"--nodes={c.nodes}", f"--ntasks={c.nodes}", "--ntasks-per-node=1",
                       "--overlap", f"--job-name={step_prefix(self.job.plan.name, self.job.plan.in_allocation)}{what}-cleanup", "--kill-on-bad-exit=0", *argv]
                try:
                    procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL))
                except OSError as e:
                    self.job.log(f"{what} cleanup on component {c.index}: {e!r}")
        return procs


def _listing(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _end(p: subprocess.Popen) -> None:
    """TERM a process this job started, KILL it after 3 s."""
    try:
        p.terminate()
        p.wait(timeout=3)
    except subprocess.TimeoutExpired:
        try:
            p.kill()
            p.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
    except OSError:
        pass
