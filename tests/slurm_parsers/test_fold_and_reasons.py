"""fold_het's overall state rules, reason_in_words, and the duration/time helpers."""

from __future__ import annotations

import pytest

from hpcserve.runtime.slurm_jobs import ACTIVE_STATES, TERMINAL_STATES, JobRecord, fold_het
from hpcserve.runtime.slurm_queue import parse_squeue_format
from hpcserve.runtime.slurm_reasons import REASON_WORDS, reason_in_words
from hpcserve.runtime.slurm_values import parse_duration, parse_timestamp
from slurm_samples import rec


def comp(leader: int, off: int, state: str, reason: str = "", nodes: str = "") -> JobRecord:
    return JobRecord(job_id=f"{leader}+{off}", unique_id=leader + off, het_job_id=leader,
                     het_offset=off, name="dep", state=state, reason=reason, nodes=nodes)


def fold1(*comps: JobRecord):
    (f,) = fold_het(comps)
    return f


# ------------------------------------------------------------------ fold_het


def test_recorded_live_snapshot_folds_per_leader():
    folded = fold_het(parse_squeue_format(rec("a_squeue.out")))
    assert [f.job_id for f in folded] == ["1", "2", "3", "5", "6", "7", "8", "9", "10", "12", "13",
                                          "14", "15", "16", "17", "18"]  # by id, components merged
    f = {x.job_id: x for x in folded}
    het = f["3"]
    assert het.is_het and [c.job_id for c in het.components] == ["3+0", "3+1"]
    assert (het.state, het.states, het.nodes) == ("RUNNING", ("RUNNING", "RUNNING"),
                                                  ("node1", "node[2-3]"))
    assert (het.name, het.unique_ids, het.node_count, het.mixed) == ("hs-deploy", (3, 4), 3, False)
    waiting = f["10"]
    assert (waiting.state, waiting.reason, waiting.pending_reason) == ("PENDING", "Dependency",
                                                                       "Dependency")
    assert not f["5"].is_het and f["5"].states == ("RUNNING",)


def test_recorded_partial_cancel_is_mixed_and_still_active():
    f = {x.job_id: x for x in fold_het(parse_squeue_format(rec("b_squeue.out")))}["10"]
    assert f.states == ("RUNNING", "CANCELLED")
    assert f.state == "CANCELLED" and f.mixed and f.active and not f.finished


def test_all_running_is_running():
    assert fold1(comp(9, 0, "RUNNING"), comp(9, 1, "RUNNING")).state == "RUNNING"


def test_any_pending_is_pending_with_its_reason():
    f = fold1(comp(9, 0, "RUNNING"), comp(9, 1, "PENDING", "Resources"))
    assert (f.state, f.reason, f.pending_reason) == ("PENDING", "Resources", "Resources")


def test_pending_wins_over_a_finished_component():
    f = fold1(comp(9, 0, "PENDING", "Priority"), comp(9, 1, "CANCELLED"))
    assert (f.state, f.reason, f.mixed, f.active) == ("PENDING", "Priority", True, True)


def test_worst_terminal_state_wins():
    f = fold1(comp(9, 0, "COMPLETED"), comp(9, 1, "FAILED", "NonZeroExitCode"),
              comp(9, 2, "CANCELLED"))
    assert (f.state, f.reason, f.finished, f.active) == ("FAILED", "NonZeroExitCode", True, False)
    assert fold1(comp(9, 0, "TIMEOUT"), comp(9, 1, "NODE_FAIL")).state == "NODE_FAIL"
    assert fold1(comp(9, 0, "CANCELLED"), comp(9, 1, "COMPLETED")).state == "CANCELLED"
    assert fold1(comp(9, 0, "OUT_OF_MEMORY"), comp(9, 1, "FAILED")).state == "OUT_OF_MEMORY"


def test_active_mixes_show_the_state_furthest_from_running():
    assert fold1(comp(9, 0, "RUNNING"), comp(9, 1, "CONFIGURING")).state == "CONFIGURING"
    assert fold1(comp(9, 0, "COMPLETING"), comp(9, 1, "RUNNING")).state == "COMPLETING"
    assert fold1(comp(9, 0, "RUNNING"), comp(9, 1, "SUSPENDED")).state == "SUSPENDED"
    assert fold1(comp(9, 0, "RUNNING"), comp(9, 1, "SOMETHING_NEW")).state == "SOMETHING_NEW"


def test_components_are_ordered_by_offset_and_deduplicated():
    a = comp(9, 1, "RUNNING", nodes="n[2-3]")
    b = comp(9, 0, "RUNNING", nodes="n1")
    later = comp(9, 0, "COMPLETED", nodes="other")
    f = fold1(a, b, later)
    assert [c.het_offset for c in f.components] == [0, 1]
    assert f.nodes == ("n1", "n[2-3]")  # the first record of a component wins


