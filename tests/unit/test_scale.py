"""`hpcserve scale` on the render side and the command line: the deployment rebuilt from its job
directory, the instance job's plan (one role, no router, attach, its own ports), the bad inputs
(one line, exit 2, nothing submitted or written), the drain requests, and status, list and cancel
treating a front and its instance jobs as one deployment. Slurm is a strict stand-in that lists
the jobs and records what it was asked; the job directories are real renders."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from hpcserve.author import config, plan, ports
from hpcserve.operate import deployments, ops, scale
from hpcserve.cli import main
from hpcserve.author.plan_json import SCHEMA, job_spec
from hpcserve.author.render import render_files, write_job
from hpcserve.runtime.contract import STATE_SCHEMA
from hpcserve.slurm.runner import LocalRunner, Result

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "demo.yaml"
ENDPOINT = "http://10.0.0.1:8000"
NOW = 1_000_000.0
ATTACH = {"router_url": ENDPOINT, "workers_api": "queued", "api_key_env": "HPCSERVE_API_KEY",
          "front_job_id": "42", "front_job_dir": "/jobs/demo", "deployment": "demo-kimi-k2"}


# ------------------------------------------------------------------------ deployment's source

@pytest.mark.parametrize("example", ["demo", "vllm-cpu-pd", "kimi-k2-instruct-4p12d"])
def test_the_job_directory_rebuilds_the_deployment_without_the_user_s_files(example, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT / "site_configs", src / "site_configs")
    f = src / "deploy.yaml"
    f.write_text((ROOT / "examples" / f"{example}.yaml").read_text())
    sets = ("readiness.engine_timeout=97", "site.slurm.signal_grace=11")
    cfg = config.load(f, sets)
    job = write_job(render_files(plan.build(cfg), str(tmp_path / "job")), tmp_path / "job")
    shutil.rmtree(src)  # the user's file and its site file are gone (or edited)
    again = config.load(job / config.SOURCE_FILE)
    # the deployment's own `site:` holds the merged site now, which validates to the same Site
    assert (replace(again.deployment, site=None), again.site, again.profile) == (
        replace(cfg.deployment, site=None), cfg.site, cfg.profile)
    # the --set values are kept, the one into the site as well
    assert (again.deployment.readiness.engine_timeout, again.site.slurm.signal_grace) == (97, 11)
    # what the file set stays told apart from defaults: the same plan, ports included
    assert job_spec(plan.build(again), "/j") == job_spec(plan.build(cfg), "/j")
    assert job_spec(plan.build(again, 40), "/j") == job_spec(plan.build(cfg, 40), "/j")


# --------------------------------------------------------------------------- instance job plan

def test_an_instance_job_runs_one_role_no_router_and_names_the_front_s_router():
    cfg = config.load(DEMO)
    q = plan.instance_job(cfg, "decode", 2, 3, 60, ATTACH)
    files = render_files(q, "/jobs/demo/scale/decode-3")
    spec = json.loads(files["plan.json"][0])
    jsonschema.validate(spec, SCHEMA)
    assert spec["attach"] == ATTACH and spec["router"] is None
    assert spec["name"] == "demo-kimi-k2-decode-3"
    assert [i["name"] for i in spec["instances"]] == ["decode-0", "decode-1"]
    assert [c["name"] for c in spec["components"]] == ["decode"]
    assert ["job-name", "demo-kimi-k2-decode-3"] in spec["components"][0]["directives"]
    assert not [k for k in files if "router" in k and not k.startswith("hpcserve_runtime/")]
    assert spec["benchmark"] is None
    # the front's deployment file travels on: a later `scale` of this job's front reads it
    assert files[config.SOURCE_FILE][0] == config.source_text(cfg.source)


def test_an_instance_job_moves_every_port_the_file_sets_too(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(DEMO.read_text().replace("  decode:\n    instances: 1\n",
                                          "  decode:\n    instances: 1\n    port: 31000\n"))
    cfg = config.load(f)
    front = {i.name: dict(i.ports) for i in plan.build(cfg).instances}
    q = plan.instance_job(cfg, "decode", 1, 1, 40, ATTACH)
    assert front["decode-0"]["http"] == 31000
    assert dict(q.instances[0].ports) == {k: p + 40 for k, p in front["decode-0"].items()}


def test_instance_jobs_take_port_blocks_clear_of_the_front_and_each_other():
    cfg = config.load(DEMO)

    def at(shift):
        return plan.instance_job(cfg, "decode", 1, 1, shift, ATTACH)

    front = ports.plan_ports(plan.build(cfg))
    SHIFTS = (plan.PORT_SHIFT_STEP, plan.PORT_SHIFTS)  # noqa: N806 - the planner's port blocks
    first = ports.clear_ports(at, 1, front, *SHIFTS)
    assert not ports.plan_ports(first) & front
    # the second instance job's own block (seq 2), and past it when that block is taken
    second = ports.clear_ports(at, 2, front | ports.plan_ports(first), *SHIFTS)
    assert not ports.plan_ports(second) & (front | ports.plan_ports(first))
    third = ports.clear_ports(at, 2, front | ports.plan_ports(second), *SHIFTS)
    assert not ports.plan_ports(third) & ports.plan_ports(second)
    assert third.instances[0].port > second.instances[0].port


# ------------------------------------------------------------------------- the command line

class Cluster(LocalRunner):
    """squeue lists the jobs in `jobs` (id -> (name, state)); sbatch answers the next id and
    records the script; scancel records its call; every other Slurm command fails; files are
    this machine's."""

    def __init__(self, jobs: dict[str, tuple[str, str]]):
        super().__init__()
        self.jobs = jobs
        self.asked: list[list[str]] = []
        self.next_id = 77

    def run_once(self, argv, *, check=True, timeout=60.0, env=None):
        self.asked.append(list(argv))
        if argv[0] == "squeue":
            out = "".join(f"{j}|{j}|{st}|None|n1|1|gpu|me|0:05|10:00|9:55|N/A|N/A|N/A|{name}\n"
                          for j, (name, st) in self.jobs.items())
        elif argv[0] == "sbatch":
            out = f"{self.next_id}\n"
            self.next_id += 1
        elif argv[0] == "scancel":
            out = ""
        elif argv[0] == "sh":
            return super().run_once(argv, check=check, timeout=timeout, env=env)
        else:
            return Result(tuple(argv), 1, "", "not here")
        return Result(tuple(argv), 0, out, "")

    def called(self, cmd: str) -> list[list[str]]:
        return [a for a in self.asked if a[0] == cmd]


