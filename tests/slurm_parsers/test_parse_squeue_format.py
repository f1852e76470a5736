"""parse_squeue_format on real 22.05 `squeue -h -t all -o SQUEUE_FORMAT` output, and on damage."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcserve.runtime.slurm_queue import (SACCT_FORMAT, SQUEUE_FORMAT, STEPS_FORMAT,
                                          parse_squeue_format, squeue_argv)
from slurm_samples import DATA, rec, utc_epoch


def by_id(records):
    return {r.job_id: r for r in records}


def test_recording_script_used_the_exported_formats():
    # The recorded samples are only evidence for the parser if they were made with its formats.
    script = (DATA / "record-22.05.sh").read_text()
    assert re.search(r"^SQF='(.*)'$", script, re.M).group(1) == SQUEUE_FORMAT
    assert re.search(r"^STF='(.*)'$", script, re.M).group(1) == STEPS_FORMAT
    assert re.search(r"^SAF='(.*)'$", script, re.M).group(1) == SACCT_FORMAT


def test_squeue_argv_uses_the_format_and_all_states():
    argv = squeue_argv(["3", "10"])
    # --me: this user's jobs only, not the whole cluster's queue
    assert argv[:5] == ["squeue", "--me", "-h", "-t", "all"]
    assert argv[argv.index("-o") + 1] == SQUEUE_FORMAT
    assert argv[-2:] == ["-j", "3,10"]
    assert SQUEUE_FORMAT.endswith("%j"), "the free-text name must be the last field"


def test_live_snapshot_every_job_and_component(utc):
    recs = parse_squeue_format(rec("a_squeue.out"))
    ids = [r.job_id for r in recs]
    assert sorted(ids) == sorted(["1", "2", "3+0", "3+1", "5", "6", "7", "8", "9", "10+0", "10+1",
                                  "12", "13", "14", "15", "16", "17", "18"])
    j = by_id(recs)
    # the running het job: two components, own ids 3 and 4, leader 3
    c0, c1 = j["3+0"], j["3+1"]
    assert (c0.unique_id, c0.het_job_id, c0.het_offset) == (3, 3, 0)
    assert (c1.unique_id, c1.het_job_id, c1.het_offset) == (4, 3, 1)
    assert c1.leader_id == "3" and c1.is_het
    assert (c0.state, c0.nodes, c0.node_count) == ("RUNNING", "node1", 1)
    assert (c1.state, c1.nodes, c1.node_count) == ("RUNNING", "node[2-3]", 2)
    assert c1.reason == ""  # 'None' reads as no reason
    assert (c1.name, c1.partition, c1.user) == ("hs-deploy", "local", "root")
    assert c1.time_limit == 2 * 3600 and c1.time_used == 6 and c1.time_left == 3600 + 59 * 60 + 54
    assert c1.submit_time == utc_epoch("2026-11-22T04:07:35")
    assert c1.start_time == utc_epoch("2026-11-22T04:07:36")
    assert c1.end_time == utc_epoch("2026-11-22T06:07:36")
    # pending jobs and their reasons
    assert (j["7"].state, j["7"].reason) == ("PENDING", "Dependency")
    assert (j["8"].state, j["8"].reason) == ("PENDING", "BeginTime")
    assert j["8"].start_time == utc_epoch("2026-11-22T05:07:37")  # --begin=now+1hour
    assert j["8"].end_time is None  # NONE
    assert (j["9"].reason, j["16"].reason, j["17"].reason) == ("JobHeldUser", "Resources", "Priority")
    assert j["16"].node_count == 4 and j["16"].nodes == ""
    assert j["7"].time_limit is None and j["7"].start_time is None  # UNLIMITED, N/A
    # the pending het job
    assert (j["10+1"].unique_id, j["10+1"].state, j["10+1"].reason) == (11, "PENDING", "Dependency")
    # finished ones
    assert (j["1"].state, j["2"].state, j["2"].reason, j["6"].state) == (
        "COMPLETED", "FAILED", "NonZeroExitCode", "CANCELLED")
    assert j["1"].time_limit == 365 * 86400  # how 22.05 shows INFINITE once a job ran
    assert all(r.source == "squeue" for r in recs)


def test_name_with_spaces_and_a_pipe_survives():
    j = by_id(parse_squeue_format(rec("a_squeue.out")))
    assert j["12"].name == "name with spaces|pipe"
    assert j["12"].time_limit == 86400 and j["12"].state == "RUNNING"


def test_reason_text_after_a_node_was_drained():
    j = by_id(parse_squeue_format(rec("r_squeue.out")))
    assert j["19"].reason == "ReqNodeNotAvail, UnavailableNodes:node4"
    assert j["16"].reason.startswith("Nodes required for job are DOWN, DRAINED")


def test_mixed_het_job_and_never_satisfied_dependency():
    j = by_id(parse_squeue_format(rec("b_squeue.out")))
    assert (j["10+0"].state, j["10+1"].state) == ("RUNNING", "CANCELLED")
    assert (j["3+0"].state, j["3+1"].state) == ("CANCELLED", "CANCELLED")
    assert j["7"].reason == "DependencyNeverSatisfied"


def test_cancelled_while_pending_keeps_a_reason_but_no_pending_reason():
    j = by_id(parse_squeue_format(rec("c_squeue.out")))
    assert (j["17"].state, j["17"].reason) == ("CANCELLED", "Priority")
    assert j["17"].pending_reason == ""
    assert j["7"].pending_reason == "DependencyNeverSatisfied"
    assert (j["20+0"].state, j["20+1"].state, j["20+1"].unique_id) == ("COMPLETED", "COMPLETED", 21)


def test_empty_output_and_unknown_job():
    assert parse_squeue_format("") == []
    assert parse_squeue_format("\n\n") == []
    assert rec("a_squeue_unknown.out") == ""  # the error went to stderr
    assert parse_squeue_format(rec("a_squeue_unknown.out")) == []


def test_truncated_output_keeps_whole_lines_only():
    text = rec("a_squeue.out")
    lines = text.splitlines()
    cut = text[: text.index(lines[-1]) + 20]  # last line cut inside its 3rd/4th field
    recs = parse_squeue_format(cut)
    assert len(recs) == len(lines) - 1
    assert [r.job_id for r in recs] == [ln.split("|")[0] for ln in lines[:-1]]


def test_header_crlf_and_garbage_lines_are_skipped():
    body = rec("a_squeue.out").splitlines()[:2]
    header = "JOBID|JOBID|STATE|REASON|NODELIST|NODES|PARTITION|USER|TIME|TIME_LIMIT|TIME_LEFT|" \
             "SUBMIT_TIME|START_TIME|END_TIME|NAME"
    text = "\r\n".join([header, body[0], "squeue: error: something", body[1]]) + "\r\n"
    recs = parse_squeue_format(text)
    assert [r.job_id for r in recs] == ["6", "1"]
    assert recs[0].name == "cancel-me" and recs[1].name == "done-job"  # no stray '\r'


def test_other_formats_with_R_and_compact_state():
    # the %R column: '(Reason)' for pending jobs, nodes otherwise; %t compact states
    text = "3+1|R|node[2-3]\n7|PD|(Dependency)\n19|PD|(ReqNodeNotAvail, UnavailableNodes:node4)\n"
    recs = by_id(parse_squeue_format(text, fmt="%i|%t|%R"))
    assert (recs["3+1"].state, recs["3+1"].nodes, recs["3+1"].reason) == ("RUNNING", "node[2-3]", "")
    assert (recs["7"].state, recs["7"].reason, recs["7"].nodes) == ("PENDING", "Dependency", "")
    assert recs["19"].reason == "ReqNodeNotAvail, UnavailableNodes:node4"
    assert recs["3+1"].unique_id is None  # no %A, and '3+1' is not a job's own id


def test_widths_in_format_and_unknown_codes_are_tolerated():
    recs = parse_squeue_format("5|x|RUNNING\n", fmt="%.18i|%Q|%T")
    assert len(recs) == 1 and recs[0].job_id == "5" and recs[0].state == "RUNNING"
    assert recs[0].unique_id == 5


def test_array_task_ids():
    recs = parse_squeue_format("4050_3|4053|RUNNING\n4050_[4-9]|4050|PENDING\n", fmt="%i|%A|%T")
    assert [r.job_id for r in recs] == ["4050_3", "4050_[4-9]"]
    assert recs[0].unique_id == 4053 and not recs[0].is_het and recs[0].leader_id == "4050_3"


PARSERS = ("slurm_jobs", "slurm_values", "slurm_queue", "slurm_scontrol", "slurm_cluster",
           "slurm_reasons", "slurm_controller")


@pytest.mark.parametrize("module", PARSERS)
def test_module_imports_only_the_standard_library(module):
    # it ships in the job directory with the runtime: nothing of hpcserve may be imported, only
    # the standard library and the other parser modules beside it
    src = Path(__file__).resolve().parents[2] / "hpcserve" / "runtime" / f"{module}.py"
    imports = re.findall(r"^(?:from|import) ([\w.]+)", src.read_text(), re.M)
    allowed = {"__future__", "re", "time", "dataclasses", "typing"} | {f".{m}" for m in PARSERS}
    assert set(imports) <= allowed, imports
