"""The deployment index: every submission kept, keyed by where it runs (login host, Slurm's
ClusterName), its job id and its submit time; a job id several submissions got is refused with
each of them listed; a job directory's name always picks one."""

from __future__ import annotations

import pytest

from hpcserve.operate import deployments, ops
from hpcserve.errors import HpcserveError
from hpcserve.runtime.slurm_cluster import config_argv
from hpcserve.slurm.runner import Result


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCSERVE_STATE_DIR", str(tmp_path))


def entry(job_id, handle, cluster, at, remote=None, name="dep"):
    return deployments.Entry(job_id, name, f"/jobs/{handle}", remote, at, cluster)


def test_a_job_id_two_clusters_gave_out_is_refused_with_both_listed():
    old = entry("1", "dep-20261125-040000", "devA", 1_000.0)
    new = entry("1", "dep-20261125-050000", "devB", 2_000.0)
    for e in (old, new):
        deployments.record(e)
    with pytest.raises(HpcserveError) as err:
        deployments.find("1")
    msg = str(err.value)
    assert msg.startswith("job 1 names 2 deployments: dep-20261125-050000 (cluster devB")
    assert "dep-20261125-040000 (cluster devA from this host" in msg
    assert "\n" not in msg and "name one by its job directory" in msg
    assert deployments.find("dep-20261125-040000") == old
    assert deployments.find("/jobs/dep-20261125-050000/") == new
    assert deployments.reference(new) == "dep-20261125-050000"
    assert deployments.find("2") is None


def test_one_submission_per_id_keeps_the_job_id_as_its_name():
    e = entry("7", "dep-x", "dev", 5.0)
    deployments.record(e)
    assert deployments.find("7+1") == e and deployments.reference(e) == "7"


def test_entries_written_before_the_cluster_was_recorded_still_read(tmp_path):
    (tmp_path / "deployments.jsonl").write_text(
        '{"job_id": "3", "name": "old", "job_dir": "/jobs/old", "remote": null, '
        '"submitted_at": 12.0}\n')
    (e,) = deployments.entries()
    assert (e.job_id, e.cluster, e.handle) == ("3", None, "old")


class QueueRunner:
    """squeue lists job 1 (the newer submission's name) on cluster devB."""

    def __init__(self, cluster: str):
        self.cluster, self.calls = cluster, []

    def run(self, argv, check=True, **kw):
        self.calls.append(argv[:3])
        if argv[:3] == config_argv():
            return Result(tuple(argv), 0, f"ClusterName             = {self.cluster}\n", "")
        if argv[0] == "squeue":
            line = "1|1|RUNNING|None|node1|1|local|root|0:05|10:00|9:55|N/A|N/A|N/A|dep"
            return Result(tuple(argv), 0, line + "\n", "")
        return Result(tuple(argv), 1, "", "")

    def read_text(self, path):
        return None


def test_slurm_s_job_1_is_shown_for_the_newest_submission_of_its_cluster_only():
    old = entry("1", "dep-a", "devB", 1_000.0)      # the same cluster, before a reset
    other = entry("1", "dep-b", "devA", 1_500.0)    # another cluster reached from this host
    new = entry("1", "dep-c", "devB", 2_000.0)
    runner = QueueRunner("devB")
    views = {v.job_dir: v for v in ops.status([old, other, new], lambda _r: runner)}
    assert views["/jobs/dep-c"].slurm_state == "RUNNING"
    assert views["/jobs/dep-a"].slurm_state is None
    assert views["/jobs/dep-b"].slurm_state is None
    assert runner.calls.count(config_argv()) == 1


def test_an_id_another_job_of_the_user_got_is_not_this_deployment_s():
    e = entry("1", "dep-a", "devB", 1_000.0, name="someone-else")
    views = ops.status([e], lambda _r: QueueRunner("devB"))
    assert views[0].slurm_state is None


def test_the_cluster_is_asked_only_where_the_index_names_several():
    runner = QueueRunner("devB")
    ops.status([entry("1", "dep-a", "devB", 1.0), entry("2", "dep-b", "devB", 2.0)],
               lambda _r: runner)
    assert config_argv() not in runner.calls


def test_a_submission_is_recorded_under_the_indexs_lock_in_a_file_of_its_users_alone(
        tmp_path, monkeypatch):
    """Another process of the user (a second shell, an autoscaling front's `hpcserve scale`)
    holds the index's lock (fcntl, as record and entries take it): the line waits for it,
    then lands whole. The index and its directory are the user's alone."""
    import os
    import subprocess
    import sys
    import threading
    deployments.record(entry("1", "dep-a", "devA", 1_000.0))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(deployments.index_path())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        done = threading.Event()
        t = threading.Thread(target=lambda: (deployments.record(
            entry("2", "dep-b", "devA", 2_000.0)), done.set()))
        t.start()
        assert not done.wait(0.5), "recorded while another process held the index's lock"
    finally:
        holder.stdin.close()
        holder.wait(10)
    t.join(10)
    assert done.is_set() and [e.job_id for e in deployments.entries()] == ["1", "2"]
    assert os.stat(deployments.index_path()).st_mode & 0o777 == 0o600
    sub = tmp_path / "new-state"
    monkeypatch.setenv("HPCSERVE_STATE_DIR", str(sub))
    deployments.record(entry("3", "dep-c", "devA", 3_000.0))
    assert sub.stat().st_mode & 0o777 == 0o700
