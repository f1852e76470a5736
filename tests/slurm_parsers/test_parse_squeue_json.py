"""parse_squeue_json: real 22.05 output, hand-written 23.02/23.11/24.11 output, and damage."""

from __future__ import annotations

import json

import pytest

from hpcserve.slurm.parsers import (SlurmParseError, fold_het, parse_squeue_format,
                                    parse_squeue_json)
from slurm_samples import rec, sample, utc_epoch

GENERATIONS = ["23.02/squeue_v0.0.39.json", "23.11/squeue_v0.0.40.json",
               "24.11/squeue_v0.0.42.json"]


def by_id(records):
    return {r.job_id: r for r in records}


# ------------------------------------------------------------------ real 22.05 (openapi v0.0.38)

def test_recorded_22_05_live_snapshot():
    recs = parse_squeue_json(rec("a_squeue_json.json"))
    j = by_id(recs)
    assert len(recs) == 18
    c0, c1 = j["3+0"], j["3+1"]
    assert (c0.unique_id, c0.het_job_id, c0.het_offset, c0.nodes) == (3, 3, 0, "node1")
    assert (c1.unique_id, c1.het_job_id, c1.het_offset, c1.nodes) == (4, 3, 1, "node[2-3]")
    assert (c1.state, c1.state_flags, c1.node_count, c1.time_limit) == ("RUNNING", (), 2, 7200)
    assert (c1.name, c1.user, c1.partition, c1.batch_host) == ("hs-deploy", "root", "local", "node2")
    assert c1.submit_time == utc_epoch("2026-11-22T04:07:35")
    assert c1.start_time == utc_epoch("2026-11-22T04:07:36")
    assert c1.end_time == utc_epoch("2026-11-22T06:07:36")
    assert c1.stdout.endswith("/het.out")
    # non-het jobs: het_job_id 0 in the JSON means "not a het job"
    assert (j["5"].het_job_id, j["5"].het_offset, j["5"].is_het) == (None, None, False)
    # pending
    assert (j["7"].state, j["7"].reason, j["7"].dependency) == (
        "PENDING", "Dependency", "afterok:3(unfulfilled)")
    assert j["7"].time_limit is None and j["7"].start_time is None  # null and 0
    assert (j["16"].reason, j["17"].reason, j["9"].reason) == ("Resources", "Priority", "JobHeldUser")
    assert (j["10+0"].state, j["10+1"].unique_id) == ("PENDING", 11)
    # finished: exit codes come as raw wait statuses (768 = exit 3, 15 = SIGTERM)
    assert (j["2"].state, j["2"].exit_code, j["2"].reason) == ("FAILED", "3:0", "NonZeroExitCode")
    assert (j["6"].state, j["6"].exit_code) == ("CANCELLED", "0:15")
    assert (j["1"].state, j["1"].exit_code, j["1"].time_used) == ("COMPLETED", "0:0", 0)
    assert j["12"].name == "name with spaces|pipe"
    assert all(r.source == "squeue-json" for r in recs)


def test_recorded_22_05_reason_code_and_description_are_kept_apart():
    j = by_id(parse_squeue_json(rec("b_squeue_json.json")))
    assert j["19"].reason == "ReqNodeNotAvail"
    assert j["19"].reason_detail == "ReqNodeNotAvail, UnavailableNodes:node4"
    assert j["16"].reason == "Resources"
    assert j["16"].reason_detail.startswith("Nodes required for job are DOWN")
    assert j["7"].reason == "DependencyNeverSatisfied"
    assert (j["10+0"].state, j["10+1"].state) == ("RUNNING", "CANCELLED")
    assert j["10+0"].time_limit is None  # a running het job without -t: INFINITE -> null