def instance(name: str, status: str, node: str) -> dict:
    role, _, index = name.rpartition("-")
    return {"role": role, "index": int(index), "status": status, "why": None, "attempt": 0,
            "restarts": 0, "nodes": [node], "since": NOW, "recover_s": None,
            "next_try_at": None, "attempts": [{"attempt": 0, "nodes": [node],
                                               "started_at": NOW}]}


def state(phase: str, names: dict[str, str]) -> dict:
    s = {"phase": phase, "history": [{"phase": phase, "at": NOW}], "job_id": "42",
         "updated_at": NOW, "endpoint": ENDPOINT,
         "instances": {n: instance(n, st, f"n{k}") for k, (n, st) in enumerate(names.items())}}
    jsonschema.validate(s, STATE_SCHEMA)  # the shape the runtime writes
    return s


@pytest.fixture
def front(tmp_path, monkeypatch):
    """The demo rendered and recorded as job 42, serving; the cluster lists it running."""
    monkeypatch.setenv("HPCSERVE_STATE_DIR", str(tmp_path / "index"))
    jd = tmp_path / "demo-20260101-000000"
    write_job(render_files(plan.build(config.load(DEMO)), str(jd)), jd)
    (jd / "state.json").write_text(json.dumps(state("serving", {"prefill-0": "serving",
                                                                "decode-0": "serving"})))
    e = deployments.Entry("42", "demo-kimi-k2", str(jd), None, NOW, None)
    deployments.record(e)
    cluster = Cluster({"42": ("demo-kimi-k2", "RUNNING")})
    monkeypatch.setattr(ops, "runner_for", lambda remote, **_: cluster)
    return e, cluster, jd


def written(jd: Path) -> list[str]:
    """What a refused command could have written: instance jobs and drain requests."""
    return sorted(str(p.relative_to(jd)) for p in jd.rglob("*")
                  if "scale" in p.parts or "control" in p.parts)


