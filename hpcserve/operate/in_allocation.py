"""`hpcserve submit --in-allocation`: a deployment run as steps of an allocation the user already
holds (an `salloc` shell, or the user's own batch script), for sites where users keep one for days.

The job directory is rendered for it (plan.json "in_allocation": every step names its nodes
within the allocation instead of a het group), checked to fit what Slurm says the allocation
holds before anything starts, and its job.sbatch is started here as a process in a session of
its own: in the background (the shell it came from is free, but must stay: salloc gives the
allocation back when its shell exits, a batch script's job ends when the script returns), or
waited for with --foreground (a batch script's last line). That process, the driver, runs on
this host (the login node for an salloc shell on most sites) and is recorded in the job directory (run/driver.json: PID, its start time against PID reuse, host)
so that `status` can tell it is gone and `cancel` can ask it to stop (SIGUSR1: the runtime's
orderly teardown). Cancel ends the deployment's own steps, never the allocation.
"""

from __future__ import annotations

import json
import os
import posixpath
import signal
import socket
import subprocess
import time
from typing import Callable

from ..errors import HpcserveError
from ..runtime import allocation, file_sd
from ..runtime.contract import TERMINAL_PHASES
from ..runtime.slurm_queue import parse_steps, steps_argv
from ..runtime.spec import Spec

DRIVER = posixpath.join("run", "driver.json")


def allocation_here(environ=os.environ) -> str:
    """The job id of the allocation this shell is in; refused where there is none."""
    job_id, nodes = environ.get("SLURM_JOB_ID"), environ.get("SLURM_JOB_NODELIST")
    if not job_id or not nodes:
        raise HpcserveError("--in-allocation runs inside an allocation (an salloc shell, or your "
                            "batch script): SLURM_JOB_ID and SLURM_JOB_NODELIST are not set here")
    if environ.get("SLURM_HET_SIZE"):
        raise HpcserveError(f"allocation {job_id} is a heterogeneous job: --in-allocation needs "
                            "an allocation of one component")
    return job_id


def check_fits(spec: Spec, job_id: str, runner) -> allocation.Held:
    """What the allocation holds, refused (one line, the numbers) where the deployment does not
    fit: nodes per role, GPUs per node."""
    try:
        held = allocation.held(job_id, lambda argv: runner.run(argv).out)
    except ValueError as e:
        raise HpcserveError(str(e)) from None
    if held.state != "RUNNING":
        raise HpcserveError(f"allocation {job_id} is {held.state}, not RUNNING")
    why = allocation.misfit(spec, held)
    if why:
        raise HpcserveError(f"does not fit: {why}")
    return held


def fits_words(spec: Spec, held: allocation.Held) -> str:
    """Where each component would run (`submit --in-allocation --check`)."""
    nodes = allocation.node_map(spec, held.nodes)
    return f"fits in allocation {held.job_id}: {allocation.placement_words(spec, nodes)}"


def refuse_second(job_id: str, runner, entries) -> None:
    """One deployment at a time in an allocation: each takes the allocation's first nodes."""
    for e in entries:
        if e.allocation == job_id and driver_state(runner, e.job_dir) == "running":
            raise HpcserveError(f"allocation {job_id} already runs deployment {e.handle} on its "
                                f"first nodes: cancel it first (hpcserve cancel {e.handle})")