@pytest.mark.parametrize("snap", ["a", "b", "c"])
def test_recorded_22_05_json_agrees_with_squeue_text(snap, utc):
    """Same cluster, same second: JSON and `-o` text must give the same jobs, states, nodes."""
    js = by_id(parse_squeue_json(rec(f"{snap}_squeue_json.json")))
    tx = by_id(parse_squeue_format(rec(f"{snap}_squeue.out")))
    assert set(js) == set(tx)
    for jid, t in tx.items():
        r = js[jid]
        assert (r.unique_id, r.het_job_id, r.het_offset) == (t.unique_id, t.het_job_id, t.het_offset)
        assert (r.state, r.nodes, r.node_count, r.name) == (t.state, t.nodes, t.node_count, t.name)
        assert r.submit_time == t.submit_time, jid
        if t.state != "PENDING":
            assert r.start_time == t.start_time, jid
    assert [f.state for f in fold_het(js.values())] == [f.state for f in fold_het(tx.values())]


# ------------------------------------------------------------------ hand-written 23.02 ... 24.11

@pytest.mark.parametrize("path", GENERATIONS)
def test_generations_read_the_same(path):
    recs = parse_squeue_json(sample(path))
    j = by_id(recs)
    assert len(recs) == 13
    # het job, running
    c0, c1 = j["4001+0"], j["4001+1"]
    assert (c0.unique_id, c0.het_job_id, c0.het_offset, c0.state) == (4001, 4001, 0, "RUNNING")
    assert (c1.unique_id, c1.het_job_id, c1.het_offset, c1.nodes) == (4002, 4001, 1, "gpu-[002-005]")
    assert (c1.node_count, c1.time_limit, c1.user, c1.partition) == (4, 240 * 60, "alice", "gpu")
    assert c1.start_time == 1767261630 and c1.submit_time == 1767261600
    assert c1.exit_code == "0:0"
    # pending: a code, a code plus description, infinite and unset limits
    assert (j["4010+1"].state, j["4010+1"].reason, j["4010+1"].exit_code) == (
        "PENDING", "Resources", "")
    assert j["4010+1"].start_time == 1767261600 + 3600  # expected start
    assert (j["4020"].reason, j["4020"].time_limit) == ("QOSMaxNodePerUserLimit", None)
    assert j["4021"].reason == "ReqNodeNotAvail"
    assert j["4021"].reason_detail == "ReqNodeNotAvail, UnavailableNodes:gpu-[007-008]"
    assert j["4021"].time_limit is None and j["4021"].start_time is None
    # flags decide the shown state (job_state_string order)
    assert j["4030"].state == "COMPLETING"
    assert j["4045"].state == "CONFIGURING"
    # exit codes: code 3, SIGTERM, SIGKILL
    assert (j["4031"].state, j["4031"].exit_code, j["4031"].time_used) == ("FAILED", "3:0", 300)
    assert (j["4032"].state, j["4032"].exit_code) == ("CANCELLED", "0:15")
    assert (j["4040+1"].state, j["4040+1"].exit_code) == ("NODE_FAIL", "0:9")
    # array task: shown as array_job_id_task, own id kept
    assert j["4050_3"].unique_id == 4053 and not j["4050_3"].is_het


def test_generation_differences_are_what_the_schema_says():
    s39, s40, s42 = (json.loads(sample(p)) for p in GENERATIONS)
    job = {d: next(x for x in doc["jobs"] if x["job_id"] == 4030) for d, doc in
           (("39", s39), ("40", s40), ("42", s42))}
    assert job["39"]["job_state"] == "COMPLETING"
    assert job["40"]["job_state"] == job["42"]["job_state"] == ["COMPLETED", "COMPLETING"]
    assert isinstance(job["39"]["start_time"], int)
    assert set(job["40"]["start_time"]) == {"set", "infinite", "number"}
    assert set(job["40"]["exit_code"]) == {"status", "return_code", "signal"}
    assert "priority_by_partition" in job["42"] and "power" not in job["42"]
    assert by_id(parse_squeue_json(sample(GENERATIONS[1])))["4030"].state_flags == (
        "COMPLETED", "COMPLETING")


