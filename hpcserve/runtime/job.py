"""The orchestrator: the job's timeline, from the batch script to the final state.

job.sbatch runs `python3 -m hpcserve_runtime run JOBDIR` on the batch host. Every command the job
runs is a rendered step script (steps/*.sh, each one srun), readable in the job directory; this
package does what is awkward in bash: HTTP polling with deadlines, supervision, ordered teardown
through Slurm, and state.json. Each concern is a module of its own; this one only orders them:

  run()            state.json reset for this try, then serve(), then stop();
  serve()          discovery and preflight, staging, the engines and their readiness, the
                   router (or joining one), the smoke request: then serving;
  keep_serving()   the serving loop: one tick every TICK_S, each concern in a stated order,
                   the events they report (events.py) handed to the one that acts on them;
                   it returns only by raising Stop;
  stop()           the cause decided, the router left, the teardown, the final state or a
                   requeue.

The concerns never call each other: what one sees that another acts on goes through the loop
(events.py), and what they share lies below them (the instance table, the router membership,
the steps, Slurm, state.json, the log). tests/unit/test_concern_cycles.py keeps it so.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from . import caches
from .allocation import InAllocation, own_steps
from .attach import LEAVE_S, Attach
from .autoscale import Autoscaler
from .autoscale_slots import slots_alone
from .bench_step import BenchStep
from .contract import SCALED_IN
from .discovery import Discovery
from .drain import Drains
from .events import Events, InstanceFailed, NodeLost, RouterRestartAsked
from .failures import (BENCHMARK_FAILED, NODE_LOST, ROUTER_RESTART_FAILED, Stop,
                       step_identity)
from .file_sd import FileSD
from .instances import Instances
from .liveness import Liveness
from .logs import JobLog
from .membership import Membership
from .readiness import Readiness
from .reconcile import Reconcile
from .recovery import Recovery
from .renew import Renewal
from .requeue import Requeue
from .slurm import Slurm, Unreachable
from .spec import Readiness as ReadinessSpec, read as read_spec
from .stage_batch import Staging
from .state import State, now
from .startup import Startup
from .steps import Steps
from .stopper import Stopper
from .supervise import Supervisor
from .table import REMOVED, Table
from .teardown import Teardown

TICK_S = 0.1   # s between two ticks of the serving loop
SCAN_S = 0.5   # s between two looks for drain requests (run/control/) while serving


class Job:
    def __init__(self, job_dir: str):
        self.dir = job_dir
        self.plan = read_spec(job_dir)
        self.state = State(job_dir)
        if self.state.data.get("phase") == "requeued":
            self.state.data["history"].append({"phase": "pending", "at": round(now(), 3)})
        try:
            t0 = float(os.environ.get("HPCSERVE_BATCH_T0", ""))
        except ValueError:
            t0 = now()
        self.t0 = t0
        self.log = JobLog(job_dir, t0)
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        # below the concerns: what they share, and what calls none of them
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="hpcserve-io")
        self.events = Events()
        self.steps = Steps(job_dir)
        self.instances = Instances(self.plan, job_dir)
        self.table = Table(self.plan, job_dir, self.instances, self.steps, self.state, self.log)
        self.membership = Membership(self.plan, self.instances, self.table, self.pool, self.log)
        self.supervisor = Supervisor(self)
        self.slurm = Slurm(self.job_id, pause=self.supervisor.pause)
        self.allocation = InAllocation(self)
        self.stopper = Stopper(self)
        # the concerns, in the order of the timeline
        self.discovery = Discovery(self)
        self.readiness = Readiness(self)
        self.liveness = Liveness(self)
        self.recovery = Recovery(self)
        self.reconcile = Reconcile(self)
        self.drains = Drains(self)
        self.attach = Attach(self)
        self.autoscaler = Autoscaler(self)
        self.renewal = Renewal(self)
        self.file_sd = FileSD(self)
        self.bench = BenchStep(self)
        self.staging = Staging(self)
        self.teardown = Teardown(self)
        self.requeue = Requeue(self)
        self.startup = Startup(self)
        self._unreachable: str | None = None
        self._next_scan = 0.0                 # the serving loop's next look for drain requests
        self._next_nodes: float | None = None  # ... and its next question to Slurm on nodes

    # -- every wait of the timeline watches signals, steps and nodes
    def check(self) -> None:
        self.supervisor.check()
        if self.renewal.time_is_up(now()):  # renewing jobs stop before Slurm's signal
            raise Stop("cancelled", "time_limit")

    def sleep(self, seconds: float) -> None:
        end = now() + seconds
        while now() < end:
            self.check()
            time.sleep(min(0.1, max(0.0, end - now())))

    def step_ids(self, errors=(RuntimeError, Unreachable)) -> dict[str, str]:
        """Slurm's step ids by step name, asked once, not retried (a grace or a recovery is
        running); {} when Slurm does not answer: a step Slurm does not list is signalled through
        its srun client instead."""
        try:
            return own_steps(self.plan, self.slurm.step_ids(retry=False))
        except errors as e:
            self.log(f"listing steps failed: {e}")
            return {}

    def note_unreachable(self, e: Unreachable | None) -> None:
        """Slurm's controller stopped (or started again) answering the job's queries: said once
        in the log and in state.json; the deployment goes on serving meanwhile."""
        words = str(e) if e else None
        if words == self._unreachable or (e is None and self._unreachable is None):
            return
        self.log(words or "Slurm controller answers again")
        self._unreachable = words
        self.state.record(self.log, slurm_unreachable=(
            {"since": round(now(), 3), "detail": words} if words else None))

    # -- the timeline
    def serve(self) -> None:
        """Discovery, engines, router, smoke request, serving; returns only by raising Stop."""
        plan = self.plan
        self._clear_port_verdicts()
        self.allocation.place(now())
        self.startup.mark("job_setup")
        importing = self.discovery.start_image_import()
        found = self.discovery.discover()
        self.startup.mark("preflight")
        self.discovery.wait_image_import(importing)
        if plan.preflight.only:  # `hpcserve preflight`: the checks are the whole job
            raise Stop("done", f"preflight passed on {sum(len(v) for v in found.values())} "
                               "node(s)")
        stage = plan.stage
        if stage is not None:  # model.stage: every node's copy before any engine starts
            self.staging.run(found)
            self.startup.mark("staging")
            if stage.only:  # `hpcserve stage`: the staging is the whole job
                raise Stop("done", f"staged {stage.source} on "
                                   f"{sum(len(v) for v in found.values())} node(s)")
        heads = self.instances.place(found)
        for inst in plan.instances:
            self.instances.start(self.steps, inst.name)
            self.startup.instance_started(inst.name, self.instances.leader_log(inst.name),
                                          inst.startup_lines)
        self.log(f"started {len(plan.instances)} engine instance(s)")
        rd = plan.readiness
        self.readiness.wait_engines(heads, rd)
        self.startup.mark("engines")
        caches.record_start(self)
        self.state.update("engines_ready")
        self.state.update(health_urls={i.name: self.instances.health_url(heads, i)
                                       for i in plan.instances})
        # an instance job joins the running router of its deployment instead of starting one
        url = self.start_router(found, rd) if plan.router is not None else \
            self.attach.join() if plan.attach is not None else None
        serving_at = now()
        # state.json names every instance and holds the start-up record before it says serving:
        # a reader that sees "serving" finds them
        if not self.table.active:  # a front of slots alone began it as they came
            self.begin_serving(url)
        started = self.startup.finish(serving_at)  # the start-up record too
        self.state.update("serving", endpoint=url,
                          **({"serving_after_s": round(serving_at - self.t0, 3)} if url else {}))
        self.state.serving(self.log)  # from here a state.json it cannot write ends nothing
        if url:
            self.log(f"serving at {url}")
        self.startup.add_queue_wait(started)
        first = (plan.instances or [None])[0]  # none: a front of slots alone (a router)
        self.bench.start(found, url or f"http://{heads[first.name]}:{first.port}")
        self.keep_serving(url if plan.router is not None else None)

    def begin_serving(self, router_url: str | None) -> None:
        """From here on an instance's failure is recovered, not the end of the deployment."""
        if router_url:
            self.membership.connect(router_url)
        self.table.begin()

    # -- the serving loop
    def keep_serving(self, router_url: str | None) -> None:
        """One tick every TICK_S until a Stop: the job's checks (a signal, a step's end, the
        time limit), drain requests, each concern's step forward, the liveness round when one
        is due and its verdict once every answer is in, Slurm's word on the nodes every
        node_interval, and the events of the tick handed on. `router_url`: the job's own
        router, which liveness probes (an instance job's router is its front's to watch)."""
        self.liveness.start(router_url)
        self._next_nodes = now() + self.plan.liveness.node_interval
        while True:
            self.tick()
            time.sleep(TICK_S)

    def tick(self) -> None:
        """One tick of the serving loop, in this order."""
        self.check()                          # a signal, a step's end, the time limit
        if now() >= self._next_scan:          # drain requests (run/control/)
            self.drains.scan()
            self._next_scan = now() + SCAN_S
        self.handle(self.events.take())
        self.stopper.tick()                   # the steps being ended: done, or KILLed
        self.recovery.tick()                  # each failed instance one stage forward
        self.reconcile.poll()                 # the router's worker list as it should be
        self.renewal.tick()                   # a successor job before the time limit
        self.drains.tick()                    # each drain one stage forward
        self.autoscaler.tick()                # slots added or removed by their signal
        self._liveness()                      # a probe round started, or judged
        if self._next_nodes is not None and now() >= self._next_nodes and \
                self.liveness.under_way is None:
            self.supervisor.check_nodes()     # Slurm's word on the nodes
            self._next_nodes = now() + self.plan.liveness.node_interval
        self.handle(self.events.take())
        if self.table.take_changed():
            self.file_sd.update()             # the site's Prometheus scrapes what serves
        self.state.retry()                    # state.json again, where its last write failed
        if self.plan.attach is not None and self.table.all_in(REMOVED):
            # an instance job with none left (scaled in, or renewed) has done its part
            raise Stop("done", self.renewal.end_reason or SCALED_IN)

    def _liveness(self) -> None:
        """A round starts when it is due (the benchmark's tick and the router's worker list
        read with it) and is judged once every answer is in."""
        if self.liveness.due():
            self.bench.tick(self.instances.heads)
            if self.liveness.router_url:  # the router this job runs: its workers as wanted
                self.reconcile.round()
            self.liveness.start_round()
        elif self.liveness.round_done():
            self.liveness.judge_round()

    def handle(self, events: list) -> None:
        """Each event to the concern that acts on it, in the order they came."""
        for ev in events:
            if isinstance(ev, InstanceFailed):
                self.recovery.failed(ev.name, ev.reason, ev.failure)
            elif isinstance(ev, NodeLost):
                self.recovery.node_lost(ev.node, ev.state)
            elif isinstance(ev, RouterRestartAsked):
                try:
                    self.restart_router()
                except Stop as e:
                    self.recovery.failed(ev.name, ROUTER_RESTART_FAILED, {
                        **step_identity("router"), "reason": ROUTER_RESTART_FAILED,
                        "detail": e.reason})
                else:
                    self.recovery.router_restarted(ev.name)

    def _clear_port_verdicts(self) -> None:
        ports_dir = os.path.join(self.dir, "run", "ports")
        os.makedirs(ports_dir, exist_ok=True)
        for f in os.listdir(ports_dir):  # an earlier try's verdicts say nothing about this one
            os.unlink(os.path.join(ports_dir, f))

    def start_router(self, found: dict, rd: ReadinessSpec) -> str:
        """The router's step on its node, told every leader's address; its readiness with every
        worker, then the smoke request. Returns the endpoint."""
        router = self.plan.router
        rnode = found[router.component][router.node_offset]
        self.instances.place_router(rnode)
        self.state.update(router_node=rnode[0])
        url = self._router_step(rd)
        self.startup.mark("router_registration")
        self.state.update("router_ready", endpoint=url, router_url=url)
        if slots_alone(self.plan):  # roles.<role>.instances: 0: its slots first
            self.begin_serving(url)
            self.autoscaler.bring_up()
        if rd.smoke_tokens:
            self.readiness.smoke(url, rd)
            self.startup.mark("smoke_request")
        return url

    def _router_step(self, rd: ReadinessSpec) -> str:
        """run/endpoints.env with each instance's leader address now, the router's step, and
        its readiness with every worker."""
        plan, router = self.plan, self.plan.router
        heads = self.instances.heads
        env_lines = [f"{i.role.upper()}_{i.index}_IP={shlex.quote(heads[i.name])}"
                     for i in plan.instances]
        # the one address the router listens on: the one its endpoint names
        env_lines.append(f"ROUTER_IP={shlex.quote(self.instances.router_addr)}")
        with open(os.path.join(self.dir, "run", "endpoints.env"), "w") as f:
            f.write("\n".join(env_lines) + "\n")
        self.steps.start("router", "steps/router.sh", [self.instances.router_node])
        url = f"http://{self.instances.router_addr}:{router.port}"
        self.readiness.wait_router(url, router.readiness, rd)
        return url

    def restart_router(self) -> None:
        """For a router that cannot take a worker while it runs (a static worker set): stopped
        and started again with every instance's address now; requests fail meanwhile."""
        self.log("restarting the router with the instances' addresses now")
        self.steps.signal(["router"], "TERM", self.step_ids(errors=Exception), set(), self.slurm,
                          self.log)
        if not self.steps.wait(["router"], now() + 10):
            self.steps.kill_client("router")
            self.steps.wait(["router"], now() + 5)
        self.steps.retire("router")
        try:  # the verdict of the router's port check is the old router's
            os.unlink(os.path.join(self.dir, "run", "ports", "router"))
        except FileNotFoundError:
            pass
        self._router_step(self.plan.readiness)

    def run(self) -> int:
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(s, self.supervisor.on_signal)
        try:
            # A requeued job's state.json still holds the last try's outcome.
            self.state.update("starting", started_at=round(self.t0, 3), runtime_at=round(now(), 3),
                              batch_host=os.uname().nodename, endpoint=None, failure=None,
                              reason=None, finished_at=None, smoke_tokens=None,
                              serving_after_s=None, engines_ready_count=0,
                              restarts=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
                              instances={}, excluded_nodes=[], startup=None, router_url=None,
                              attach=(self.plan.attach.as_json()
                                      if self.plan.attach is not None else None), renew=None)
            self.serve()
            stop = Stop("done", "finished")  # not reached: serve() raises
        except Stop as s:
            stop = s
        except BaseException as e:  # a bug here must still tear the job down
            stop = Stop("failed", f"hpcserve runtime error: {e!r}")
        return self.stop(stop, now())

    def stop(self, stop: Stop, stop_at: float) -> int:
        """The end of the timeline: the cause decided, teardown, node cleanup, then the final
        state or a requeue. The exit code of the batch script."""
        phase, reason, failure = self._cause(stop)
        self.log(f"stopping: {reason}")
        self.state.record(self.log, "stopping", reason=reason, failure=failure)
        try:  # an instance job's engines leave its deployment's router before they go away
            if self.attach.spec is not None:
                # within the teardown's budget too: after a scancel Slurm KILLs after KillWait
                self.attach.leave(min(LEAVE_S, self.teardown.budget()[0] / 2))
        except Exception as e:
            self.log(f"leaving the router: {e!r}")
        try:  # the slot jobs this front submitted (autoscale) lose their router with it
            self.autoscaler.cancel_slots()
        except Exception as e:
            self.log(f"cancelling the slot jobs: {e!r}")
        try:
            self.teardown.run()
        except Exception as e:
            self.log(f"teardown error: {e!r}")
        try:
            # before a requeue, which ends this allocation; within the grace where there is some
            grace = float(self.plan.signal_grace)
            self.teardown.cleanup_nodes(min(Teardown.CLEANUP_TIMEOUT,
                                            max(10.0, stop_at + grace - 5 - now())))
        except Exception as e:
            self.log(f"node cleanup error: {e!r}")
        if failure:
            self.supervisor.last_words(failure)  # the engines are gone: their logs are whole
        restarts = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
        # A benchmark that failed its gate measured the deployment: another try of the same
        # deployment would measure the same, so that failure is not requeued.
        if phase == "failed" and (failure or {}).get("reason") != BENCHMARK_FAILED and \
                self.requeue.after(reason, restarts):
            return 0
        self.state.record(self.log, phase, reason=reason, finished_at=round(now(), 3),
                          restarts=restarts)
        self.log(f"final state: {phase} ({reason})")
        return 0 if phase in ("cancelled", "done") else 1

    def _cause(self, stop: Stop) -> tuple:
        """(phase, reason, failure): a step that ended because Slurm signalled it too is not a
        crash of its own: the signal's cause (a scancel, the time limit, a lost node, a
        preemption) is the reason."""
        try:
            self.supervisor.resolve_signal()
        except Exception as e:
            self.log(f"could not resolve the signal: {e!r}")
        sig = self.supervisor.signal_stop
        if sig is not None and stop.phase == "failed" and \
                (stop.failure or {}).get("reason") != NODE_LOST:
            return sig.phase, sig.reason, sig.failure
        return stop.phase, stop.reason, stop.failure
