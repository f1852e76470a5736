"""The in-job runtime's own logic without a cluster: discovery output through a file, signal
handling outside the handler, per-try srun logs, best-effort teardown, direct HTTP, a smoke request
that a signal cuts short, and the removal of leftover enroot containers (with the stand-ins)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from hpcserve.author import config, plan, render
from hpcserve.runtime import contract, discovery, ownport
from hpcserve.runtime import drain as drainmod
from hpcserve.runtime import liveness as livenessmod
from hpcserve.runtime import probes
from hpcserve.runtime import job as jobmod
from hpcserve.runtime.failures import Stop, task_ids
from hpcserve.runtime.spec import Spec
from hpcserve.runtime.supervise import Supervisor

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"


def _plan(components: list[dict], **extra) -> dict:
    return {"spec": "hpcserve-job", "spec_version": contract.SPEC_VERSION, "name": "t-unit",
            "components": components, "instances": [], "router": None, "signal_grace": 4,
            "requeue": 0, "served_name": "kimi-k2", "container": {"runtime": "none"},
            "scratch": False, "in_allocation": False, "recovery": {},
            "readiness": {"engine_timeout": 5, "router_timeout": 5, "poll_interval": 0.1,
                          "smoke_tokens": 4}, **extra}


@pytest.fixture
def make_job(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)  # no squeue/scancel calls
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    made = []

    def _make(components: list[dict], steps: dict[str, str] | None = None, **extra) -> jobmod.Job:
        d = tmp_path / "job"
        for sub in ("logs", "run", "steps"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "plan.json").write_text(json.dumps(_plan(components, **extra)))
        for name, text in (steps or {}).items():
            (d / "steps" / name).write_text("#!/bin/bash\n" + text + "\n")
        j = jobmod.Job(str(d))
        made.append((j, j.log))
        return j

    yield _make
    for j, log in made:
        for p in [*j.steps.procs.values(), *j.discovery.procs.values()]:
            if p.poll() is None:
                p.kill()
                p.wait()
        log.close()


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


# -------------------------------------------------------------------------------------- discovery

def test_discovery_output_beyond_a_pipe_buffer_is_read_in_full(make_job):
    # 2000 nodes' lines, some 140 KiB: through a pipe read only after exit, srun would block
    # at 64 KiB and discovery would time out.
    n = 2000
    line = "HPCSERVE-NODE $i node$i 10.0.$((i / 250)).$((i % 250)) ib0 " + ",".join(
        f"mlx5_{k}" for k in range(8))
    job = make_job([{"index": 0, "name": "decode", "nodes": n}],
                   {"discover-0.sh": f"for i in $(seq {n - 1} -1 0); do echo \"{line}\"; done"})
    t0 = time.time()
    found = job.discovery.discover()
    assert time.time() - t0 < 20
    assert os.path.getsize(Path(job.dir) / "run" / "discover-0.out") > 64 * 1024
    assert len(found[0]) == n
    assert found[0][0][:2] == ["node0", "10.0.0.0"] and found[0][-1][0] == f"node{n - 1}"


IGNORE_TERM = (f"exec {sys.executable} -c 'import signal, time; "
               "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'")


def ignore_term(ready: Path) -> str:
    """A step that ignores SIGTERM and creates `ready` once it does: a TERM before that would
    end it as any process, which on a loaded machine (Python's start-up) is no rare race."""
    return (f"exec {sys.executable} -c 'import signal, sys, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); open(sys.argv[1], \"w\").close(); "
            f"time.sleep(60)' {ready}")


def test_a_failed_component_stops_every_other_discovery(make_job, tmp_path):
    ready = tmp_path / "term-ignored"
    job = make_job([{"index": 0, "name": "prefill", "nodes": 1},
                    {"index": 1, "name": "decode", "nodes": 1},
                    {"index": 2, "name": "decode", "nodes": 1}],
                   {"discover-0.sh": "exec sleep 60", "discover-1.sh": ignore_term(ready),
                    # fails once component 1 ignores TERM (30 s at most)
                    "discover-2.sh": f"for _ in $(seq 600); do [ -e {ready} ] && break; "
                                     "sleep 0.05; done; echo 'no such interface' >&2; exit 3"})
    with pytest.raises(Stop) as e:
        job.discovery.discover()
    assert ready.exists()
    assert e.value.phase == "failed" and "component 2" in e.value.reason, e.value.reason
    assert e.value.failure["log_tail"] == ["no such interface"]
    # TERM, then KILL for the one that ignores TERM
    assert time.time() - ready.stat().st_mtime < 8
    assert all(p.poll() is not None for p in job.discovery.procs.values())
    assert job.discovery.procs[0].returncode == -signal.SIGTERM
    assert job.discovery.procs[1].returncode == -signal.SIGKILL


def test_a_signal_during_discovery_stops_all_of_it(make_job):
    job = make_job([{"index": 0, "name": "prefill", "nodes": 1},
                    {"index": 1, "name": "decode", "nodes": 1}],
                   {"discover-0.sh": "exec sleep 60", "discover-1.sh": "exec sleep 60"})
    threading.Timer(0.3, job.supervisor.on_signal, (signal.SIGUSR1, None)).start()
    with pytest.raises(Stop) as e:
        job.discovery.discover()
    assert (e.value.phase, e.value.reason) == ("cancelled", "cancelled")
    assert [p.returncode for p in job.discovery.procs.values()] == [-signal.SIGTERM] * 2


def test_discovery_times_out(make_job, monkeypatch):
    monkeypatch.setattr(discovery.Discovery, "TIMEOUT", 0.5)
    job = make_job([{"index": 0, "name": "prefill", "nodes": 1}],
                   {"discover-0.sh": "exec sleep 60"})
    with pytest.raises(Stop) as e:
        job.discovery.discover()
    assert "timed out" in e.value.reason and job.discovery.procs[0].returncode is not None


# ---------------------------------------------------------------------------------------- signals

def test_the_handler_only_records_and_check_resolves(make_job, monkeypatch):
    job = make_job([])

    def boom(*a, **k):
        raise AssertionError("I/O in the signal handler")

    monkeypatch.setattr(job, "log", boom)
    monkeypatch.setattr(subprocess, "run", boom)
    job.job_id = job.slurm.job_id = "123"
    job.supervisor.on_signal(signal.SIGTERM, None)
    job.supervisor.on_signal(signal.SIGUSR1, None)  # the first signal counts
    monkeypatch.undo()
    assert job.supervisor.signal_reason is None and job.supervisor.signal_seen[0] == signal.SIGTERM

    class Out:  # squeue's answer
        returncode, stdout, stderr = 0, "0:40\n", ""

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Out())
    with pytest.raises(Stop) as e:
        job.check()
    # 40 s left is within signal_grace + 90: the time limit's TERM
    assert (e.value.phase, e.value.reason) == ("cancelled", "time_limit")
    log = (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
    assert log.count("received SIGTERM: time_limit") == 1


def test_a_real_usr1_is_a_cancel_and_term_far_from_the_limit_too(make_job, restore_signals,
                                                                monkeypatch):
    job = make_job([])
    signal.signal(signal.SIGUSR1, job.supervisor.on_signal)
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.05)
    with pytest.raises(Stop) as e:
        job.check()
    assert e.value.reason == "cancelled"

    job2 = make_job([])
    job2.job_id = job2.slurm.job_id = "123"

    class Out:
        returncode, stdout, stderr = 0, "2:00:00\n", ""

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Out())
    job2.supervisor.on_signal(signal.SIGTERM, None)
    assert job2.supervisor.resolve_signal() == "cancelled"


