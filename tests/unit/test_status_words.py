"""What `hpcserve status` says for each combination of Slurm's view and the job's state.json."""

from __future__ import annotations

import pytest

from hpcserve.operate import ops
from hpcserve.runtime.logs import last_error


def _view(slurm: str | None, phase: str | None, **state) -> ops.View:
    v = ops.View("42", "dep", "/jobs/dep", None, slurm_state=slurm, phase=phase,
                 endpoint=state.get("endpoint"), failure=state.get("failure"),
                 state={"phase": phase, **state})
    return v


@pytest.mark.parametrize("slurm,phase,want", [
    ("PENDING", None, "pending"),
    ("RUNNING", "serving", "serving at http://n1:8000"),
    # the job wrote `serving` and then vanished (killed hard, node gone, past MinJobAge): the
    # endpoint it wrote is dead and must not be offered
    (None, "serving", "ended (Slurm no longer lists the job)"),
    (None, None, "ended (Slurm no longer lists the job)"),
    ("NODE_FAIL", "serving", "ended (NODE_FAIL)"),
    (None, "cancelled", "cancelled"),
])
def test_status_words(slurm, phase, want):
    assert ops.describe(_view(slurm, phase, endpoint="http://n1:8000")) == want


@pytest.mark.parametrize("slurm,phase,ended", [
    (None, "serving", ops.GONE), (None, None, ops.GONE), ("NODE_FAIL", "serving", "NODE_FAIL"),
    ("TIMEOUT", None, "TIMEOUT"), ("NODE_FAIL", "failed", None), (None, "done", None),
    ("RUNNING", "serving", None), ("PENDING", "requeued", None), ("REQUEUED", "requeued", None),
    # held after a requeue, or stopped (scontrol requeuehold, SIGSTOP): not over, and not
    # called so (squeue(1), JOB STATE CODES)
    ("REQUEUE_HOLD", "requeued", None), ("STOPPED", "serving", None),
])
def test_how_a_job_ended_without_a_final_phase_is_a_field_of_its_own(slurm, phase, ended):
    # `hpcserve status` exits 1 and `hpcserve list` hides the job on this field, not on the
    # words it shows
    v = _view(slurm, phase)
    assert v.ended == ended
    assert (ops.describe(v) == f"ended ({ended})") == (ended is not None)


def test_a_failed_job_names_its_log_and_shows_the_last_lines():
    f = {"role": "decode", "instance": 0, "node": "n3", "node_rank": 1, "exit_code": 7,
         "log": "logs/decode-0.node1.n3.log", "log_tail": [f"line {i}" for i in range(30)]}
    v = _view(None, "failed", reason="step decode-0 exited with code 7", failure=f,
              endpoint="http://n1:8000")
    assert ops.describe(v) == ("failed: step decode-0 exited with code 7 "
                               "[decode 0 node n3 rank 1, exit code 7]")
    lines = ops.failure_detail(v).splitlines()
    assert lines[0] == "job 42: last lines of /jobs/dep/logs/decode-0.node1.n3.log:"
    assert lines[1:] == [f"  line {i}" for i in range(20, 30)]
    assert ops.failure_detail(_view("RUNNING", "serving")) == ""


def test_a_failed_job_says_its_last_error_line_first():
    f = {"role": "worker", "instance": 0, "node": "n2", "node_rank": 1, "exit_code": 0,
         "log": "logs/worker-0.node1.n2.log", "log_tail": ["a", "b"],
         "error": "ERROR Worker proc VllmWorker-1 died unexpectedly"}
    v = _view(None, "failed", reason="step worker-0 exited with code 137", failure=f)
    lines = ops.failure_detail(v).splitlines()
    assert lines[0] == ("job 42: last error in /jobs/dep/logs/worker-0.node1.n2.log: "
                        "ERROR Worker proc VllmWorker-1 died unexpectedly")
    assert lines[1:] == ["job 42: last lines of /jobs/dep/logs/worker-0.node1.n2.log:",
                         "  a", "  b"]


def test_the_last_error_line_is_not_a_stack_frame():
    lines = ["INFO up", "!!!!!!! Segfault encountered !!!!!!!",
             '  File "csrc/cpu/cpu_fused_moe.cpp", line 242, in fused_moe_impl', "",
             "(MainProcess) ERROR [multiproc_executor.py:315] Worker proc died", "INFO bye"]
    assert last_error(lines) == "(MainProcess) ERROR [multiproc_executor.py:315] Worker proc died"
    assert last_error(lines[:3]) == "!!!!!!! Segfault encountered !!!!!!!"
    assert last_error(["INFO all fine"]) is None


def test_one_list_of_slurms_active_states():
    """ops reads the parsers' list: every state the parsers take for active, and only those."""
    from hpcserve.runtime import slurm_jobs
    assert ops.ACTIVE_SLURM is slurm_jobs.ACTIVE_STATES
    assert not slurm_jobs.ACTIVE_STATES & slurm_jobs.TERMINAL_STATES