def one_error(r) -> str:
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcserve: error: "), r.output
    return lines[0].removeprefix("hpcserve: error: ")


@pytest.mark.parametrize("args, words", [
    (["--role", "worker", "--add", "1"],
     "deployment demo-kimi-k2 (job 42) has no role 'worker': its roles are decode, prefill"),
    (["--role", "decode", "--add", "0"], "--add takes a number of instances of 1 or more"),
    (["--role", "decode", "--remove", "-1"], "--remove takes a number of instances of 1 or more"),
    (["--role", "decode"], "give one of --add N or --remove N"),
    (["--role", "decode", "--add", "1", "--remove", "1"], "give one of --add N or --remove N"),
    (["--role", "decode", "--remove", "2"], "--remove 2: only 1 decode instance(s) of "
                                            "demo-kimi-k2 serve"),
])
def test_bad_input_is_one_line_and_nothing_is_submitted_or_written(front, args, words):
    _, cluster, jd = front
    r = CliRunner().invoke(main, ["scale", "42", *args])
    assert one_error(r) == words
    assert not cluster.called("sbatch") and written(jd) == []


def test_a_job_that_is_not_a_deployment_is_refused(front, tmp_path):
    _, cluster, jd = front
    (jd / "plan.json").unlink()
    assert one_error(CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "1"])
                     ) == f"job 42 is not an hpcserve deployment: no plan.json in {jd}"
    # a job id neither the index nor Slurm knows
    said = one_error(CliRunner().invoke(main, ["scale", "9", "--role", "decode", "--add", "1"]))
    assert said.startswith("job 9 is not in hpcserve's list and Slurm does not know it"), said
    assert not cluster.called("sbatch") and written(jd) == []


def test_a_front_that_does_not_serve_is_refused(front):
    _, cluster, jd = front
    (jd / "state.json").write_text(json.dumps(state("starting", {})))
    said = one_error(CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "1"]))
    assert said == ("job 42 (demo-kimi-k2) does not serve (starting): a deployment scales once "
                    "its router serves")
    assert not cluster.called("sbatch") and written(jd) == []


@pytest.mark.parametrize("api", ["remove-only", "restart"])
def test_a_router_that_cannot_add_workers_while_it_runs_is_refused_for_add(front, api):
    _, cluster, jd = front
    spec = json.loads((jd / "plan.json").read_text())
    spec["router"]["workers_api"] = api
    (jd / "plan.json").write_text(json.dumps(spec))
    said = one_error(CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "1"]))
    assert said.startswith(f"the router of job 42, sglang-router, cannot add workers while it "
                           f"runs ({api}: "), said
    assert not cluster.called("sbatch") and written(jd) == []


def test_add_submits_an_instance_job_under_the_front_and_records_it(front):
    e, cluster, jd = front
    r = CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "2"])
    assert r.exit_code == 0, r.output
    job = jd / "scale" / "decode-1"
    assert r.output.splitlines() == [
        f"submitted job 77: demo-kimi-k2-decode-1, 2 decode instance(s) joining {ENDPOINT}",
        f"job directory: {job}"]
    assert cluster.called("sbatch") == [["sbatch", "--parsable", str(job / "job.sbatch")]]
    spec = json.loads((job / "plan.json").read_text())
    assert spec["attach"] == {"router_url": ENDPOINT, "workers_api": "queued",
                              "api_key_env": "HPCSERVE_API_KEY", "front_job_id": "42",
                              "front_job_dir": str(jd), "deployment": "demo-kimi-k2"}
    assert not ops.spec_ports(spec) & ops.spec_ports(json.loads((jd / "plan.json").read_text()))
    (sub,) = deployments.instance_jobs(e)
    assert (sub.job_id, sub.job_dir, sub.front) == ("77", str(job), str(jd))
    # the next one is the role's second instance job, in ports of its own
    cluster.jobs["77"] = ("demo-kimi-k2-decode-1", "RUNNING")
    assert CliRunner().invoke(main, ["scale", "77", "--role", "decode", "--add", "1"]
                              ).exit_code == 0  # an instance job named: its front scales
    second = json.loads((jd / "scale" / "decode-2" / "plan.json").read_text())
    assert not ops.spec_ports(second) & ops.spec_ports(spec)