@pytest.fixture
def slurm_says(tmp_path, monkeypatch):
    """Stand-ins for scontrol, sinfo, squeue and scancel that answer what a test gives and log every
    call's argv (one line each) to the returned file."""
    bindir, calls = tmp_path / "slurm-bin", tmp_path / "slurm-calls"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    def _says(job_records: list[str] = (), sinfo: str = "", left: str = "2:00:00") -> Path:
        answers = {"scontrol": "\n".join(job_records), "sinfo": sinfo, "squeue": left,
                   "scancel": ""}
        for tool, text in answers.items():
            body = f"echo \"{tool} $*\" >> {calls}\n"
            if tool == "scontrol":
                body += 'case "$1 $2 $3" in "-o show job") ;; *) exit 0 ;; esac\n'
            (bindir / tool).write_text(f"#!/bin/sh\n{body}printf '%b\\n' '{text}'\n")
            (bindir / tool).chmod(0o755)
        return calls

    return _says


def _term(job) -> Stop:
    job.job_id = job.slurm.job_id = "77"
    job.instances.nodes = {"prefill-0": [["0", "n1", "10.0.0.1", "eth0", "-"]],
                 "decode-0": [["0", "n2", "10.0.0.2", "eth0", "-"],
                              ["1", "n3", "10.0.0.3", "eth0", "-"]]}
    job.supervisor.on_signal(signal.SIGTERM, None)
    with pytest.raises(Stop) as e:
        job.check()
    return e.value


def test_a_term_for_a_failed_node_is_node_lost_naming_role_instance_and_node(make_job,
                                                                            slurm_says):
    slurm_says(["JobId=77 JobState=RUNNING Reason=None Restarts=0"], "n1 alloc\nn2 alloc\nn3 down*")
    stop = _term(make_job([]))
    f = stop.failure
    assert (stop.phase, f["reason"]) == ("failed", "node lost")
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("decode", 0, "n3", 1)
    assert stop.reason == "node n3 lost: Slurm reports it down*; Slurm is ending the job"


def test_a_term_with_the_job_ended_nodedown_is_node_lost_though_the_node_is_back(make_job,
                                                                                slurm_says):
    # ReturnToService=2 may bring the node back before we ask: the job's reason still says so
    slurm_says(["JobId=77 JobState=NODE_FAIL Reason=NodeDown Restarts=0"], "n1 alloc\nn2 idle")
    stop = _term(make_job([]))
    assert (stop.phase, stop.failure["reason"]) == ("failed", "node lost")
    assert stop.reason.startswith("a node was lost: Slurm reports it down")


def test_a_term_for_a_preemption_is_a_failure_that_requeue_applies_to(make_job, slurm_says):
    slurm_says(["JobId=77 JobState=PREEMPTED Reason=None PreemptTime=2026-11-23T06:00:00"],
               "n1 alloc\nn2 alloc")
    stop = _term(make_job([]))
    assert (stop.phase, stop.failure["reason"]) == ("failed", "preempted")


@pytest.mark.parametrize("left,want", [("1:30", "time_limit"), ("2:00:00", "cancelled")])
def test_a_term_without_a_slurm_cause_is_the_time_limit_only_near_it(make_job, slurm_says,
                                                                     left, want):
    slurm_says(["JobId=77 JobState=RUNNING Reason=None PreemptTime=None"], "n1 alloc", left)
    stop = _term(make_job([]))
    assert (stop.phase, stop.reason, stop.failure) == ("cancelled", want, None)


def test_a_requeue_keeps_every_component_off_the_lost_node(make_job, slurm_says):
    calls = slurm_says(["JobId=77 HetJobOffset=0 ExcNodeList=(null) Restarts=0",
                        "JobId=78 HetJobOffset=1 ExcNodeList=n9 Restarts=0"], "n3 down*")
    job = make_job([{"index": 0, "name": "prefill"}, {"index": 1, "name": "decode"}], requeue=1)
    job.job_id = job.slurm.job_id = "77"
    job.supervisor.excluded_nodes = ["n3"]
    assert job.requeue.after("node n3 lost", 0)
    argv = calls.read_text().splitlines()
    assert "scontrol requeue 77" in argv
    assert "scontrol update JobId=77+0 ExcNodeList=n3" in argv
    assert "scontrol update JobId=77+1 ExcNodeList=n9,n3" in argv
    assert json.loads((Path(job.dir) / "state.json").read_text())["restarts"] == 1


@pytest.mark.parametrize("restarts,want", [(0, True), (1, False)])
def test_a_job_slurm_requeued_itself_is_kept_only_within_requeue_n(make_job, slurm_says,
                                                                   restarts, want):
    calls = slurm_says(["JobId=77 JobState=REQUEUED Reason=NodeDown Restarts=%d" % (restarts + 1)],
                       "n3 down*")
    job = make_job([], requeue=1)
    job.job_id = job.slurm.job_id = "77"
    job.supervisor.why_terminated(time.time())
    assert job.supervisor.requeued_by_slurm
    assert job.requeue.after("node n3 lost", restarts) is want
    argv = calls.read_text().splitlines()
    assert "scontrol requeue 77" not in argv  # Slurm did it already
    assert ("scancel 77" in argv) is not want


# ------------------------------------------------------------------- a controller that is away

_AWAY = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


@pytest.fixture
def controller_away(tmp_path, monkeypatch):
    """Stand-ins for Slurm's commands that print what a client prints while slurmctld is
    stopped, for the first `fails` calls of each tool (all of them by default), then answer
    `answer`; every call's argv is logged to the returned file."""
    bindir, calls = tmp_path / "away-bin", tmp_path / "away-calls"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    def _away(fails: int = 10**6, answer: str = "") -> Path:
        for tool in ("scontrol", "sinfo", "squeue", "scancel"):
            count = tmp_path / f"{tool}.count"
            (bindir / tool).write_text(
                f"#!/bin/sh\necho \"{tool} $*\" >> {calls}\n"
                f"n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n"
                f"if [ $n -le {fails} ]; then echo '{_AWAY}' >&2; exit 1; fi\n"
                f"printf '%b\\n' '{answer}'\n")
            (bindir / tool).chmod(0o755)
        return calls

    return _away