def start_driver(job_dir: str, job_id: str) -> subprocess.Popen:
    """job.sbatch as a process of its own session (no terminal: no SIGHUP reaches it when the
    shell's terminal goes), output to logs/batch-<allocation>.out; recorded in
    run/driver.json. It runs as long as the allocation does: salloc gives the allocation back
    when its shell exits, and a batch script's job ends when the script returns."""
    os.makedirs(os.path.join(job_dir, "run"), exist_ok=True)
    with open(os.path.join(job_dir, "logs", f"batch-{job_id}.out"), "ab") as out:
        p = subprocess.Popen(["bash", os.path.join(job_dir, "job.sbatch")], cwd=job_dir,
                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
    rec = {"pid": p.pid, "start": _start_time(_read(f"/proc/{p.pid}/stat")),
           "host": socket.gethostname(), "allocation": job_id}
    tmp = os.path.join(job_dir, DRIVER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, os.path.join(job_dir, DRIVER))
    return p


def detach(p: subprocess.Popen) -> None:
    """The driver outlives this command: not waited for (no ResourceWarning). Until this
    command exits it stays this process's child (a zombie once it ended: driver_state)."""
    p.returncode = 0


def run_in_place(p: subprocess.Popen, meanwhile: Callable[[], object] = lambda: None) -> int:
    """--foreground: `meanwhile` (following the phases), then wait for the driver and return
    its exit code (the deployment's end). An interrupt or SIGTERM to this command asks the
    driver for its orderly teardown (SIGUSR1), as `hpcserve cancel` does, and waits on."""
    def forward(_sig, _frame):
        try:
            p.send_signal(signal.SIGUSR1)
        except OSError:
            pass
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        meanwhile()
        return p.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _start_time(stat: str | None) -> str | None:
    """/proc/PID/stat's starttime (field 22, after the command in parentheses)."""
    return _stat_field(stat, 19)


def _stat_field(stat: str | None, i: int) -> str | None:
    """Field 3 + i of /proc/PID/stat (0: the state, 19: the start time), counted after the
    command in parentheses (which may hold spaces and parentheses itself)."""
    try:
        return stat.rsplit(")", 1)[1].split()[i] if stat else None
    except IndexError:
        return None


def driver(runner, job_dir: str) -> dict | None:
    text = runner.read_text(posixpath.join(job_dir, DRIVER))
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def driver_state(runner, job_dir: str, rec: dict | None = None) -> str | None:
    """"running", "gone", or "elsewhere" (it runs on another host: cannot be asked from here);
    None where no driver was recorded."""
    rec = rec or driver(runner, job_dir)
    if not rec:
        return None
    if runner.run(["hostname"], check=False).out.strip() != rec.get("host"):
        return "elsewhere"
    stat = runner.read_text(f"/proc/{int(rec['pid'])}/stat")
    if not stat or _start_time(stat) != rec.get("start"):
        return "gone"
    # Z: it ended and its parent (the `submit --follow` that started it) has not reaped it yet
    return "gone" if _stat_field(stat, 0) in ("Z", "X") else "running"


# --------------------------------------------------------------------------------------- cancel

def step_names(spec: dict) -> set[str]:
    """The names of every step the deployment runs (attempts add .attemptN to an instance's)."""
    return ({i["name"] for i in spec.get("instances", [])} | {"router", "bench"} |
            {f"discover-{c['name']}" for c in spec.get("components", [])} |
            {"container-cleanup", "scratch-cleanup"})


def end_steps(runner, job_id: str, spec: dict, echo: Callable[[str], None]) -> None:
    """scancel JOBID.STEPID for each of the deployment's steps still running in the allocation,
    never the allocation itself."""
    names, pre = step_names(spec), allocation.step_prefix(spec["name"], True)
    res = runner.run(steps_argv([job_id]))
    ids = [s.step_id for s in parse_steps(res.out) if s.name.startswith(pre) and
           s.name[len(pre):].split(".attempt")[0] in names and "." in s.step_id]
    if ids:
        runner.run(["scancel", *ids])
    echo(f"ended the deployment's steps in allocation {job_id}: "
         f"{' '.join(ids) if ids else 'none was running'}; the allocation goes on")


def cancel(entry, runner, *, wait: bool, echo: Callable[[str], None]) -> int:
    """SIGUSR1 to the driver (the runtime's orderly teardown: router first, then engines); its
    steps ended through Slurm where the driver is gone or does not finish in time."""
    jd, alloc = entry.job_dir, entry.allocation
    state = json.loads(runner.read_text(posixpath.join(jd, "state.json")) or "{}")
    spec = json.loads(runner.read_text(posixpath.join(jd, "plan.json")) or "{}")
    rec = driver(runner, jd)
    how = driver_state(runner, jd, rec)
    if state.get("phase") in TERMINAL_PHASES and how != "running":
        echo(f"deployment {entry.handle} had already ended: {state['phase']}; nothing to cancel")
        return 0
    if how == "elsewhere":
        raise HpcserveError(f"the deployment's driver runs on {rec['host']} (pid {rec['pid']}): "
                            "run hpcserve cancel there")
    if how != "running":
        end_steps(runner, alloc, spec, echo)
        remove_file_sd(runner, entry, spec)
        return 0
    runner.run(["kill", "-USR1", str(int(rec["pid"]))])
    echo(f"cancelling deployment {entry.handle} in allocation {alloc}: orderly teardown "
         "requested; the allocation goes on")
    if not wait:
        return 0
    end = time.time() + float(spec.get("signal_grace", 120)) + 30
    while time.time() < end:
        if driver_state(runner, jd, rec) != "running":
            text = runner.read_text(posixpath.join(jd, "state.json")) or "{}"
            echo(json.loads(text).get("phase") or "ended")
            return 0
        time.sleep(0.3)
    end_steps(runner, alloc, spec, echo)
    runner.run(["kill", "-KILL", str(int(rec["pid"]))], check=False)
    remove_file_sd(runner, entry, spec)
    echo(f"deployment {entry.handle} did not finish its teardown in time: its steps ended")
    return 2


def remove_file_sd(runner, entry, spec: dict) -> None:
    """The Prometheus file-SD file of a driver that could not remove it itself (gone, or
    killed): Prometheus stops scraping the ended steps' addresses. Named as the driver names it
    (runtime/file_sd.py), with or without the cluster's name (SLURM_CLUSTER_NAME where it ran)."""
    d = spec.get("file_sd_dir")
    if not d or not spec.get("name"):
        return
    d = runner.expand_path(d)
    paths = {posixpath.join(d, file_sd.file_name(spec["name"], c, entry.allocation))
             for c in (entry.cluster, None)}
    runner.run(["rm", "-f", "--", *sorted(paths)], check=False)
