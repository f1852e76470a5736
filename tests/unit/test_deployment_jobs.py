"""The jobs of one deployment (deployment_jobs.py), as every operator command sees them: the
front, its instance jobs from the index, its slot jobs from the front's state.json, and the
successors of renewing ones from the pairs' own files, each with its kind; `list` and `status`
showing them all under the front, a slot and a successor marked; `cancel` stopping them all and
`scale --remove` draining instance jobs only. Slurm is test_scale's strict stand-in; the job
directories are real files."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcserve.operate import deployment_jobs, deployments
from hpcserve.cli import main
from hpcserve.slurm.runner import LocalRunner
from test_scale import NOW, front, one_error, state  # noqa: F401 - fixture


def _serving(job_id: str, *names: str) -> str:
    s = state("serving", {n: "serving" for n in names})
    return json.dumps({**s, "job_id": job_id})


@pytest.fixture
def deployment(front):  # noqa: F811 - test_scale's fixture, extended
    """Front 42 with instance job 43, renewing instance job 77 (in decode-2/) whose successor
    78 runs in its twin decode-2b/ (no index holds 78), slot job 9 (decode-s1, in the front's
    state.json only) and a free slot decode-s2 that ran job 8; an instance job of another
    front beside them."""
    e, cluster, jd = front
    scale = jd / "scale"
    for name, jid in (("decode-1", "43"), ("decode-2b", "78"), ("decode-s1", "9")):
        (scale / name).mkdir(parents=True)
        (scale / name / "state.json").write_text(_serving(jid, "decode-0"))
    a, b = scale / "decode-2", scale / "decode-2b"
    a.mkdir()
    for d, twin in ((a, b), (b, a)):
        (d / "plan.json").write_text(json.dumps({"renew": {"twin_dir": str(twin),
                                                           "margin_s": 40}}))
    (a / "state.json").write_text(json.dumps({"job_id": "77", "phase": "done", "renew": {
        "twin_dir": str(b), "successor_job_id": "78"}}))
    st = json.loads((jd / "state.json").read_text())
    st["autoscale"] = {"decode": {"slots": {
        "decode-s1": {"dir": str(scale / "decode-s1"), "job_id": "9", "status": "serving"},
        "decode-s2": {"dir": str(scale / "decode-s2"), "job_id": "8", "status": "free"}}}}
    (jd / "state.json").write_text(json.dumps(st))
    for jid, name, d, at in (("43", "demo-kimi-k2-decode-1", scale / "decode-1", 1),
                             ("77", "demo-kimi-k2-decode-2", a, 2)):
        deployments.record(deployments.Entry(jid, name, str(d), None, NOW + at, None,
                                             front=str(jd)))
    deployments.record(deployments.Entry("50", "other-decode-1", "/jobs/other/scale/decode-1",
                                         None, NOW + 3, None, front="/jobs/other"))
    cluster.jobs.update({"43": ("demo-kimi-k2-decode-1", "RUNNING"),
                         "78": ("demo-kimi-k2-decode-2", "RUNNING"),
                         "9": ("demo-kimi-k2-decode-s1", "RUNNING")})
    return e, cluster, jd


def test_a_front_s_jobs_are_its_instance_jobs_slots_and_successors_each_with_its_kind(
        deployment):
    e, cluster, jd = deployment
    got = deployment_jobs.jobs_of(e, LocalRunner())
    scale = jd / "scale"
    assert [(j.entry.job_id, j.kind, j.successor_of, j.entry.job_dir) for j in got.jobs] == [
        ("42", "front", None, str(jd)),
        ("43", "instance", None, str(scale / "decode-1")),
        ("77", "instance", None, str(scale / "decode-2")),     # the index's, ended
        ("78", "instance", "77", str(scale / "decode-2b")),    # its pair's successor
        ("9", "slot", None, str(scale / "decode-s1"))]         # a free slot runs no job
    assert [j.entry.job_id for j in got.successors] == ["78"]
    assert {j.entry.front for j in got.members} == {str(jd)}
    # an instance job named alone: the jobs its pair runs now
    (idx77,) = [x for x in deployments.entries() if x.job_id == "77"]
    assert [(j.entry.job_id, j.successor_of) for j in
            deployment_jobs.pair_now(idx77, LocalRunner())] == [("77", None), ("78", "77")]


def test_list_shows_the_slot_and_the_successor_under_their_front_marked(deployment):
    e, cluster, jd = deployment
    r = CliRunner().invoke(main, ["list"])
    assert r.exit_code == 0, r.output
    rows = r.output.splitlines()[1:]
    # 77 ended (renewed) and 50 is not in Slurm's queue: neither runs
    assert [ln.split()[0] for ln in rows] == ["42", "43", "78", "9"], r.output
    assert [ln.startswith("  ") for ln in rows] == [False, True, True, True], r.output
    assert "demo-kimi-k2-decode-1  " in rows[1] and "(" not in rows[1].split("RUNNING")[0]
    assert "demo-kimi-k2-decode-2 (successor of 77)" in rows[2], r.output
    assert "demo-kimi-k2-decode-s1 (slot)" in rows[3], r.output
    # --json: each job's kind
    got = [(v["job_id"], v["kind"], v["successor_of"])
           for v in json.loads(CliRunner().invoke(main, ["list", "--all", "--json"]).output)]
    assert got == [("42", "front", None), ("43", "instance", None), ("77", "instance", None),
                   ("78", "instance", "77"), ("9", "slot", None), ("50", "instance", None)]


def test_status_of_the_front_shows_all_of_its_jobs_and_no_other_deployment_s(deployment):
    e, cluster, jd = deployment
    r = CliRunner().invoke(main, ["status", "42"])
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.output.splitlines() if ln and not ln.startswith("    ")][1:]
    ids = [ln.split()[0] for ln in rows if ln.split()[0].isdigit()]
    assert ids == ["42", "43", "77", "78", "9"], r.output
    assert any("demo-kimi-k2-decode-s1 (slot)" in ln for ln in rows), r.output


def test_cancel_of_the_front_stops_its_instance_jobs_successor_and_slot(deployment):
    e, cluster, jd = deployment
    assert CliRunner().invoke(main, ["cancel", "42"]).exit_code == 0
    assert cluster.called("scancel") == [["scancel", "--batch", "--signal=USR1", j]
                                         for j in ("42", "43", "78", "9")]


def test_remove_drains_instance_jobs_never_a_slot(deployment):
    e, cluster, jd = deployment
    # front's decode-0, 43's and 78's: 3 serve outside the slot, whose decode-0 is autoscale's
    said = one_error(CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--remove",
                                               "4"]))
    assert said == "--remove 4: only 3 decode instance(s) of demo-kimi-k2 serve"