def test_a_term_while_the_controller_does_not_answer_is_said_so_not_called_a_cancel(
        make_job, controller_away):
    controller_away()
    job = make_job([])
    job.slurm.delays = (0.0, 0.0, 0.0, 0.0)  # its tries, without their waits
    stop = _term(job)
    assert (stop.phase, stop.failure["reason"]) == ("failed", "terminated"), stop.reason
    assert "Unable to contact slurm controller (connect failure)" in stop.reason
    assert stop.reason.startswith("terminated by SIGTERM while Slurm controller unreachable")


def test_a_requeue_is_asked_again_while_the_controller_restarts(make_job, controller_away):
    calls = controller_away(fails=2)
    job = make_job([], requeue=1)
    job.job_id = job.slurm.job_id = "77"
    job.slurm.delays = (0.0, 0.0, 0.0, 0.0)
    assert job.requeue.after("step worker-0 exited with code 1", 0)
    assert calls.read_text().splitlines().count("scontrol requeue 77") == 3
    assert json.loads((Path(job.dir) / "state.json").read_text())["phase"] == "requeued"


def test_a_node_poll_the_controller_does_not_answer_leaves_the_deployment_serving(
        make_job, controller_away):
    calls = controller_away(fails=1, answer="n1 alloc")
    job = make_job([])
    job.instances.nodes = {"worker-0": [["0", "n1", "10.0.0.1", "eth0", "-"]]}
    job.supervisor.check_nodes()  # unanswered: no Stop, no lost node, said once
    st = json.loads((Path(job.dir) / "state.json").read_text())
    assert _AWAY in st["slurm_unreachable"]["detail"] and "sinfo" in st["slurm_unreachable"][
        "detail"]
    assert calls.read_text().count("sinfo") == 1  # the next poll asks again, not this one
    job.supervisor.check_nodes()  # answered: n1 is allocated, all is well again
    assert json.loads((Path(job.dir) / "state.json").read_text())["slurm_unreachable"] is None
    log = (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
    assert "Slurm controller answers again" in log


# ------------------------------------------------------------------------------- requeued srun log

def test_a_retry_is_not_blamed_on_the_previous_tries_srun_lines(make_job):
    job = make_job([], {"decode-0.sh": "echo 'srun: error: nodeY: task 0: Exited with exit "
                                       "code 7'; exit 7"})
    log = Path(job.dir) / "logs" / "decode-0.srun.log"
    log.write_text("srun: error: nodeX: task 1: Killed\n"
                   "srun: launch/slurm: _step_signal: Terminating StepId=9.2\n")
    job.instances.nodes["decode-0"] = [["0", "nodeY", "10.0.0.2", "ib0", "-"],
                             ["1", "nodeX", "10.0.0.3", "ib0", "-"]]
    job.steps.start("decode-0", "steps/decode-0.sh", ["nodeY", "nodeX"])
    assert job.steps["decode-0"].wait(10) == 7
    f = job.supervisor.failure_of("decode-0", 7)
    assert [t["node"] for t in f["tasks"]] == ["nodeY"]
    assert (f["node"], f["node_rank"], f["exit_code"]) == ("nodeY", 0, 7)
    assert "nodeX" in log.read_text()  # the file itself keeps every try


def test_a_task_that_ended_with_code_0_while_the_others_ran_is_the_cause(make_job):
    # What srun --wait=5 printed on the test cluster when node rank 1 of two exited 0.
    job = make_job([], {"worker-0.sh": "cat <<'EOF'\n"
                        "srun: First task exited 5s ago\n"
                        "srun: StepId=1.0 task 0: running\n"
                        "srun: StepId=1.0 task 1: exited\n"
                        "srun: launch/slurm: _step_signal: Terminating StepId=1.0\n"
                        "slurmstepd-node1: error: *** STEP 1.0 ON node1 CANCELLED AT 2026 ***\n"
                        "srun: error: node1: task 0: Killed\n"
                        "srun: Force Terminated StepId=1.0\n"
                        "EOF\nexit 137"})
    job.instances.nodes["worker-0"] = [["0", "node1", "10.0.0.1", "ib0", "-"],
                             ["1", "node2", "10.0.0.2", "ib0", "-"]]
    job.steps.start("worker-0", "steps/worker-0.sh", ["node1", "node2"])
    assert job.steps["worker-0"].wait(10) == 137
    f = job.supervisor.failure_of("worker-0", 137)
    assert (f["node"], f["node_rank"], f["exit_code"]) == ("node2", 1, 0), f
    assert f["log"] == "logs/worker-0.node1.node2.log"
    assert [(t["task"], t["how"], t["cause"]) for t in f["tasks"]] == [
        (0, "Killed", False), (1, "exited", True)]


def test_slurm_task_lists_are_read_as_task_ids():
    assert task_ids("1") == [1]
    assert task_ids("0-2,5") == [0, 1, 2, 5]


# --------------------------------------------------------------------------------------- teardown

def test_run_tears_down_although_state_json_cannot_be_written(make_job, restore_signals,
                                                              monkeypatch):
    job = make_job([], {"engine.sh": "exec sleep 60"})
    (Path(job.dir) / "state.json").write_text(json.dumps({
        "phase": "requeued", "history": [], "smoke_tokens": 4, "serving_after_s": 3.0,
        "finished_at": 1.0, "reason": "old", "failure": {"step": "decode-0"},
        "endpoint": "http://old:8000", "engines_ready_count": 2}))
    job = make_job([], {"engine.sh": "exec sleep 60"})  # reads that state.json
    seen = {}
    real_update = job.state.update

    def update(phase=None, **fields):
        if phase != "starting":
            raise OSError(28, "No space left on device")
        real_update(phase, **fields)

    def serve():
        seen.update(job.state.data)
        job.steps.start("engine-0", "steps/engine.sh", ["n1"])
        raise Stop("failed", "step engine-0 failed")

    monkeypatch.setattr(job.state, "update", update)
    monkeypatch.setattr(job, "serve", serve)
    t0 = time.time()
    assert job.run() == 1
    assert time.time() - t0 < 6
    assert job.steps["engine-0"].poll() is not None
    for k in ("smoke_tokens", "serving_after_s", "finished_at", "reason", "failure", "endpoint"):
        assert seen[k] is None, k
    assert seen["engines_ready_count"] == 0
    log = (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
    assert "could not write state.json (stopping)" in log and "SIGTERM to engine-0" in log
    assert "final state: failed" in log


def test_a_failed_job_removes_its_prometheus_file_sd_first(make_job, restore_signals,
                                                             monkeypatch, tmp_path):
    sd_dir = tmp_path / "sd"
    sd_dir.mkdir()
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "c1")
    job = make_job([], {"engine.sh": "exec sleep 60"}, name="t", file_sd_dir=str(sd_dir))
    order = []

    def serve():
        Path(job.file_sd.path).write_text("[]\n")  # as written while it served
        job.steps.start("engine-0", "steps/engine.sh", ["n1"])
        monkeypatch.setattr(job.steps, "signal", lambda *a: order.append(
            ("signal", os.path.exists(job.file_sd.path))) or real_signal(*a))
        raise Stop("failed", "step engine-0 failed")

    real_signal = job.steps.signal
    monkeypatch.setattr(job, "serve", serve)
    assert job.run() == 1
    assert job.file_sd.path == str(sd_dir / "hpcserve-t-c1.json")
    assert not os.listdir(sd_dir)
    assert order and order[0] == ("signal", False), order  # gone before the engines stop
    log = (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
    assert f"Prometheus file SD removed: {job.file_sd.path}" in log, log


def test_the_kill_tier_runs_even_when_the_term_tier_fails(make_job, monkeypatch):
    job = make_job([], {"engine.sh": IGNORE_TERM})
    job.steps.start("engine-0", "steps/engine.sh", ["n1"])

    def broken(*a, **k):  # not one of Slurm's errors: a bug
        raise ValueError("squeue exploded")

    monkeypatch.setattr(job.slurm, "step_ids", broken)
    with pytest.raises(ValueError):
        job.teardown.run()
    assert job.steps["engine-0"].poll() is not None


# ------------------------------------------------------------------------------------------- HTTP

class _Handler(http.server.BaseHTTPRequestHandler):
    delay = 0.0

    def _send(self, body: dict) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self._send({"ok": True})

    def do_POST(self):
        time.sleep(self.delay)
        self._send({"usage": {"completion_tokens": 4}})

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def _served(handler):
    """An HTTP server of `handler` on a free port of this host, in a thread: its port."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def server():
    with _served(_Handler) as port:
        yield f"http://127.0.0.1:{port}"


def test_runtime_http_ignores_the_submitters_proxy(server, monkeypatch):
    for k in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(k, "http://127.0.0.1:9")  # nothing listens there
    for k in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(OSError):  # what plain urllib does with that environment
        urllib.request.build_opener().open(server + "/health", timeout=2)
    assert probes.http_json(server + "/health") == (200, {"ok": True})


def test_a_signal_cuts_a_slow_smoke_request_short(server, make_job, monkeypatch):
    monkeypatch.setattr(_Handler, "delay", 20.0)
    job = make_job([])
    threading.Timer(0.3, job.supervisor.on_signal, (signal.SIGUSR1, None)).start()
    t0 = time.time()
    with pytest.raises(Stop) as e:
        job.readiness.smoke(server, job.plan.readiness)
    assert e.value.reason == "cancelled" and time.time() - t0 < 3


def test_a_smoke_request_still_counts_its_tokens(server, make_job):
    job = make_job([])
    job.readiness.smoke(server, job.plan.readiness)
    assert job.state.data["smoke_tokens"] == 4


# ----------------------------------------------------------------------------- enroot leftovers

def test_leftover_enroot_containers_are_removed_on_every_component(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    jd = tmp_path / "job"
    p = plan.build(config.load(ROOT / "examples" / "demo.yaml", [
        "site.container.runtime=enroot", "site.container.image=/images/sglang.sqsh",
        f"model.path={model}"]))
    render.write_job(render.render_files(p, str(jd)), jd)
    data = tmp_path / "enroot-data"
    fake_log = tmp_path / "calls.jsonl"
    for k in [k for k in os.environ if k.startswith(("SLURM", "ENROOT_"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("PATH", os.pathsep.join([str(FAKES / "bin"), os.environ["PATH"]]))
    monkeypatch.setenv("HPCSERVE_FAKE_PYTHON", sys.executable)
    monkeypatch.setenv("HPCSERVE_FAKE_LOG", str(fake_log))
    monkeypatch.setenv("HPCSERVE_FAKE_NODES", "nodeA,nodeB")
    monkeypatch.setenv("HPCSERVE_FAKE_HET_SIZE", "2")
    monkeypatch.setenv("ENROOT_DATA_PATH", str(data))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    # What SIGKILLed tasks leave: a container and its record (decode's node B), and a record
    # whose container was never created (prefill's node A).
    made = jd / "run" / "containers"
    made.mkdir()
    (data / "hpcserve-4242.3-decode-0-nodeB" / "etc").mkdir(parents=True)
    (made / "hpcserve-4242.3-decode-0-nodeB").touch()
    (made / "hpcserve-4242.2-prefill-0-nodeA").touch()
    (data / "someone-elses").mkdir()

    job = jobmod.Job(str(jd))
    try:
        assert job.plan.container.runtime == "enroot"
        job.teardown.cleanup_nodes(30)
    finally:
        job.log.close()
    assert sorted(os.listdir(made)) == []
    assert sorted(os.listdir(data)) == ["someone-elses"]
    calls = [json.loads(ln) for ln in fake_log.read_text().splitlines()]
    sruns = sorted((c for c in calls if c["tool"] == "srun"), key=lambda c: c["argv"][0])
    assert len(sruns) == 2, sruns
    for comp, c in enumerate(sruns):
        assert f"--het-group={comp}" in c["argv"] and "--overlap" in c["argv"]
        assert c["command"] == ["bash", f"{jd}/launch/container-task.sh", "--cleanup"]
    assert [c["nodes"] for c in sruns] == [["nodeA", "nodeB"], ["nodeA", "nodeB"]]
    assert "none left" in (jd / "logs" / "hpcserve-job.log").read_text()


def test_no_cleanup_step_without_leftovers_or_for_other_runtimes(make_job, monkeypatch):
    def no_srun(*a, **k):
        raise AssertionError("no srun expected")

    monkeypatch.setattr(subprocess, "Popen", no_srun)
    job = make_job([{"index": 0, "name": "p", "nodes": 1}])
    (Path(job.dir) / "run" / "containers").mkdir()
    (Path(job.dir) / "run" / "containers" / "hpcserve-1.2-p-0-n").touch()
    job.teardown.cleanup_nodes(5)  # runtime none
    job.plan.container.runtime = "enroot"
    (Path(job.dir) / "run" / "containers" / "hpcserve-1.2-p-0-n").unlink()
    job.teardown.cleanup_nodes(5)  # nothing left


def test_killwait_is_read_as_scontrol_prints_it(make_job, tmp_path, monkeypatch):
    # `scontrol show config` prints "KillWait                = 5 sec": the teardown must be over
    # before that, so a value it cannot read would give it the whole grace instead
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text("#!/bin/sh\necho 'KillWait                = 5 sec'\n"
                                     "echo 'SlurmdPort              = 6818'\n")
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    assert make_job([]).teardown.kill_wait() == 5.0


@pytest.mark.parametrize("reason,want_budget", [("time_limit", 115.0), ("cancelled", 2.15)])
def test_a_time_limit_teardown_uses_the_grace_and_a_scancel_keeps_killwait(make_job, monkeypatch,
                                                                           reason, want_budget):
    # signal_grace 120: the time limit's TERM leaves 120 s; a plain scancel's TERM is followed by
    # Slurm's SIGKILL after KillWait (here 5 s), so the teardown must fit in half of that.
    job = make_job([], signal_grace=120)
    monkeypatch.setattr(job.teardown, "kill_wait", lambda: 5.0)
    job.supervisor.signal_seen = (signal.SIGTERM, time.time())
    job.supervisor.signal_reason = reason
    budget, hard_end = job.teardown.budget()
    assert budget == pytest.approx(want_budget, abs=0.1)
    assert (hard_end == float("inf")) == (reason == "time_limit")


# --------------------------------------------------------------------------------- liveness

class _Health(http.server.BaseHTTPRequestHandler):
    mode = "ok"  # ok | hang | 503

    def do_GET(self):
        if _Health.mode == "hang":
            time.sleep(3)
        code = 503 if _Health.mode == "503" else 200
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def health():
    _Health.mode = "ok"
    with _served(_Health) as port:
        yield port


def _closed_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe_tells_hung_from_unreachable_from_unhealthy(health):
    url = f"http://127.0.0.1:{health}/health"
    assert probes.probe(url, 1) == (None, "")
    _Health.mode = "503"
    assert probes.probe(url, 1) == ("unhealthy", "HTTP 503")
    _Health.mode = "hang"
    assert probes.probe(url, 0.5) == ("hung", "no answer within 0.5 s")
    kind, detail = probes.probe(f"http://127.0.0.1:{_closed_port()}/health", 1)
    assert kind == "unreachable" and "refused" in detail


def _liveness_job(make_job, port):
    inst = {"name": "decode-0", "role": "decode", "index": 0, "component": 0, "node_offset": 0,
            "nodes": 2, "tasks_per_node": 1, "port": port, "health_path": "/health",
            "stop_signal": "TERM", "liveness": {"path": "/health", "proves_progress": False, "hung_after": 0.3}}
    job = make_job([], instances=[inst], liveness={"interval": 0.1, "timeout": 0.5,
                                                   "failures": 3, "node_interval": 3600})
    job.instances.nodes["decode-0"] = [["0", "n7", "127.0.0.1", "eth0", "-"],
                             ["1", "n8", "127.0.0.1", "eth0", "-"]]
    job.instances.heads = {"decode-0": "127.0.0.1"}
    return job


def test_a_leader_that_stops_answering_ends_serving_as_hung_naming_it(make_job, health):
    job = _liveness_job(make_job, health)
    threading.Timer(0.5, lambda: setattr(_Health, "mode", "hang")).start()
    with pytest.raises(Stop) as e:
        job.keep_serving(None)
    f = e.value.failure
    assert e.value.phase == "failed" and "decode-0 hung" in e.value.reason
    assert (f["role"], f["instance"], f["node"], f["node_rank"], f["reason"]) == (
        "decode", 0, "n7", 0, "hung")
    assert f["probe"] == f"http://127.0.0.1:{health}/health"


def test_a_probe_that_recovers_resets_the_count(make_job, health, monkeypatch):
    # failing, answering, failing, answering...: never `failures` (3) in a row, never an end
    job = _liveness_job(make_job, health)
    answers = iter([("unhealthy", "HTTP 503"), (None, ""), ("unhealthy", "HTTP 503"),
                    ("hung", "no answer"), (None, ""), (None, "")])

    def flaky(url, timeout):
        try:
            return next(answers)
        except StopIteration:
            raise Stop("cancelled", "all answers given") from None

    monkeypatch.setattr(livenessmod, "probe", flaky)
    with pytest.raises(Stop) as e:
        job.keep_serving(None)
    assert e.value.reason == "all answers given"
    assert "answers again" in (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()


def test_an_srun_stuck_after_terminating_a_step_names_the_lost_node(make_job, monkeypatch):
    # What srun does when a node of the step is gone: it reports the surviving task's end,
    # says it terminates the step, and then waits for the dead node's slurmstepd forever.
    steps = {"decode.sh": "echo 'srun: error: n7: task 0: Exited with exit code 1'\n"
                          "echo 'srun: Terminating StepId=12.3'\nexec sleep 60"}
    job = make_job([], steps)
    job.instances.nodes["decode-0"] = [["0", "n7", "10.0.0.7", "eth0", "-"],
                             ["1", "n8", "10.0.0.8", "eth0", "-"]]
    monkeypatch.setattr(job.supervisor, "slurmd_answers", lambda node: node != "n8")
    job.steps.start("decode-0", "steps/decode.sh", ["n7", "n8"])
    t0 = time.time()
    with pytest.raises(Stop) as e:
        while time.time() - t0 < 10:
            job.check()
            time.sleep(0.05)
    f = e.value.failure
    assert "node n8 lost" in e.value.reason
    assert (f["role"], f["instance"], f["node"], f["node_rank"], f["reason"]) == (
        "decode", 0, "n8", 1, "node lost")
    assert Supervisor.STUCK_SRUN <= time.time() - t0 < Supervisor.STUCK_SRUN + 2


def test_slurm_reporting_a_node_not_responding_is_a_lost_node(make_job, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sinfo").write_text("#!/bin/sh\necho 'n7 mix'\necho 'n8 mix*'\n")
    (bindir / "sinfo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    job = make_job([])
    job.instances.nodes["decode-0"] = [["0", "n7", "10.0.0.7", "eth0", "-"],
                             ["1", "n8", "10.0.0.8", "eth0", "-"]]
    with pytest.raises(Stop) as e:
        job.supervisor.check_nodes()
    f = e.value.failure
    assert e.value.reason == "node n8 lost: Slurm reports it mix*"
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("decode", 0, "n8", 1)


def test_each_nodes_slurmd_address_comes_from_scontrol(make_job, tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(
        "#!/bin/sh\n"
        "if [ \"$2\" = config ]; then echo 'SlurmdPort              = 29312'; exit 0; fi\n"
        "printf 'NodeName=n7 Arch=x86_64\\n   NodeAddr=10.0.0.7 NodeHostName=h\\n\\n"
        "NodeName=n8 Arch=x86_64\\n   NodeAddr=10.0.0.8 NodeHostName=h Port=7000\\n'\n")
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    job = make_job([])
    job.instances.nodes["decode-0"] = [["0", "n7", "10.0.0.7", "eth0", "-"],
                             ["1", "n8", "10.0.0.8", "eth0", "-"]]
    # a node's own Port= where slurm.conf gives one, else the cluster's SlurmdPort
    assert job.slurm.slurmd_addresses(job.instances.node_names()) == {"n7": ("10.0.0.7", 29312), "n8": ("10.0.0.8", 7000)}


# ------------------------------------------------------------------------------ port ownership

def test_own_port_tells_this_process_tree_from_another_holder(tmp_path):
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    free = _closed_port()
    other = __import__("subprocess").Popen(["sleep", "30"])
    try:
        # this test process listens: ours when the tree is ours, the holder named otherwise
        assert ownport.port_verdict(os.getpid(), [port]) == "ours"
        assert ownport.port_verdict(other.pid, [port]) == \
            f"taken {port} by process {os.getpid()} ({Path('/proc/self/comm').read_text().strip()})"
        # a secondary port held elsewhere is a clash even before the serving port listens
        assert ownport.port_verdict(other.pid, [free, port]).startswith(f"taken {port} by ")
        assert ownport.port_verdict(other.pid, [free]) is None
        out = tmp_path / "verdict"
        rc = ownport.main([str(other.pid), f"{free},{port}", str(out), "5"])
        assert rc == 0 and out.read_text().startswith(f"taken {port} by process ")
        # an engine that is dying still has its listening socket listed for a moment, no
        # longer in its own fd table: that must not read as another's
        gone = __import__("subprocess").Popen(["true"])
        gone.wait()
        assert ownport.settled(gone.pid, [port], f"taken {port} by another user's process",
                               set()) is None
        # one seen in the tree before stays its own
        seen = ownport.socket_inodes(os.getpid())
        assert ownport.port_verdict(other.pid, [port], seen) == "ours"
        assert ownport.main([str(gone.pid), f"{free}", str(tmp_path / "none"), "5"]) == 1
        assert not (tmp_path / "none").exists()
    finally:
        other.kill()
        other.wait()
        srv.close()


def test_a_port_another_process_holds_fails_the_instance_naming_port_node_and_holder(make_job):
    job = make_job([])
    job.instances.nodes["decode-0"] = [["0", "n2", "10.0.0.2", "eth0", "-"]]
    ports = Path(job.dir) / "run" / "ports"
    ports.mkdir()
    assert job.instances.owns_port("decode-0") is False  # nothing recorded yet
    (ports / "decode-0").write_text("taken 30000 by process 41 (python3) of Slurm job 9\n")
    with pytest.raises(Stop) as e:
        job.instances.owns_port("decode-0")
    f = e.value.failure
    assert e.value.reason.startswith("port 30000 on node n2 is taken by process 41 (python3) of "
                                     "Slurm job 9: decode-0 cannot serve there")
    assert (f["role"], f["instance"], f["node"], f["reason"], f["port"]) == (
        "decode", 0, "n2", "port taken", 30000)
    (ports / "decode-0").write_text("ours\n")
    assert job.instances.owns_port("decode-0") is True


# ------------------------------------------------------------------------- pyxis image import

@pytest.mark.parametrize("rc", [0, 3])
def test_the_pyxis_image_is_imported_once_before_any_step(make_job, tmp_path, rc):
    helper = tmp_path / "import.sh"
    calls = tmp_path / "calls"
    helper.write_text(f'#!/bin/bash\necho "$@" >> {calls}\necho "pulling layers"\nexit {rc}\n')
    imp = {"uri": "docker://lmsysorg/sglang:v0.5.23", "sqsh": "/cache/sglang.sqsh",
           "helper": str(helper)}
    job = make_job([], container={"runtime": "pyxis", "image": "lmsysorg/sglang:v0.5.23",
                                  "import": imp})
    p = job.discovery.start_image_import()
    if rc == 0:
        job.discovery.wait_image_import(p)
        assert "image ready: /cache/sglang.sqsh" in (Path(job.dir) / "logs" /
                                                     "hpcserve-job.log").read_text()
    else:
        with pytest.raises(Stop) as e:
            job.discovery.wait_image_import(p)
        f = e.value.failure
        assert e.value.reason.startswith("importing docker://lmsysorg/sglang:v0.5.23 into "
                                         "/cache/sglang.sqsh failed (exit 3)")
        assert (f["reason"], f["exit_code"], f["log_tail"]) == (
            "image import failed", 3, ["pulling layers"])
    assert calls.read_text() == "docker://lmsysorg/sglang:v0.5.23 /cache/sglang.sqsh\n"
    # other runtimes, or a site's own squashfs: nothing to import
    assert make_job([]).discovery.start_image_import() is None


# -- hung is not busy: the verdict of one probe target across rounds (health.Track)

HUNG_AFTER = 20.0


def judge(t, at, kind=None, m=None, proves=False, detail="no answer within 5 s"):
    """One round of `t` at time `at` (a 3 s pause and a 5 s probe apart, as on the defaults)."""
    return t.judge(kind, detail if kind else "", m, at, HUNG_AFTER, proves)


def test_a_slow_answer_while_the_counters_move_is_busy_never_a_failure():
    t = livenessmod.Track(0.0)
    assert judge(t, 0, m=(100.0, 2.0)) is None
    for at, progress in enumerate((150.0, 210.0, 260.0, 300.0, 350.0), 1):
        assert judge(t, at * 8, "hung", (progress, 2.0)) is None
        assert t.busy and t.failed == 0


def test_no_answer_with_standing_counters_is_hung_once_hung_after_has_passed():
    # SIGSTOP right after a round that answered: three timed-out rounds 8 s apart
    t = livenessmod.Track(0.0)
    judge(t, 0, m=(100.0, 1.0))
    got = [judge(t, at, "hung", (100.0, 1.0) if at < 16 else None) for at in (8, 16, 24)]
    assert [v[0] for v in got] == ["hung"] * 3 and t.failed == 3
    assert [v[2] for v in got] == [False, False, True]  # ripe at 24 s: within 30 s
    assert "no sign of progress for 24 s" in got[2][1]


def test_a_long_step_shorter_than_hung_after_is_never_ripe():
    # a 19 s step: no answer, no counter moves, then it goes on
    t = livenessmod.Track(0.0)
    judge(t, 0, m=(100.0, 1.0))
    assert [judge(t, at, "hung", (100.0, 1.0))[2] for at in (6, 12, 18)] == [False] * 3
    assert judge(t, 19, m=(180.0, 1.0)) is None and t.failed == 0


def test_an_engine_that_answers_but_holds_requests_without_progress_is_hung():
    # vLLM's /health answers while its engine core hangs: requests held, counters still
    t = livenessmod.Track(0.0)
    judge(t, 0, m=(100.0, 0.0))
    verdicts = [judge(t, at, m=(100.0, 3.0)) for at in (3, 13, 23)]
    assert all(v and v[0] == "hung" and "holds 3 request(s)" in v[1] for v in verdicts)
    assert [v[2] for v in verdicts] == [False, False, True] and t.failed == 3
    assert judge(t, 26, m=(101.0, 3.0)) is None and t.failed == 0  # it moved again


def test_a_health_path_that_proves_generation_is_progress_whatever_the_counters():
    # SGLang's /health_generate answers only once its scheduler produced output: an answer
    # while requests are held under counters that stand still (finish-only ones) is progress
    t = livenessmod.Track(0.0)
    for at in range(0, 120, 8):
        assert judge(t, at, m=(100.0, 4.0), proves=True) is None
    assert t.failed == 0 and t.alive_at == 112


def test_a_counter_the_engine_does_not_export_proves_no_stall():
    t = livenessmod.Track(0.0)
    for at in range(0, 120, 8):
        assert judge(t, at, m=(None, 4.0)) is None


def test_an_idle_engine_with_standing_counters_is_fine():
    t = livenessmod.Track(0.0)
    for at in range(5):
        assert judge(t, at * 30, m=(100.0, 0.0)) is None


def test_a_refused_or_failing_probe_needs_no_hung_after():
    t = livenessmod.Track(0.0)
    judge(t, 0, m=(100.0, 0.0))
    assert judge(t, 1, "unreachable", None, detail="refused") == ("unreachable", "refused", True)


class _Text(http.server.BaseHTTPRequestHandler):
    pages: dict = {}

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.pages[self.path].encode())

    def log_message(self, *a):
        pass


def test_metrics_totals_sums_the_named_series_over_their_labels():
    _Text.pages = {"/metrics": (
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 40.0\n'
        'vllm:generation_tokens_total{engine="1",model_name="m"} 2.0\n'
        'vllm:iteration_tokens_total_count{engine="0"} 7\n'
        'vllm:iteration_tokens_total_bucket{engine="0",le="1.0"} 99\n'
        'vllm:num_requests_running{engine="0"} 3.0\n'
        "vllm:num_requests_waiting 5.0\n")}
    with _served(_Text) as port:
        m = {"url": f"http://127.0.0.1:{port}/metrics", "gauges_url": None,
             "progress": ["vllm:generation_tokens_total", "vllm:iteration_tokens_total_count"],
             "pending": ["vllm:num_requests_running"]}
        assert probes.metrics_totals(m, 2.0) == (49.0, 3.0)
        assert probes.metrics_totals({**m, "progress": ["absent"]}, 2.0) == (None, 3.0)
    assert probes.metrics_totals({**m, "url": "http://127.0.0.1:9/metrics"}, 0.5) is None


def test_metrics_totals_reads_gauges_where_every_scheduler_reports_them():
    # SGLang: the counters on node 0's /metrics, every DP rank's load on /v1/loads
    _Text.pages = {"/metrics": ('sglang:realtime_tokens_total{mode="decode"} 500\n'
                                'sglang:num_running_reqs{dp_rank="0"} 0\n'),
                   "/v1/loads?format=prometheus": ('sglang_num_running_reqs{dp_rank="0"} 0\n'
                                                   'sglang_num_running_reqs{dp_rank="1"} 2\n'
                                                   'sglang_num_running_reqs{dp_rank="5"} 1\n')}
    with _served(_Text) as port:
        base = f"http://127.0.0.1:{port}"
        m = {"url": base + "/metrics", "gauges_url": base + "/v1/loads?format=prometheus",
             "progress": ["sglang:realtime_tokens_total"], "pending": ["sglang_num_running_reqs"]}
        assert probes.metrics_totals(m, 2.0) == (500.0, 3.0)


# ---------------------------------------------------------------------- drain requests, attach

@pytest.mark.parametrize("content, why", [
    ("{", "not a JSON drain request"),
    ("[]", "not a JSON object"),
    ('{"requested_at": 1}', "timeout_s must be a number >= 0, not None"),
    ('{"timeout_s": -1}', "timeout_s must be a number >= 0, not -1"),
    ('{"timeout_s": true}', "timeout_s must be a number >= 0, not True"),
    ('{"timeout_s": NaN}', "timeout_s must be a number >= 0, not nan"),
    ('{"timeout_s": 5, "requested_at": "now"}', "requested_at must be a number >= 0"),
    ('{"timeout_s": 5, "job_id": 812}', "job_id must be a string, not 812"),
])
def test_a_bad_drain_request_is_refused_naming_file_and_field(tmp_path, content, why):
    p = tmp_path / "drain-decode-0.json"
    p.write_text(content)
    with pytest.raises(drainmod.DrainRequestError) as e:
        drainmod.read_request(str(p))
    assert str(e.value).startswith(f"{p}: ") and why in str(e.value), e.value


def test_drain_requests_are_the_json_files_named_for_an_instance(tmp_path):
    assert drainmod.read_request(_write(tmp_path / "x.json", {"timeout_s": 2.5})) == \
        drainmod.Request(2.5, None, None)
    for f in ("drain-decode-1.json", "drain-decode-0.json", "drain-decode-2.taken",
              "drain-decode-3.refused", "drain-decode-4.json.tmp", "drain-.json", "other.json"):
        (tmp_path / f).write_text("{}")
    assert drainmod.requests_in(str(tmp_path)) == [
        ("decode-0", str(tmp_path / "drain-decode-0.json")),
        ("decode-1", str(tmp_path / "drain-decode-1.json"))]
    assert drainmod.requests_in(str(tmp_path / "none")) == []


def _write(path: Path, obj) -> str:
    path.write_text(json.dumps(obj))
    return str(path)


class _Engine(http.server.BaseHTTPRequestHandler):
    """An engine's /metrics: `pending` requests held, `queued` waiting (Prometheus text)."""
    pending = 0
    queued = 0

    def do_GET(self):
        body = (f"# TYPE eng:running gauge\neng:running{{model=\"m\"}} {_Engine.pending}\n"
                f"eng:waiting{{model=\"m\"}} {_Engine.queued}\neng:tokens_total 7\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def engine():
    with _served(_Engine) as port:
        yield port


def _serving_job(make_job, port: int, attach: dict | None, n: int = 1):
    """A job serving `n` worker instances on this host (each a `sleep` standing for its srun
    client, the engine's metrics on `port`), recovery begun without a router."""
    insts = [{"name": f"worker-{i}", "role": "worker", "index": i, "component": 0,
              "node_offset": 0, "nodes": 1, "tasks_per_node": 1, "port": port,
              "health_path": "/health",
              "stop_signal": "TERM", "metrics": {"path": "/metrics", "progress": ["eng:tokens_total"],
                                                 "pending": ["eng:running"],
                                                 "queued": ["eng:waiting"]}}
             for i in range(n)]
    job = make_job([], instances=insts, attach=attach, caches=None,
                   liveness={"interval": 0.1, "timeout": 1, "failures": 3, "node_interval": 60},
                   recovery={"worker": {"restart": True, "max_restarts": 1, "backoff_s": 1,
                                        "min_serving": n, "spares": 0}})
    for i in insts:
        job.instances.nodes[i["name"]] = [["0", "n1", "127.0.0.1", "eth0", "-"]]
        job.instances.heads[i["name"]] = "127.0.0.1"
        job.steps.procs[i["name"]] = subprocess.Popen(["sleep", "60"])
    job.state.update("serving", attach=attach)
    job.begin_serving(None)
    return job


def _drain(job, name: str, timeout_s: float) -> Path:
    d = Path(job.dir) / contract.CONTROL_DIR
    d.mkdir(parents=True, exist_ok=True)
    _write(d / f"drain-{name}.json", {"timeout_s": timeout_s, "requested_at": time.time()})
    job.drains.scan()
    return d


@pytest.mark.parametrize("request_, why", [
    ({"job_id": "811"}, "it is for job 811, this is job 812: left here, ignored"),
    ({"requested_at": 1.0}, "it names no job and was written before this job began"),
])
def test_a_drain_request_left_for_another_job_in_this_directory_drains_nothing(
        make_job, engine, request_, why):
    """A renewal's twin directory, or a slot's, runs a new job after the last: a request
    written for the job before (or, naming none, before this job began) is refused."""
    job = _serving_job(make_job, engine, ATTACH)
    job.job_id = "812"
    d = Path(job.dir) / contract.CONTROL_DIR
    d.mkdir(parents=True, exist_ok=True)
    _write(d / "drain-worker-0.json", {"timeout_s": 5, "requested_at": time.time(), **request_})
    job.drains.scan()
    assert (d / "drain-worker-0.refused").exists() and not job.drains.under_way
    assert job.table.recs["worker-0"].status == "serving"
    assert f"drain request for worker-0 refused: {why}" in \
        (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
    # the same request for this job is taken
    _write(d / "drain-worker-0.json", {"timeout_s": 5, "requested_at": time.time(),
                                       "job_id": "812"})
    job.drains.scan()
    assert (d / "drain-worker-0.taken").exists() and "worker-0" in job.drains.under_way


def _ticks(job, until, timeout: float = 10):
    end = time.time() + timeout
    while not until():
        assert time.time() < end, (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
        job.tick()  # the serving loop's tick: checks, drains, recovery, the end it decides
        time.sleep(0.02)


ATTACH = {"router_url": "http://127.0.0.1:9", "workers_api": "queued", "api_key_env": None,
          "front_job_id": "41", "front_job_dir": "/jobs/front", "deployment": "t"}


def test_a_drain_waits_for_the_pending_gauges_then_stops_the_step_and_the_job_ends(make_job,
                                                                                   engine):
    _Engine.pending, _Engine.queued = 2, 1
    job = _serving_job(make_job, engine, ATTACH)
    client = job.steps.procs["worker-0"]
    ctl = _drain(job, "worker-0", 30)
    assert (ctl / "drain-worker-0.taken").exists() and not (ctl / "drain-worker-0.json").exists()
    rec = job.table.recs["worker-0"]
    assert rec.status == "draining" and job.table.phase() == "serving"
    assert not any(t[0] == "worker-0" for t in job.liveness.targets())  # not probed
    _ticks(job, lambda: job.drains.under_way["worker-0"].pending == 3)  # 2 held, 1 queued
    assert client.poll() is None  # held requests: not stopped
    _Engine.pending = 0
    _ticks(job, lambda: job.drains.under_way["worker-0"].pending == 1)  # one still queued
    assert client.poll() is None  # a queued request would fail too: not stopped
    _Engine.queued = 0
    with pytest.raises(Stop) as e:
        _ticks(job, lambda: False)
    assert (e.value.phase, e.value.reason) == ("done", contract.SCALED_IN)
    assert client.wait(5) == -signal.SIGTERM and rec.status == "removed"
    assert rec.attempts[-1]["end"] == "drained"
    log = (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
    assert re.search(r"worker-0: no request in flight [\d.]+ s after it left the router", log)
    st = json.loads((Path(job.dir) / "state.json").read_text())
    assert st["instances"]["worker-0"]["status"] == "removed"
    jsonschema.validate(st, contract.STATE_SCHEMA)
    # once removed, a new request for it is refused, and said why
    _drain(job, "worker-0", 1)
    assert (ctl / "drain-worker-0.refused").exists()
    assert "drain request for worker-0 refused: worker-0 is removed, not serving" in \
        (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()


def test_a_drain_stops_at_its_timeout_and_a_front_job_keeps_serving(make_job, engine):
    _Engine.pending = 1  # a request that never ends
    job = _serving_job(make_job, engine, None, n=2)
    _drain(job, "worker-1", 0.3)
    _drain(job, "nope-0", 1)
    _ticks(job, lambda: job.table.recs["worker-1"].status == "removed")
    log = (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
    assert "worker-1: 1 request(s) still in flight after its drain timeout (0.3 s)" in log
    assert "drain request for nope-0 refused: this job has no instance nope-0" in log
    # the role's minimum (2) counts the instances kept: still serving, not recovering
    assert job.table.phase() == "serving"
    _Engine.pending = 0
    _drain(job, "worker-0", 1)
    _ticks(job, lambda: job.table.recs["worker-0"].status == "removed")
    job.tick()  # a front job with every instance removed serves on: no Stop
    assert job.table.phase() == "serving"


def test_an_attached_job_leaving_a_router_that_is_gone_says_so_and_goes_on(make_job):
    job = _serving_job(make_job, _closed_port(), {**ATTACH, "router_url":
                                                  f"http://127.0.0.1:{_closed_port()}"})
    job.membership.connect(job.plan.attach.router_url)
    job.attach.leave(1.0)
    log = (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()
    assert "taking this job's instances out of the router at http://127.0.0.1:" in log
    assert "no answer from the router" in log, log


class _SlotJob:
    """What Attach reads of a slot's job: its plan's attach and its state.json writer."""

    def __init__(self, front_dir: Path):
        self.plan = Spec({"attach": {"router_url": None, "workers_api": "queued",
                                     "api_key_env": None, "front_job_id": None,
                                     "front_job_dir": str(front_dir), "deployment": "d"}})
        self.recorded: list[dict] = []
        self.state = type("S", (), {"update": lambda _s, **kw: self.recorded.append(kw)})()


@pytest.mark.parametrize("front_state, url", [
    # a front of router alone: its router's address from router_ready on, before it serves
    ({"phase": "router_ready", "router_url": "http://r:8000", "endpoint": "http://r:8000",
      "job_id": "7"}, "http://r:8000"),
    # a front with engines of its own (state.json before spec 10 had no router_url)
    ({"phase": "serving", "endpoint": "http://r:8000", "job_id": "7"}, "http://r:8000"),
    ({"phase": "starting", "job_id": "7"}, None),
    ({"phase": "cancelled", "router_url": "http://r:8000", "job_id": "7"}, None),
])
def test_a_slot_reads_the_front_s_router_from_router_ready_on(tmp_path, front_state, url):
    from hpcserve.runtime.attach import Attach
    (tmp_path / "state.json").write_text(json.dumps(front_state))
    job = _SlotJob(tmp_path)
    att = Attach(job)
    if url is None:
        with pytest.raises(Stop, match=f"names no serving router \\(phase "
                                       f"{front_state['phase']}\\)"):
            att._resolved(att.spec)
        return
    got = att._resolved(att.spec)
    assert (got.router_url, got.front_job_id) == (url, "7")
    assert job.recorded == [{"attach": got.as_json()}]
