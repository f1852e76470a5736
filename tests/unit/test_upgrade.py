"""`hpcserve upgrade` on the render side and the command line: the bad inputs (one line, exit 2,
nothing submitted or written), the prefill/decode release pairs, and a surge job that never
serves stopping the upgrade with the old instance untouched. Slurm is test_scale.py's strict
stand-in; the job directories are real renders. The upgrade itself, under load on the real
cluster, is tests/jobs/test_upgrade_jobs.py."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hpcserve.author import config, plan
from hpcserve.operate import deployments, upgrade
from hpcserve import engines
from hpcserve.cli import main
from hpcserve.author.render import render_files, write_job
from test_scale import DEMO, NOW, Cluster, front, one_error, ops, state, written  # noqa: F401

WORKERS = DEMO.read_text().split("roles:")[0] + "roles:\n  worker:\n    instances: 1\n" \
    "    nodes: 2\nrouter:\n  port: 8000\n"


@pytest.fixture
def workers(tmp_path, monkeypatch):
    """A plain (worker) deployment at SGLang 0.5.23, rendered and recorded as job 42, serving."""
    monkeypatch.setenv("HPCSERVE_STATE_DIR", str(tmp_path / "index"))
    f = tmp_path / "workers.yaml"
    f.write_text(WORKERS.replace("name: demo-kimi-k2", "name: workers"))
    jd = tmp_path / "workers-20260101-000000"
    write_job(render_files(plan.build(config.load(f)), str(jd)), jd)
    (jd / "state.json").write_text(json.dumps(state("serving", {"worker-0": "serving"})))
    e = deployments.Entry("42", "workers", str(jd), None, NOW, None)
    deployments.record(e)
    cluster = Cluster({"42": ("workers", "RUNNING")})
    monkeypatch.setattr(ops, "runner_for", lambda remote, **_: cluster)
    return e, cluster, jd


def refused(cluster, jd, args) -> str:
    before = (jd / config.SOURCE_FILE).read_text()
    said = one_error(CliRunner().invoke(main, ["upgrade", "42", *args]))
    assert not cluster.called("sbatch") and written(jd) == []
    assert (jd / config.SOURCE_FILE).read_text() == before
    return said


@pytest.mark.parametrize("args, words", [
    ([], "give the new release: --set engine.version=X (and/or --set engine.image=...)"),
    (["--set", "model.path=/elsewhere"],
     "--set model.path: an upgrade changes only engine.version and engine.image (everything "
     "else stays as the deployment was submitted)"),
    (["--set", "engine.version=0.5.22", "--set", "roles.worker.instances=3"],
     "--set roles.worker.instances: an upgrade changes only engine.version and engine.image "
     "(everything else stays as the deployment was submitted)"),
    (["--set", "engine.version=9.9.9"],
     "SGLang 9.9.9 is not a release hpcserve knows (the newest it knows is 0.5.23): an upgrade "
     "goes to a release whose flags it can check"),
    (["--set", "engine.version=0.5.21.post7"],
     "SGLang 0.5.21.post7 is not a release hpcserve knows (the nearest it knows are 0.5.21 and "
     "0.5.22): an upgrade goes to a release whose flags it can check"),
    (["--set", "engine.version=0.5.23"],
     "deployment workers (job 42) runs SGLang 0.5.23 already: nothing to upgrade"),
])
def test_bad_input_is_one_line_and_nothing_is_submitted_or_written(workers, args, words):
    _, cluster, jd = workers
    assert refused(cluster, jd, args) == words


def test_an_autoscaled_deployment_is_refused_its_slots_rendered_at_its_release(workers):
    """Its slots were rendered at submit at the old release and its front submits them: an
    upgrade that replaced only the running instances would leave the next add at the old one."""
    _, cluster, jd = workers
    spec = json.loads((jd / "plan.json").read_text())
    (jd / "plan.json").write_text(json.dumps({**spec, "autoscale": {"worker": {"min": 1}}}))
    assert refused(cluster, jd, ["--set", "engine.version=0.5.22"]) == (
        "deployment workers (job 42) autoscales: its slots were rendered at submit at its "
        "release and its front submits them, so an upgrade cannot replace them; submit a new "
        "deployment at the new release instead")


def test_a_release_the_deployment_file_would_refuse_is_refused_with_the_set_named(workers):
    _, cluster, jd = workers
    said = refused(cluster, jd, ["--set", "engine.version=banana"])
    assert said.startswith("--set engine.version=banana") and "engine.version" in said, said


def test_a_pd_deployment_changes_release_only_between_releases_that_talk(front, monkeypatch):
    _, cluster, jd = front  # test_scale's demo: SGLang 0.5.23 prefill and decode
    said = refused(cluster, jd, ["--set", "engine.version=0.5.22"])
    assert said == ("a rolling upgrade of a prefill/decode deployment serves SGLang 0.5.23 and "
                    "0.5.22 side by side, and their prefill and decode instances would hand KV "
                    "caches to each other: SGLang supports one release with itself (its docs "
                    "promise no transfer across releases); submit a new deployment at the new "
                    "release instead, or change only engine.image")
    # a pair the adapter lists is let through, and the refusal of another names the list
    sg = type(engines.get("sglang"))
    monkeypatch.setattr(sg, "pd_release_groups", (frozenset({"0.5.23", "0.5.22"}),))
    f = upgrade.scale.front("42", None, cluster, None)
    assert upgrade.release(upgrade.target(f, cluster, ("engine.version=0.5.22",))) == (
        "0.5.22", None)
    said = refused(cluster, jd, ["--set", "engine.version=0.5.21"])
    assert "SGLang supports within {0.5.22, 0.5.23}, or one release with itself" in said, said


def test_a_pd_deployment_may_change_its_image_at_the_same_release(front):
    _, cluster, jd = front
    f = upgrade.scale.front("42", None, cluster, None)
    new = upgrade.target(f, cluster, ("engine.image=/images/sglang-0.5.23-fix.sqsh",))
    assert upgrade.release(new) == ("0.5.23", "/images/sglang-0.5.23-fix.sqsh")


def test_every_serving_instance_is_replaced_front_first_and_those_at_the_release_skipped(
        workers):
    e, cluster, jd = workers
    f = upgrade.scale.front("42", None, cluster, None)
    new = upgrade.target(f, cluster, ("engine.version=0.5.22",))
    # an instance job of two, at the old release, and one (a surge) at the new one
    for seq, version, names in ((1, "0.5.23", ("worker-0", "worker-1")),
                                (2, "0.5.22", ("worker-0",))):
        cfg = config.load(jd / config.SOURCE_FILE, (f"engine.version={version}",))
        sub = jd / "scale" / f"worker-{seq}"
        q = plan.instance_job(cfg, "worker", len(names), seq, 40 * seq,
                              upgrade.scale.attach_of(f))
        write_job(render_files(q, str(sub)), sub)
        (sub / "state.json").write_text(json.dumps(state("serving", dict.fromkeys(names,
                                                                                 "serving"))))
        deployments.record(deployments.Entry(str(42 + seq), q.name, str(sub), None, NOW + seq,
                                             None, front=str(jd)))
        cluster.jobs[str(42 + seq)] = (q.name, "RUNNING")
    todo = upgrade.olds(f, cluster, new)
    assert [(o.entry.job_id, o.instance, o.role) for o in todo] == [
        ("42", "worker-0", "worker"), ("43", "worker-0", "worker"), ("43", "worker-1", "worker")]


def test_a_surge_job_that_never_serves_stops_the_upgrade_before_any_drain(workers):
    e, cluster, jd = workers
    before = (jd / config.SOURCE_FILE).read_text()
    r = CliRunner().invoke(main, ["upgrade", "42", "--set", "engine.version=0.5.22"])
    assert r.exit_code == 1, r.output
    surge = jd / "scale" / "worker-1"
    assert cluster.called("sbatch") == [["sbatch", "--parsable", str(surge / "job.sbatch")]]
    spec = json.loads((surge / "plan.json").read_text())
    assert spec["engine"]["version"] == "0.5.22" and [i["name"] for i in spec["instances"]] == [
        "worker-0"]
    # Slurm lists no job 77: it ended before its state said anything
    lines = r.output.splitlines()
    assert lines[0] == f"[1/1] worker-0 of job 42: surge job 77 at SGLang 0.5.22 ({surge})"
    assert lines[-1].startswith("upgrade stopped at worker-0 of job 42: its surge job 77 "
                                "ended before it served ("), lines
    assert lines[-1].endswith("; worker-0 of job 42 still serves"), lines
    assert not (jd / "run" / "control").exists()  # the old instance was not drained
    assert (jd / config.SOURCE_FILE).read_text() == before
