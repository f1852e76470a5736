"""parse_scontrol_job / parse_scontrol_fields on real 22.05 `scontrol show job` output."""

from __future__ import annotations

from hpcserve.runtime.slurm_jobs import fold_het
from hpcserve.runtime.slurm_queue import parse_squeue_format
from hpcserve.runtime.slurm_scontrol import parse_scontrol_fields, parse_scontrol_job, scontrol_argv
from slurm_samples import rec, utc_epoch


def by_id(records):
    return {r.job_id: r for r in records}


def test_het_job_one_line_per_component(utc):
    recs = parse_scontrol_job(rec("a_scontrol_het.out"))
    assert [r.job_id for r in recs] == ["3+0", "3+1"]
    c0, c1 = recs
    assert (c0.unique_id, c0.het_job_id, c0.het_offset) == (3, 3, 0)
    assert (c1.unique_id, c1.het_job_id, c1.het_offset) == (4, 3, 1)
    assert (c1.state, c1.reason, c1.nodes, c1.node_count) == ("RUNNING", "", "node[2-3]", 2)
    assert (c1.batch_host, c1.user, c1.partition, c1.exit_code) == ("node2", "root", "local", "0:0")
    assert (c1.time_used, c1.time_limit) == (6, 7200)
    assert c1.start_time == utc_epoch("2026-11-22T04:07:36")
    assert c1.end_time == utc_epoch("2026-11-22T06:07:36")
    assert c1.work_dir.endswith("/work") and c1.stdout.endswith("/het.out")
    assert c1.dependency == ""  # (null)
    assert all(r.source == "scontrol" for r in recs)


def test_multiline_form_reads_like_one_line_form():
    one = parse_scontrol_job(rec("a_scontrol_het.out"))
    multi = parse_scontrol_job(rec("a_scontrol_het_multiline.out"))
    assert multi == one
    assert rec("a_scontrol_het_multiline.out").count("\n") > 40  # really the multi-line form


def test_all_jobs_live(utc):
    j = by_id(parse_scontrol_job(rec("a_scontrol.out")))
    assert len(j) == 18
    assert j["12"].name == "name with spaces|pipe"  # free text, unquoted
    assert j["1"].name == "done-job" and j["1"].stdout.endswith("/done.out")
    assert (j["2"].state, j["2"].exit_code, j["2"].reason) == ("FAILED", "3:0", "NonZeroExitCode")
    assert (j["6"].state, j["6"].exit_code) == ("CANCELLED", "0:15")
    assert (j["7"].state, j["7"].reason, j["7"].dependency) == (
        "PENDING", "Dependency", "afterok:3(unfulfilled)")
    assert j["7"].start_time is None and j["7"].time_limit is None  # Unknown, UNLIMITED
    assert (j["16"].reason, j["16"].node_count, j["16"].nodes) == ("Resources", 4, "")
    assert j["10+1"].unique_id == 11 and j["10+1"].node_count == 2


def test_reason_underscores_become_spaces():
    (r,) = parse_scontrol_job(rec("r_scontrol_reqnode.out"))
    assert "Reason=ReqNodeNotAvail,_UnavailableNodes:node4" in rec("r_scontrol_reqnode.out")
    assert (r.job_id, r.state, r.reason) == ("19", "PENDING", "ReqNodeNotAvail, UnavailableNodes:node4")
    (d,) = parse_scontrol_job(rec("r_scontrol_drained.out"))
    assert d.reason == ("Nodes required for job are DOWN, DRAINED or reserved for jobs in higher "
                        "priority partitions")
    assert d.node_count == 4  # NumNodes=4-4


def test_fields_keep_values_with_equals_signs_and_raw_markers():
    f = parse_scontrol_fields(rec("a_scontrol_het.out"))[1]
    assert f["JobId"] == "4" and f["HetJobIdSet"] == "3-4"
    assert f["TRES"] == "cpu=2,node=2,billing=2"
    assert f["AllocNode:Sid"].startswith("vm:") and f["ReqB:S:C:T"] == "0:0:*:*"
    assert f["Account"] == "(null)" and f["Power"] == "" and f["UserId"] == "root(0)"


def test_scontrol_agrees_with_squeue_on_folded_states():
    sc = {f.job_id: f for f in fold_het(parse_scontrol_job(rec("b_scontrol.out")))}
    sq = {f.job_id: f for f in fold_het(parse_squeue_format(rec("b_squeue.out")))}
    assert set(sc) == set(sq)
    for jid, f in sq.items():
        assert sc[jid].states == f.states and sc[jid].nodes == f.nodes, jid
    assert sc["10"].state == "CANCELLED" and sc["10"].mixed and sc["10"].active


def test_completed_het_job():
    f = {x.job_id: x for x in fold_het(parse_scontrol_job(rec("c_scontrol.out")))}["20"]
    assert (f.state, f.states, f.nodes) == ("COMPLETED", ("COMPLETED", "COMPLETED"),
                                             ("node2", "node[3-4]"))
    assert f.finished and not f.active


def test_free_text_values_with_spaces_and_equals():
    line = rec("a_scontrol.out").splitlines()[0]
    assert line.startswith("JobId=1 JobName=done-job ")
    line = line.replace("JobName=done-job", "JobName=my job a=b  two spaces")
    line = line.replace("Command=(null)", "Command=/bin/run --flag=1 two words")
    (r,) = parse_scontrol_job(line)
    assert r.name == "my job a=b  two spaces"
    f = parse_scontrol_fields(line)[0]
    assert f["Command"] == "/bin/run --flag=1 two words"
    assert f["UserId"] == "root(0)" and r.user == "root"
    assert f["WorkDir"].endswith("/work")


def test_unknown_keys_from_newer_releases_are_kept():
    line = rec("a_scontrol.out").splitlines()[0].rstrip() + " FutureKey=some value Other=1"
    f = parse_scontrol_fields(line)[0]
    assert f["FutureKey"] == "some value" and f["Other"] == "1"
    (r,) = parse_scontrol_job(line)
    assert r.job_id == "1" and r.state == "COMPLETED"


def test_empty_unknown_and_truncated():
    assert parse_scontrol_job("") == []
    assert rec("a_scontrol_unknown.out") == ""
    assert parse_scontrol_job(rec("a_scontrol_unknown.err")) == []  # even if stderr is fed in
    assert parse_scontrol_job("No jobs in the system\n") == []
    text = rec("a_scontrol_het.out")
    second = text.index("JobId=4 ")
    recs = parse_scontrol_job(text[: second + 60])  # second record cut after a few keys
    assert [r.job_id for r in recs] == ["3+0", "3+1"]
    assert recs[0].nodes == "node1" and recs[1].nodes == "" and recs[1].state == ""
    assert parse_scontrol_job("JobId=abc JobState=RUNNING") == []


def test_scontrol_argv():
    assert scontrol_argv("3") == ["scontrol", "show", "job", "-o", "3"]