@pytest.fixture
def scaled(front):
    """The front (decode-0 serving) with instance job 43 (decode-0 and decode-1 serving)."""
    e, cluster, jd = front
    sub = jd / "scale" / "decode-1"
    (sub / "logs").mkdir(parents=True)
    (sub / "state.json").write_text(json.dumps(state("serving", {"decode-0": "serving",
                                                                 "decode-1": "serving"})))
    se = deployments.Entry("43", "demo-kimi-k2-decode-1", str(sub), None, NOW + 1, None,
                           front=str(jd))
    deployments.record(se)
    cluster.jobs["43"] = ("demo-kimi-k2-decode-1", "RUNNING")
    return e, se, cluster, jd


def test_remove_drains_the_newest_instance_job_s_instances_before_the_front_s(scaled):
    e, se, cluster, jd = scaled
    r = CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--remove", "3",
                                  "--drain-timeout", "45"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == [f"draining decode-1 of job 43 ({se.job_dir})",
                                     f"draining decode-0 of job 43 ({se.job_dir})",
                                     f"draining decode-0 of job 42 ({jd})"]
    for where, name, jid in ((se.job_dir, "decode-1", "43"), (se.job_dir, "decode-0", "43"),
                             (jd, "decode-0", "42")):
        req = json.loads(Path(where, "run", "control", f"drain-{name}.json").read_text())
        assert req["timeout_s"] == 45 and abs(req["requested_at"] - time.time()) < 60
        assert req["job_id"] == jid, (where, req)  # the job it is for: a later one ignores it
    assert sorted(p.name for p in Path(se.job_dir, "run", "control").iterdir()) == [
        "drain-decode-0.json", "drain-decode-1.json"]  # no temporary file left
    # requested already: not picked a second time, and none is left to drain
    said = one_error(CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--remove",
                                               "1"]))
    assert said == "--remove 1: only 0 decode instance(s) of demo-kimi-k2 serve"


def test_wait_returns_once_each_instance_is_removed_and_names_those_that_are_not(scaled,
                                                                                monkeypatch):
    e, se, cluster, jd = scaled
    d = [scale.Drain(se, "decode-1")]
    lines = []
    monkeypatch.setattr(scale, "WAIT_MARGIN_S", 0)
    assert scale.wait_removed(cluster, d, 0.2, lines.append, interval=0.05) == 1
    assert lines == ["not removed within 0 s: decode-1 of job 43"]
    s = state("serving", {"decode-0": "serving", "decode-1": "serving"})
    s["instances"]["decode-1"]["status"] = "removed"
    Path(se.job_dir, "state.json").write_text(json.dumps(s))
    lines.clear()
    assert scale.wait_removed(cluster, d, 0.2, lines.append) == 0
    assert lines == ["decode-1 of job 43: removed"]


def test_status_and_list_show_instance_jobs_under_their_front(scaled):
    e, se, cluster, jd = scaled
    for args in (["status", "42"], ["list"]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        rows = [ln for ln in r.output.splitlines() if ln.lstrip().startswith(("42 ", "43 "))]
        assert [ln.split()[:2] for ln in rows] == [["42", "demo-kimi-k2"],
                                                   ["43", "demo-kimi-k2-decode-1"]], r.output
        assert rows[1].startswith("  43") and not rows[0].startswith(" "), r.output
    st = json.loads(CliRunner().invoke(main, ["status", "42", "--json"]).output)
    assert [(v["job_id"], v["front"]) for v in st] == [("42", None), ("43", str(jd))]
    assert set(st[1]["instances"]) == {"decode-0", "decode-1"}


def test_cancel_of_a_front_stops_it_first_then_its_instance_jobs(scaled):
    e, se, cluster, jd = scaled
    r = CliRunner().invoke(main, ["cancel", "42"])
    assert r.exit_code == 0, r.output
    assert cluster.called("scancel") == [["scancel", "--batch", "--signal=USR1", "42"],
                                         ["scancel", "--batch", "--signal=USR1", "43"]]


def test_cancel_of_an_instance_job_stops_only_it(scaled):
    e, se, cluster, jd = scaled
    assert CliRunner().invoke(main, ["cancel", "43"]).exit_code == 0
    assert cluster.called("scancel") == [["scancel", "--batch", "--signal=USR1", "43"]]
