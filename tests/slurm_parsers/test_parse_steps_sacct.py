"""parse_steps on real 22.05 `squeue --steps`; parse_sacct/sacct_disabled (22.05 without accounting)."""

from __future__ import annotations

import subprocess

from hpcserve.runtime.slurm_jobs import fold_het
from hpcserve.runtime.slurm_queue import (SACCT_FIELDS, STEPS_FORMAT, parse_sacct,
                                          parse_squeue_format, parse_steps, sacct_argv,
                                          sacct_disabled, steps_argv)
from hpcserve.slurm.runner import Result
from slurm_samples import rec, sample

# ------------------------------------------------------------------ steps


def test_steps_of_all_jobs():
    steps = parse_steps(rec("a_steps.out"))
    ids = [s.step_id for s in steps]
    assert ids == ["3.0", "3.batch", "4.1", "5.0", "5.1", "5.batch", "12.batch", "13.batch",
                   "14.batch", "15.batch"]
    s = {x.step_id: x for x in steps}
    assert (s["3.0"].job_id, s["3.0"].step, s["3.0"].name, s["3.0"].nodes) == ("3", "0", "router",
                                                                               "node1")
    assert (s["3.batch"].step, s["3.batch"].name) == ("batch", "batch")
    assert (s["5.1"].name, s["5.0"].name, s["5.1"].tasks, s["5.1"].time_used) == ("engine", "probe",
                                                                                  1, 6)


def test_het_steps_carry_the_components_own_job_id():
    # srun --het-group=1 in het job 3 (component 3+1, own id 4) shows as step 4.1, not 3+1.0
    (w,) = [s for s in parse_steps(rec("a_steps.out")) if s.name == "workers"]
    assert (w.step_id, w.job_id, w.step, w.nodes, w.tasks) == ("4.1", "4", "1", "node[2-3]", 2)
    # and `squeue --steps -j 3` (or -j 3+1) does not list it: ask for every component's own id
    assert "workers" not in {s.name for s in parse_steps(rec("a_steps_het_leader.out"))}
    assert "workers" not in {s.name for s in parse_steps(rec("a_steps_het_plus1.out"))}
    assert {s.name for s in parse_steps(rec("a_steps_het_both.out"))} == {"router", "batch",
                                                                          "workers"}


def test_a_het_jobs_steps_carry_each_components_own_id():
    # the runtime asks for its steps with every component's own id (component 1 of job 3 is 4)
    jobs = fold_het(parse_squeue_format(rec("a_squeue.out")))
    ids = {s.step_id for s in parse_steps(rec("a_steps.out"))}
    assert {"3.0", "3.batch", "4.1", "5.0", "5.1", "5.batch"} <= ids
    het = next(j for j in jobs if j.job_id == "3")
    assert steps_argv([str(i) for i in het.unique_ids])[-2:] == ["-j", "3,4"]


def test_steps_after_the_het_job_was_cancelled():
    steps = parse_steps(rec("b_steps.out"))
    assert not any(s.job_id in ("3", "4") for s in steps)
    assert "10.batch" in {s.step_id for s in steps}


def test_steps_robustness():
    assert parse_steps("") == []
    assert parse_steps("5|1|node1|0:01\n") == []  # a field short
    assert parse_steps("5|1|node1|0:01|no dot\n") == []  # a job id, not a step id
    text = "3+1.0|2|node[2-3]|1:00|a|b\n5.extern|1|node1|0:00|extern\n"
    s = parse_steps(text)
    assert [(x.job_id, x.step, x.name, x.time_used) for x in s] == [("3+1", "0", "a|b", 60),
                                                                     ("5", "extern", "extern", 0)]
    assert STEPS_FORMAT.endswith("%j")


# ------------------------------------------------------------------ sacct


def test_sacct_disabled_on_the_real_output():
    err, out, rc = rec("a_sacct.err"), rec("a_sacct.out"), rec("a_sacct.rc")
    assert rc.strip() == "1" and out == ""
    res = Result(("sacct",), 1, out, err)
    assert sacct_disabled(res)
    assert sacct_disabled(rec("a_sacct_json.err"))
    cp = subprocess.CompletedProcess(["sacct"], 1, stdout=b"", stderr=err.encode())
    assert sacct_disabled(cp)
    assert parse_sacct(out) == []


def test_sacct_disabled_is_false_otherwise():
    assert not sacct_disabled(Result(("sacct",), 0, sample("handwritten/sacct_X_P.txt"), ""))
    assert not sacct_disabled(Result(("sacct",), 1, "", "sacct: error: Invalid job id"))
    assert not sacct_disabled("")
    assert not sacct_disabled(None)


def test_sacct_allocations():
    recs = {r.job_id: r for r in parse_sacct(sample("handwritten/sacct_X_P.txt"))}
    assert list(recs) == ["4001+0", "4001+1", "4010+0", "4010+1", "4031", "4032", "4040+0",
                          "4040+1", "4060"]
    c1 = recs["4001+1"]
    assert (c1.het_job_id, c1.het_offset, c1.unique_id) == (4001, 1, None)
    assert (c1.state, c1.nodes, c1.time_used, c1.name) == ("RUNNING", "gpu-[002-005]", 723,
                                                          "kimi-k2-pd")
    assert (recs["4010+0"].nodes, recs["4010+0"].reason) == ("", "Resources")  # None assigned
    assert (recs["4031"].state, recs["4031"].exit_code, recs["4031"].unique_id) == ("FAILED", "3:0",
                                                                                   4031)
    assert (recs["4032"].state, recs["4032"].exit_code) == ("CANCELLED", "0:15")  # 'CANCELLED by 1000'
    assert (recs["4060"].time_used, recs["4060"].name) == (86407, "name|with|pipes")
    assert all(r.source == "sacct" for r in recs.values())
    folded = {f.job_id: f for f in fold_het(recs.values())}
    assert folded["4040"].state == "NODE_FAIL" and folded["4001"].state == "RUNNING"


def test_sacct_step_rows_are_skipped():
    recs = parse_sacct(sample("handwritten/sacct_P_with_steps.txt"))
    assert [r.job_id for r in recs] == ["4001+0", "4001+1", "4031", "4050_3"]


def test_sacct_other_field_orders():
    fields = ("JobIDRaw", "JobID", "JobName", "State", "NNodes", "Partition", "User", "Timelimit")
    text = "4002|4001+1|kimi|COMPLETED|4|gpu|alice|04:00:00\n"
    (r,) = parse_sacct(text, fields)
    assert (r.job_id, r.unique_id, r.het_job_id, r.node_count) == ("4001+1", 4002, 4001, 4)
    assert (r.name, r.state, r.partition, r.user, r.time_limit) == ("kimi", "COMPLETED", "gpu",
                                                                    "alice", 14400)


def test_sacct_robustness():
    assert parse_sacct("") == []
    assert parse_sacct("4031|FAILED|3:0\n") == []  # too few fields: truncated
    assert parse_sacct("JobID|State|ExitCode|Elapsed|NodeList|Reason|JobName\n") == []
    assert sacct_argv(["3"]) == ["sacct", "-j", "3", "-X", "-P", "-n",
                                 "--format=" + ",".join(SACCT_FIELDS)]