@pytest.mark.parametrize("path", GENERATIONS)
def test_generations_fold(path):
    folded = {f.job_id: f for f in fold_het(parse_squeue_json(sample(path)))}
    assert folded["4001"].state == "RUNNING" and folded["4001"].nodes == ("gpu-001", "gpu-[002-005]")
    assert folded["4001"].unique_ids == (4001, 4002) and folded["4001"].node_count == 5
    assert folded["4010"].state == "PENDING" and folded["4010"].reason == "Resources"
    broken = folded["4040"]
    assert (broken.state, broken.states, broken.reason) == (
        "NODE_FAIL", ("RUNNING", "NODE_FAIL"), "NodeDown")
    assert broken.mixed and broken.active and not broken.finished


# ------------------------------------------------------------------ robustness

def test_empty_and_blank_output():
    assert parse_squeue_json("") == []
    assert parse_squeue_json("  \n") == []
    assert parse_squeue_json("{}") == []
    assert parse_squeue_json('{"jobs": []}') == []
    assert parse_squeue_json('{"jobs": null, "errors": []}') == []


def test_truncated_json_is_an_error_not_an_empty_queue():
    text = rec("a_squeue_json.json")
    with pytest.raises(SlurmParseError, match="truncated"):
        parse_squeue_json(text[: len(text) // 2])
    with pytest.raises(ValueError):  # SlurmParseError is a ValueError too
        parse_squeue_json("{\"jobs\": [")


def test_a_warning_line_before_the_document_is_skipped():
    recs = parse_squeue_json("squeue: warning: something\n" + rec("a_squeue_json.json"))
    assert len(recs) == 18


def test_unknown_absent_and_odd_fields_never_crash():
    doc = {"jobs": [
        {"job_id": 7},                                       # almost nothing
        "not a job",                                         # skipped
        {"job_id": {"set": True, "infinite": False, "number": 8}, "job_state": ["RUNNING"],
         "future_field": {"nested": [1, 2, {"x": None}]}, "time_limit": "Infinity",
         "het_job_id": {"set": False, "infinite": False, "number": 0}, "nodes": None,
         "state_reason": None, "exit_code": {"status": ["SUCCESS"], "return_code": 0},
         "start_time": {"set": True, "infinite": False, "number": 0}, "node_count": "2"},
        {"job_id": 9, "job_state": {"current": ["PENDING"], "reason": "Priority"},
         "time_limit": 30, "user_id": 1000, "state_reason": "Priority", "exit_code": True},
        {"job_id": 10, "job_state": ["PENDING", "SOMETHING_NEW"], "het_job_id": 10,
         "het_job_offset": None},
        {"job_id": 11, "job_state": 42, "name": ["x"]},
    ]}
    recs = parse_squeue_json(json.dumps(doc))
    assert [r.job_id for r in recs] == ["7", "8", "9", "10+0", "11"]
    j7, j8, j9, j10, j11 = recs
    assert (j7.state, j7.nodes, j7.time_limit, j7.exit_code) == ("", "", None, "")
    assert (j8.unique_id, j8.state, j8.is_het, j8.time_limit) == (8, "RUNNING", False, None)
    assert (j8.exit_code, j8.start_time, j8.node_count) == ("0:0", None, 2)
    assert (j9.state, j9.time_limit, j9.user, j9.exit_code) == ("PENDING", 1800, "1000", "")
    assert (j10.state, j10.het_job_id, j10.het_offset) == ("PENDING", 10, 0)
    assert (j11.state, j11.name) == ("", "")


def test_a_bare_list_of_jobs_is_accepted():
    recs = parse_squeue_json('[{"job_id": 5, "job_state": "RUNNING", "nodes": "n1"}]')
    assert [(r.job_id, r.state, r.nodes) for r in recs] == [("5", "RUNNING", "n1")]
