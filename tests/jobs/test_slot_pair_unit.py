"""A renewing autoscale slot in the front's runtime (runtime/autoscale.py), without a cluster:
the slot is its pair of directories, and the job the pair runs now is followed from state.json
files as renew.py writes them; Slurm's squeue and scancel are a stand-in that answers for the
job ids a test names and records each call. The whole of it on the real cluster is
tests/jobs/test_autoscale_renew_jobs.py."""

from __future__ import annotations

import json
import types

import pytest

from hpcserve.runtime import autoscale as am
from hpcserve.runtime.autoscale_slots import pair_jobs
from hpcserve.runtime.contract import SCALED_IN
from hpcserve.runtime.slurm import Slurm as RealSlurm
from hpcserve.runtime.spec import Spec


class Slurm:
    """squeue knows the ids in `alive` (Slurm's words for any other); scancel is recorded."""

    def __init__(self):
        self.alive: set[str] = set()
        self.cancelled: list[list[str]] = []

    def run(self, argv, retry=True, timeout=None):
        jid = argv[argv.index("-j") + 1]
        if jid not in self.alive:
            raise RuntimeError("slurm_load_jobs error: Invalid job id specified")
        return "RUNNING\n"

    job_alive = RealSlurm.job_alive  # the runtime's reading of the answer above

    def command(self, argv, retry=True):
        self.cancelled.append(argv)
        return ""


def _state(d, job_id, phase="serving", inst="serving", renew=None) -> None:
    (d / "state.json").write_text(json.dumps({
        "job_id": job_id, "phase": phase, "instances": {"worker-0": {"status": inst}},
        "renew": renew}))


@pytest.fixture
def front(tmp_path, monkeypatch):
    """A front whose one autoscaled role has one slot, the pair scale/worker-s1{,b}, its own
    instance kept; the slot's job 2 serves in worker-s1."""
    a, b = tmp_path / "worker-s1", tmp_path / "worker-s1b"
    for d, twin in ((a, b), (b, a)):
        d.mkdir()
        (d / "plan.json").write_text(json.dumps({
            "instances": [{"name": "worker-0"}], "renew": {"twin_dir": str(twin),
                                                           "margin_s": 40}}))
    # Slurm is asked whether a running slot job still is only where a test says so
    monkeypatch.setattr(am, "ALIVE_S", float("inf"))
    logged: list[str] = []
    spec = {"min": 1, "max": 2, "signal": {"kind": "running", "metrics": ["m"]}, "target": 5,
            "cool_down_s": float("inf"), "interval_s": 1, "drain_timeout_s": 5, "slots": [str(a)]}
    job = types.SimpleNamespace(
        plan=Spec({"autoscale": {"worker": spec}, "instances": []}), slurm=Slurm(),
        log=logged.append, table=types.SimpleNamespace(
            kept=lambda role: [types.SimpleNamespace(status="serving")]))
    scaler = am.Autoscaler(job)
    role = scaler.roles["worker"]
    (slot,) = role.slots
    slot.job_id, slot.status = "2", "serving"
    _state(a, "2")
    return types.SimpleNamespace(scaler=scaler, role=role, slot=slot, a=a, b=b, log=logged,
                                 slurm=job.slurm)


def _round(f) -> tuple:
    """One read and decision (8 running; within the cool-down: no add, no remove), as the
    front's tick does them."""
    status = f.scaler._slot_status(f.slot)
    f.scaler._decide(f.role, [8.0], {f.slot.name: (f.slot.job_id, *status)})
    return status


def test_a_successor_not_serving_yet_leaves_the_slot_with_its_job(front):
    _state(front.a, "2", renew={"successor_job_id": "3", "twin_dir": str(front.b)})
    _state(front.b, "3", phase="starting", inst="starting")
    assert _round(front) == ("2", str(front.a), "serving")
    assert pair_jobs(front.slot) == [("2", str(front.a)), ("3", str(front.b))]


def test_the_successor_takes_the_slot_over_once_it_serves_counted_once(front):
    _state(front.a, "2", renew={"successor_job_id": "3", "twin_dir": str(front.b)})
    _state(front.b, "3")
    assert _round(front) == ("3", str(front.b), "serving")
    s = front.slot
    assert (s.job_id, s.job_dir, s.status, s.prev) == ("3", str(front.b), "serving",
                                                       ("2", str(front.a)))
    assert front.role.capacity == 2 and front.role.decisions == []  # no add, no remove
    assert s.as_state() == {"dir": str(front.b), "job_id": "3", "status": "serving"}
    assert any("worker-s1 renewed: job 3" in line and "from job 2" in line
               for line in front.log), front.log


def test_a_job_that_ended_before_its_successor_started_hands_the_slot_to_the_queued_one(front):
    _state(front.a, "2", phase="done", inst="removed",
           renew={"successor_job_id": "3", "twin_dir": str(front.b)})
    front.slurm.alive = {"3"}
    assert _round(front) == ("3", str(front.b), "pending")
    front.slurm.alive = set()  # gone from Slurm without ever running: free
    assert _round(front)[2] == "free" and front.slot.job_id is None


