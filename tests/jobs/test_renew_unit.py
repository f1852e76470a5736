"""The renewal's own logic in the in-job runtime (runtime/renew.py), without a cluster: Slurm's
squeue, sbatch and scancel are stand-ins on PATH that answer what a test gives and log each
call; the job is a real runtime Job over a job directory whose twin is a real directory too.
The whole renewal on the real cluster is tests/jobs/test_renew_jobs.py."""

from __future__ import annotations

import json
import os
import signal
import types
from pathlib import Path

import jsonschema
import pytest

from hpcserve.runtime import contract
from hpcserve.runtime import job as jobmod
from hpcserve.runtime import renew as renewmod
from hpcserve.runtime.failures import Stop

AWAY = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    """squeue prints `left` (or the words of a controller that is away), and of another job
    RUNNING, or Slurm's words for an id it no longer knows (`known` False); sbatch prints the
    next job id; every call's argv is a line of the returned file."""
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    def _says(left: str | None = "0:50", known: bool = True) -> Path:
        other = "echo RUNNING" if known else \
            "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"
        squeue = f"echo '{AWAY}' >&2; exit 1" if left is None else \
            f'case "$*" in *%T*) {other} ;; *) echo \'{left}\' ;; esac'
        for tool, body in (("squeue", squeue), ("sbatch", "echo 501"), ("scancel", "true")):
            (bindir / tool).write_text(f"#!/bin/sh\necho \"{tool} $*\" >> {calls}\n{body}\n")
            (bindir / tool).chmod(0o755)
        return calls

    return _says


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A serving instance job (its decode-0 serving) whose plan renews into tmp/twin with a
    40 s margin; the SIGURG handler the job sets is put back after."""
    saved = signal.getsignal(signal.SIGURG)
    monkeypatch.setenv("SLURM_JOB_ID", "500")
    monkeypatch.setattr(renewmod, "RETRY_S", 0.0)
    twin = tmp_path / "twin"
    twin.mkdir()
    d = tmp_path / "job"
    for sub in ("logs", "run", "steps"):
        (d / sub).mkdir(parents=True)
    plan = {"spec": contract.SPEC, "spec_version": contract.SPEC_VERSION, "components": [],
            "instances": [], "router": None, "signal_grace": 10, "requeue": 0,
            "attach": None, "in_allocation": False,
            "renew": {"twin_dir": str(twin), "margin_s": 40}}
    (d / "plan.json").write_text(json.dumps(plan))
    j = jobmod.Job(str(d))
    j.table.active = True
    j.table.recs = {"decode-0": types.SimpleNamespace(status="serving")}
    yield j
    j.log.close()
    signal.signal(signal.SIGURG, saved)


def _sbatches(calls: Path) -> int:
    return sum(ln.startswith("sbatch ") for ln in calls.read_text().splitlines()) \
        if calls.exists() else 0


def _log(job) -> str:
    return (Path(job.dir) / "logs" / "hpcserve-job.log").read_text()


def _twin_state(job, phase: str, job_id: str) -> None:
    Path(job.renewal.spec.twin_dir, "state.json").write_text(json.dumps(
        {"phase": phase, "job_id": job_id, "history": [], "updated_at": 0, "reason": "x"}))


def test_nothing_is_submitted_before_the_margin(job, slurm):
    calls = slurm("1:30")  # 90 s left, margin 40 s
    job.renewal.tick()
    assert _sbatches(calls) == 0 and job.renewal.successor is None


def test_at_the_margin_the_twin_is_submitted_once_it_is_not_in_use(job, slurm):
    calls = slurm("0:35")
    _twin_state(job, "serving", "400")  # the twin's last job still runs
    job.renewal.tick()
    assert _sbatches(calls) == 0
    assert f"{job.renewal.spec.twin_dir} is in use by job 400 (serving)" in _log(job)
    _twin_state(job, "done", "400")
    job.renewal.tick()
    twin = job.renewal.spec.twin_dir
    assert _sbatches(calls) == 1
    assert f"sbatch --parsable {twin}/job.sbatch" in calls.read_text()
    st = json.loads((Path(job.dir) / "state.json").read_text())["renew"]
    assert (st["successor_job_id"], st["trigger"]) == ("501", "40 s before the time limit"), st
    job.renewal.tick()  # not again
    assert _sbatches(calls) == 1


def test_a_twin_whose_job_slurm_no_longer_knows_is_free_though_it_never_wrote_its_end(
        job, slurm):
    calls = slurm("0:35", known=False)
    _twin_state(job, "serving", "400")  # killed outright: its state.json says serving still
    job.renewal.tick()
    assert "squeue -h -j 400 -o %T" in calls.read_text() and _sbatches(calls) == 1


def test_a_successor_that_ends_before_serving_is_submitted_again(job, slurm):
    calls = slurm("0:35")
    job.renewal.tick()
    _twin_state(job, "failed", "501")
    job.renewal.tick()
    assert "successor job 501 ended failed (x) before it served; trying again" in _log(job)
    job.renewal.tick()
    assert _sbatches(calls) == 2


def test_a_renewal_whose_every_successor_fails_is_said_lapsed_in_state_and_status(job, slurm):
    from hpcserve.operate.ops import View, lapse_line
    calls = slurm("0:35")
    for k in range(renewmod.TRIES):
        job.renewal.tick()
        assert _sbatches(calls) == k + 1
        _twin_state(job, "failed", "501")  # each successor the stub submits is job 501
        job.renewal.tick()
    job.renewal.tick()
    assert _sbatches(calls) == renewmod.TRIES  # no fourth
    assert f"no more tries ({renewmod.TRIES})" in _log(job)
    st = json.loads((Path(job.dir) / "state.json").read_text())
    jsonschema.validate(st["renew"], contract.STATE_SCHEMA["properties"]["renew"])
    lapsed = st["renew"]["lapsed"]
    assert lapsed.startswith(f"{renewmod.TRIES} successor(s) tried, the last: successor job "
                             "501 ended failed (x) before it served"), lapsed
    v = View(job_id="500", name="d-decode-1", job_dir=job.dir, remote=None, phase="serving",
             slurm_state="RUNNING", driver="running", state={**st, "phase": "serving"})
    assert lapse_line(v) == f"  renewal lapsed: {lapsed}"
    assert lapse_line(View(job_id="500", name="d", job_dir=job.dir, remote=None,
                           phase="serving", slurm_state="RUNNING", driver="running",
                           state={"renew": {"twin_dir": "/x"}})) is None


def test_slurm_s_warning_signal_submits_at_once_while_the_controller_is_away(job, slurm):
    calls = slurm(None)  # the end cannot be asked
    job.renewal.tick()
    assert _sbatches(calls) == 0 and job.renewal.end is None
    os.kill(os.getpid(), signal.SIGURG)  # the job's own handler records it
    job.renewal.tick()
    assert "renewal (Slurm's warning signal): submitted job 501" in _log(job)


def test_the_twin_serving_drains_every_instance_then_the_job_ends_for_it(job, slurm):
    slurm("0:35")
    job.renewal.tick()
    _twin_state(job, "serving", "501")
    job.renewal.tick()
    req = Path(contract.drain_request_path(job.dir, "decode-0"))
    assert 1 <= json.loads(req.read_text())["timeout_s"] <= renewmod.DRAIN_S
    job.renewal.tick()  # still serving: drains.py takes the request
    job.table.recs["decode-0"].status = "removed"
    with pytest.raises(Stop) as stop:
        job.renewal.tick()
    assert (stop.value.phase, stop.value.reason) == ("done", "renewed by job 501")


def test_a_job_scaled_in_on_request_no_longer_renews_and_cancels_its_successor(job, slurm):
    calls = slurm("0:35")
    job.renewal.tick()
    job.table.recs["decode-0"].status = "draining"
    job.renewal.tick()
    assert "scancel 501" in calls.read_text()
    assert "no longer renews; its successor job 501 is cancelled" in _log(job)


@pytest.mark.parametrize("left, up", [("0:09", True), ("0:11", False)])
def test_the_job_stops_itself_signal_grace_before_its_limit(job, slurm, left, up):
    slurm(left)  # the TERM at signal_grace (10 s) is not asked for: RENEW_SIGNAL is
    assert job.renewal.time_is_up(renewmod.now()) is up


def test_the_successor_does_not_inherit_this_job_s_slurm_variables(job, slurm, monkeypatch,
                                                                     tmp_path):
    calls = slurm("0:35")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")  # this job was requeued twice; not its twin
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/x.conf")
    sbatch = Path(os.environ["PATH"].split(":")[0]) / "sbatch"
    sbatch.write_text(f"#!/bin/sh\necho \"sbatch $*\" >> {calls}\nenv > {tmp_path / 'env'}\n"
                      "echo 501\n")
    job.renewal.tick()
    env = (tmp_path / "env").read_text().splitlines()
    assert "SLURM_CONF=/etc/slurm/x.conf" in env
    assert not [v for v in env if v.startswith(("SLURM_RESTART_COUNT=", "SLURM_JOB_ID="))], env