def test_plain_and_array_jobs_stay_apart_and_sort_by_id():
    recs = [JobRecord(job_id="100", state="RUNNING"), JobRecord(job_id="20_1", state="PENDING"),
            JobRecord(job_id="20_2", state="RUNNING"), comp(7, 0, "PENDING")]
    assert [f.job_id for f in fold_het(recs)] == ["7", "20_1", "20_2", "100"]
    assert fold_het([]) == []


def test_node_count_unknown_when_a_component_lacks_it():
    f = fold1(JobRecord(job_id="9+0", het_job_id=9, het_offset=0, node_count=1, state="RUNNING"),
              JobRecord(job_id="9+1", het_job_id=9, het_offset=1, state="RUNNING"))
    assert f.node_count is None


def test_state_sets_do_not_overlap():
    assert not (TERMINAL_STATES & ACTIVE_STATES)
    assert {"RUNNING", "PENDING", "COMPLETING"} <= ACTIVE_STATES
    assert {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"} <= TERMINAL_STATES


# ------------------------------------------------------------------ reason_in_words


@pytest.mark.parametrize("reason,needle", [
    ("Priority", "higher-priority"),
    ("Resources", "nodes to become free"),
    ("Dependency", "depends on"),
    ("DependencyNeverSatisfied", "never start"),
    ("BeginTime", "start time"),
    ("JobHeldUser", "scontrol release"),
    ("JobHeldAdmin", "administrator"),
    ("ReqNodeNotAvail", "unavailable"),
    ("PartitionNodeLimit", "more nodes than the partition allows"),
    ("PartitionTimeLimit", "longer time limit"),
    ("QOSMaxNodePerUserLimit", "QOS"),
    ("AssocGrpGRES", "account"),
    ("NonZeroExitCode", "non-zero exit code"),
])
def test_common_reasons_in_words(reason, needle):
    words = reason_in_words(reason)
    assert needle in words
    assert reason not in words or " " in reason  # words, not the code echoed back


def test_no_reason_is_empty():
    for r in ("None", "", None, "(null)", "(None)"):
        assert reason_in_words(r) == ""


def test_limits_name_the_limit():
    assert reason_in_words("QOSMaxNodePerUserLimit") == \
        "held back by its QOS: limit on max node per user reached"
    assert reason_in_words("AssocGrpGRES") == \
        "held back by its account (association): limit on group GRES reached"
    assert "CPU run minutes" in reason_in_words("QOSGrpCPURunMinutesLimit")
    assert reason_in_words("MaxGRESPerAccount") == "held back by a per-account limit: max GRES reached"


def test_unavailable_nodes_are_named():
    words = reason_in_words("ReqNodeNotAvail, UnavailableNodes:node4")
    assert words.startswith(REASON_WORDS["ReqNodeNotAvail"]) and words.endswith("unavailable: node4")
    assert reason_in_words("(Resources)") == REASON_WORDS["Resources"]  # %R's parentheses
    assert reason_in_words("ReqNodeNotAvail, May be reserved for other job").endswith(
        "(May be reserved for other job)")


def test_recorded_reasons_all_read_as_words():
    for r in parse_squeue_format(rec("r_squeue.out")):
        if r.pending:
            words = reason_in_words(r.reason)
            assert words and not words.startswith("Slurm reason"), r.reason


def test_free_text_and_unknown_reasons():
    text = "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions"
    assert reason_in_words(text) == text
    assert reason_in_words("SomeFutureReason") == "Slurm reason 'SomeFutureReason'"


# ------------------------------------------------------------------ durations and times


@pytest.mark.parametrize("text,seconds", [
    ("0:06", 6), ("1:59:54", 7194), ("02:00:00", 7200), ("365-00:00:00", 365 * 86400),
    ("23:59:55", 86395), ("1-00:00:07", 86407), ("2-03", 2 * 86400 + 3 * 3600),
    ("1-02:03", 86400 + 2 * 3600 + 180), ("30", 1800), ("00:00:01.500", 1),
    ("UNLIMITED", None), ("INFINITE", None), ("NOT_SET", None), ("N/A", None), ("", None),
    (None, None), ("garbage", None), ("1:2:3:4", None),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


def test_parse_timestamp(utc):
    assert parse_timestamp("2026-11-22T04:07:35") == 1795320455
    assert parse_timestamp("1970-01-01T00:01") == 60
    for t in ("N/A", "NONE", "Unknown", "None", "", None, "(null)", "yesterday"):
        assert parse_timestamp(t) is None