def test_a_slot_is_free_only_when_neither_directory_runs_a_job(front):
    _state(front.a, "2", phase="done", inst="removed")  # no successor recorded
    _state(front.b, "7", phase="starting", inst="starting")
    front.slurm.alive = {"7"}
    assert _round(front) == ("7", str(front.b), "starting")
    assert front.role.decisions == []
    _state(front.b, "7", phase="failed", inst="failed")
    assert _round(front)[2] == "free"


def test_a_drain_lost_to_a_renewal_leaves_the_slot_serving_and_cancel_stops_every_job(front):
    front.scaler._remove(front.role, front.slot, "test")
    assert (front.a / "run" / "control").is_dir() and front.slot.drained == "2"
    _state(front.a, "2", inst="draining",
           renew={"successor_job_id": "3", "twin_dir": str(front.b)})
    _state(front.b, "3")
    assert _round(front) == ("3", str(front.b), "serving")
    assert front.slot.status == "serving"
    assert any("the drain asked of job 2 went with it" in line for line in front.log)
    front.scaler.cancel_slots()  # the job the pair runs now, and the one still draining
    assert front.slurm.cancelled == [["scancel", "2", "3"]]


def test_a_slot_drained_before_its_successor_served_is_free_not_handed_over(front):
    front.scaler._remove(front.role, front.slot, "test")
    st = {"job_id": "2", "phase": "done", "reason": SCALED_IN,
          "instances": {"worker-0": {"status": "removed"}},
          "renew": {"successor_job_id": "3", "twin_dir": str(front.b)}}
    (front.a / "state.json").write_text(json.dumps(st))
    _state(front.b, "3", phase="starting", inst="starting")  # its cancel under way
    front.slurm.alive = {"3"}
    assert _round(front) == ("2", str(front.a), "free")
    assert not any("renewed" in line for line in front.log), front.log


def test_no_remove_on_a_round_where_a_serving_instance_of_the_pair_did_not_answer(front):
    front.role.spec.cool_down_s = 0.0
    status = front.scaler._slot_status(front.slot)
    front.scaler._decide(front.role, [0.0, None], {front.slot.name: ("2", *status)})
    assert front.role.decisions == [] and front.slot.status == "serving"
    front.scaler._decide(front.role, [0.0, 0.0], {front.slot.name: ("2", *status)})
    assert [d["action"] for d in front.role.decisions] == ["remove"]
    assert (front.a / "run" / "control").is_dir()  # the drain went to the job's directory


def test_no_remove_while_a_slot_hands_over_nor_within_the_cool_down_after(front):
    _state(front.a, "2", inst="draining",
           renew={"successor_job_id": "3", "twin_dir": str(front.b)})
    _state(front.b, "3")
    front.role.spec.cool_down_s = 0.0
    status = front.scaler._slot_status(front.slot)
    # the round that sees the successor serve: the old job's requests are gone, the new one's
    # not come yet: a low reading, but no remove
    front.scaler._decide(front.role, [1.0, 0.0], {front.slot.name: ("2", *status)})
    assert front.slot.job_id == "3" and front.role.decisions == []
    _state(front.a, "2", phase="done", inst="removed")  # the old job ended: the hold ends
    front.scaler._decide(front.role, [1.0, 0.0], {front.slot.name: ("3", "3", str(front.b),
                                                                   "serving")})
    assert [d["action"] for d in front.role.decisions] == ["remove"], front.role.decisions
    front.role.decisions, front.role.last_at = [], 0.0
    front.role.spec.cool_down_s, front.slot.status = 60.0, "serving"
    front.role.renewed_at = am.now()  # within the cool-down of a renewal: held too
    front.role.last_at = -1e12
    front.scaler._decide(front.role, [1.0, 0.0], {front.slot.name: ("3", "3", str(front.b),
                                                                   "serving")})
    assert front.role.decisions == []


@pytest.mark.parametrize("slurm_says", ["gone", "ended"])
def test_a_slot_job_killed_without_a_word_is_freed_once_slurm_says_it_ended(front, monkeypatch,
                                                                             slurm_says):
    """A slot job killed with its node or by SIGKILL leaves its state.json at "serving": Slurm
    decides. squeue -j lists an ended job for a while (MinJobAge) with its end state."""
    monkeypatch.setattr(am, "ALIVE_S", 0.0)
    front.slurm.alive = {"2"}
    assert _round(front) == ("2", str(front.a), "serving")  # Slurm: RUNNING
    if slurm_says == "ended":
        monkeypatch.setattr(front.slurm, "run", lambda argv, **_: "NODE_FAIL\n")
    else:
        front.slurm.alive = set()
    assert _round(front) == ("2", str(front.a), "free")
    assert front.slot.status == "free" and front.slot.job_id is None
    assert "autoscale worker: worker-s1 (job 2) ended" in front.log
