"""A deployment inside an allocation the user holds: the node mapping (components on disjoint runs
of the allocation's nodes, in plan order), the fit check's numbers, what Slurm's record says the
allocation holds, and the step scripts rendered for it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcserve.operate import bench_ops, in_allocation as ia
from hpcserve.author import config, plan as planner
from hpcserve.author.plan_json import job_spec
from hpcserve.author.render import render_files
from hpcserve.runtime import file_sd
from hpcserve.runtime.allocation import (PREFLIGHT_SECONDS, SHAPE_VARS, Held, InAllocation,
                                         gpus_asked, held, misfit, node_map, own_steps,
                                         step_prefix)
from hpcserve.runtime.slurm_queue import STEPS_FORMAT
from hpcserve.runtime.spec import Component, Spec
from hpcserve.slurm.runner import LocalRunner, Result

ROOT = Path(__file__).resolve().parents[2]


def _spec(nodes: dict, gpus: int | None = None) -> Spec:
    extra = [["gpus-per-node", str(gpus)]] if gpus else []
    return Spec({"components": [{"index": i, "name": n, "nodes": k,
                                 "directives": [["nodes", str(k)], *extra]}
                                for i, (n, k) in enumerate(nodes.items())]})


def test_components_take_disjoint_runs_in_plan_order():
    hosts = [f"n{i}" for i in range(1, 9)]
    got = node_map(_spec({"prefill": 2, "decode": 3, "router": 1}), hosts)
    assert got == {0: ["n1", "n2"], 1: ["n3", "n4", "n5"], 2: ["n6"]}
    every = [h for v in got.values() for h in v]
    assert len(every) == len(set(every))  # no node twice


def test_more_nodes_than_the_allocation_holds_cannot_be_mapped():
    with pytest.raises(ValueError, match="3 node"):
        node_map(_spec({"worker": 3}), ["n1", "n2"])


def test_too_few_nodes_named_with_the_numbers_per_role():
    why = misfit(_spec({"prefill": 1, "decode": 2}), Held("77", "RUNNING", ["a", "b"], None))
    assert why == "the deployment needs 3 node(s) (prefill 1, decode 2) and allocation 77 " \
                  "holds 2 (a,b)"


def test_too_few_gpus_per_node_named():
    spec = _spec({"prefill": 1, "decode": 1}, gpus=8)
    assert misfit(spec, Held("9", "RUNNING", ["a", "b"], 4)) == \
        "the deployment needs 8 GPU(s) per node (prefill 8, decode 8) and allocation 9 holds 4 " \
        "per node"
    assert misfit(spec, Held("9", "RUNNING", ["a", "b"], None)).endswith("holds 0 per node")
    assert misfit(spec, Held("9", "RUNNING", ["a", "b", "c"], 8)) is None


def test_too_few_cpus_per_node_named():
    """An engine that computes on CPUs (cpus-per-task, a task per GPU) in an salloc that holds
    fewer on each node: srun would refuse its step."""
    spec = Spec({"components": [
        {"index": 0, "name": "prefill", "nodes": 1,
         "directives": [["cpus-per-task", "8"], ["ntasks-per-node", "4"]]},
        {"index": 1, "name": "decode", "nodes": 1, "directives": [["cpus-per-task", "16"]]}]})
    assert misfit(spec, Held("9", "RUNNING", ["a", "b"], None, 16)) == \
        "the deployment needs 32 CPU(s) per node (prefill 32, decode 16) and allocation 9 " \
        "holds 16 per node"
    assert misfit(spec, Held("9", "RUNNING", ["a", "b"], None, 32)) is None
    assert misfit(spec, Held("9", "RUNNING", ["a", "b"], None, None)) is None  # not said
    assert misfit(_spec({"prefill": 1}), Held("9", "RUNNING", ["a"], None, 1)) is None


def test_gpus_asked_from_the_directives():
    assert gpus_asked(Component({"directives": [["gres", "gpu:h100:4"]]})) == 4
    assert gpus_asked(Component({"directives": [["gres", "nvme:1,gpu:2"]]})) == 2
    assert gpus_asked(Component({"directives": [["gpus-per-node", "8"]]})) == 8
    assert gpus_asked(Component({"directives": [["nodes", "2"]]})) == 0


def test_held_reads_nodes_and_gpus_from_slurm():
    record = ("JobId=41 JobName=held JobState=RUNNING NodeList=gpu[07-08] NumNodes=2 "
              "TRES=cpu=64,mem=500G,node=2,billing=64,gres/gpu=16")
    asked = []

    def ask(argv):
        asked.append(argv)
        return record if argv[1] == "-o" else "gpu07\ngpu08\n"

    assert held("41", ask) == Held("41", "RUNNING", ["gpu07", "gpu08"], 8, 32)
    assert asked[1] == ["scontrol", "show", "hostnames", "gpu[07-08]"]


def test_a_het_allocation_is_refused():
    two = "JobId=5 NodeList=a NumNodes=1\nJobId=6 NodeList=b NumNodes=1\n"
    with pytest.raises(ValueError, match="heterogeneous"):
        held("5", lambda argv: two)


def test_steps_name_their_nodes_in_the_allocation_not_a_het_group():
    p = planner.in_allocation(planner.build(config.load(ROOT / "examples" / "demo.yaml")))
    files = render_files(p, "/jobs/demo")
    for name in ("discover-0", "discover-1", "prefill-0", "decode-0", "router"):
        text = files[f"steps/{name}.sh"][0]
        assert '--jobid="${SLURM_JOB_ID}"' in text and '--nodelist="${NODELIST}"' in text, name
        assert "--het-group" not in text, name
    sbatch = files["job.sbatch"][0]
    assert "#SBATCH" not in sbatch and "prefill 2, decode 2" in sbatch
    spec = job_spec(p, "/jobs/demo")
    assert spec["in_allocation"] is True and spec["requeue"] == 0


# ------------------------------------------------------------------ review fixes (issue 24, 5)

def _demo_in_allocation():
    return planner.in_allocation(planner.build(config.load(ROOT / "examples" / "demo.yaml")))


def test_the_benchmark_step_of_an_in_allocation_deployment_names_no_het_group():
    p = _demo_in_allocation()
    spec = job_spec(p, "/jobs/demo")
    first = spec["instances"][0]
    assert len(spec["components"]) > 1  # a het job would need --het-group
    assert bench_ops.het_group(spec, first) is None
    assert bench_ops.het_group({**spec, "in_allocation": False}, first) == first["component"]
    prep = bench_ops.Prepared("/jobs/demo", "/jobs/demo/b", "/jobs/demo/b/launch.sh", {}, "n3",
                              None, step_prefix(spec["name"], True) + "bench")
    argv = bench_ops.step_argv(prep, "41")
    srun = argv[argv.index("srun"):]
    assert not [a for a in srun if a.startswith("--het-group")], srun
    assert "--nodelist=n3" in srun and "--jobid=41" in srun
    assert "--job-name=hpcserve-demo-kimi-k2-bench" in srun
    assert argv[:3] == ["env", "-u", "SLURM_CPUS_PER_TASK"]  # not the salloc shell's shape


def test_a_dead_driver_not_yet_reaped_is_gone(tmp_path):
    """A zombie keeps its /proc stat and start time until its parent (a `submit --follow` that
    started it) waits for it: its state says it ended."""
    runner = LocalRunner()
    live = subprocess.Popen(["sleep", "30"])
    dead = subprocess.Popen(["true"])
    try:
        recs = {}
        for name, p in (("live", live), ("dead", dead)):
            stat = Path(f"/proc/{p.pid}/stat").read_text()
            recs[name] = {"pid": p.pid, "start": ia._start_time(stat),
                          "host": socket.gethostname()}
        until_zombie = time.time() + 10
        while ia._stat_field(Path(f"/proc/{dead.pid}/stat").read_text(), 0) != "Z":
            assert time.time() < until_zombie, "`true` did not end"
            time.sleep(0.01)
        assert Path(f"/proc/{dead.pid}/stat").exists()  # still there, as a zombie
        assert ia.driver_state(runner, str(tmp_path), recs["dead"]) == "gone"
        assert ia.driver_state(runner, str(tmp_path), recs["live"]) == "running"
    finally:
        live.kill()
        live.wait()
        dead.wait()


def test_the_driver_unsets_the_allocations_shape_before_any_srun(tmp_path):
    """job.sbatch's own lines before the runtime starts, run by bash in an salloc's environment:
    the variables srun would read the user's shape from are gone, the allocation's id stays."""
    text = render_files(_demo_in_allocation(), "/jobs/demo")["job.sbatch"][0]
    head = text[:text.index('cd "$HPCSERVE_JOB_DIR"')]
    shape = {v: "7" for v in SHAPE_VARS}
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "n[1-2]",
           **shape}
    out = subprocess.run(["bash", "-c", head + "\nenv"], env=env, capture_output=True,
                         text=True, check=True).stdout
    got = dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln)
    assert not set(SHAPE_VARS) & set(got), sorted(set(SHAPE_VARS) & set(got))
    assert got["SLURM_JOB_ID"] == "41" and got["SLURM_JOB_NODELIST"] == "n[1-2]"
    assert {"SLURM_CPUS_PER_TASK", "SLURM_TRES_PER_TASK", "SLURM_MEM_PER_NODE",
            "SLURM_GPUS_PER_TASK", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS"} <= set(SHAPE_VARS)


class _Slurm:
    """The scontrol/squeue answers the job's InAllocation asks for, in the order given."""

    def __init__(self, left: list):
        self.left = list(left)
        self.asked = 0

    def time_left(self):
        self.asked += 1
        v = self.left.pop(0)
        if isinstance(v, Exception):
            raise v
        return v

    def run(self, argv):
        if argv[:3] == ["scontrol", "-o", "show"]:
            return "JobId=41 JobState=RUNNING NodeList=n[1-4] NumNodes=4"
        return "n1\nn2\nn3\nn4\n"


def _job(plan: dict, slurm: _Slurm):
    logged = []
    job = SimpleNamespace(plan=Spec(plan), slurm=slurm, job_id="41", log=logged.append)
    return job, logged


def test_an_extended_time_limit_is_read_again():
    plan = {**_spec({"prefill": 1, "decode": 1}).as_json(), "in_allocation": True, "signal_grace": 60,
            "preflight": {"only": False}}
    slurm = _Slurm([1000, 4000, RuntimeError("slurm_load_jobs error"), 30])
    job, logged = _job(plan, slurm)
    a = InAllocation(job)
    a.place(0.0)
    assert a.end == 1000
    assert not a.time_is_up(299.0) and slurm.asked == 1  # not asked again before REREAD
    # extended by `scontrol update TimeLimit`
    assert not a.time_is_up(300.0) and a.end == 4300 and slurm.asked == 2
    # Slurm does not answer: the last end holds (1000 s would have stopped it at 940), and it
    # is said in the job's log
    assert not a.time_is_up(950.0) and a.end == 4300 and slurm.asked == 3
    assert "slurm_load_jobs error" in logged[-1]
    assert a.time_is_up(1250.0) and a.end == 1280  # shortened: 30 s left at 1250


def test_an_in_allocation_preflight_ends_in_ten_minutes():
    plan = {**_spec({"prefill": 1, "decode": 1}).as_json(), "in_allocation": True, "signal_grace": 10,
            "preflight": {"only": True}}
    a = InAllocation(_job(plan, _Slurm([86400]))[0])
    a.place(5.0)
    assert a.end == 5.0 + PREFLIGHT_SECONDS
    assert not a.time_is_up(5.0 + PREFLIGHT_SECONDS - 11) and a.time_is_up(5.0 + 590)


def test_the_deployments_steps_carry_its_prefix_in_an_allocation():
    p = _demo_in_allocation()
    files = render_files(p, "/jobs/demo")
    assert "--job-name=hpcserve-demo-kimi-k2-prefill-0\"${HPCSERVE_ATTEMPT_TAG:-}\"" in \
        files["steps/prefill-0.sh"][0]
    assert "--job-name=hpcserve-demo-kimi-k2-router " in files["steps/router.sh"][0]
    het = render_files(planner.build(config.load(ROOT / "examples" / "demo.yaml")), "/j")
    assert "--job-name=router " in het["steps/router.sh"][0]  # its own het job: as before
    spec = job_spec(p, "/jobs/demo")
    ids = {"router": "41.0", "hpcserve-demo-kimi-k2-router": "41.3",
           "hpcserve-demo-kimi-k2-prefill-0.attempt2": "41.5"}
    assert own_steps(Spec(spec), ids) == {"router": "41.3", "prefill-0.attempt2": "41.5"}
    assert own_steps(Spec({**spec, "in_allocation": False}), ids) == ids


class _Cluster(LocalRunner):
    """A strict stand-in for squeue/scancel only (the rest runs here): squeue --steps answers
    with the allocation's steps in STEPS_FORMAT, scancel is recorded."""

    def __init__(self, steps: str):
        super().__init__()
        self.steps, self.cancelled = steps, []

    def run_once(self, argv, *, check=True, timeout=60.0, env=None):
        if argv[0] == "squeue":
            assert argv[:5] == ["squeue", "-h", "--steps", "-o", STEPS_FORMAT], argv
            return Result(tuple(argv), 0, self.steps, "")
        if argv[0] == "scancel":
            assert all("." in a for a in argv[1:]), argv  # steps only, never the allocation
            self.cancelled.append(argv[1:])
            return Result(tuple(argv), 0, "", "")
        return super().run_once(argv, check=check, timeout=timeout, env=env)


def test_a_cancel_without_its_driver_ends_only_the_deployments_steps_and_its_file_sd(tmp_path):
    spec = {**job_spec(_demo_in_allocation(), str(tmp_path)), "file_sd_dir": str(tmp_path / "sd")}
    (tmp_path / "plan.json").write_text(json.dumps(spec))
    (tmp_path / "state.json").write_text(json.dumps({"phase": "serving"}))
    (tmp_path / "run").mkdir()
    # a driver recorded on this host that is gone (no such start time)
    (tmp_path / "run" / "driver.json").write_text(json.dumps(
        {"pid": os.getpid(), "start": "0", "host": socket.gethostname(), "allocation": "41"}))
    (tmp_path / "sd").mkdir()
    sd = tmp_path / "sd" / file_sd.file_name(spec["name"], "c1", "41")
    other = tmp_path / "sd" / file_sd.file_name("other", "c1", "41")
    sd.write_text("[]")
    other.write_text("[]")
    runner = _Cluster("41.0|1|n1|1:00|router\n41.1|1|n1|1:00|prefill-0\n"
                      "41.3|1|n1|1:00|hpcserve-demo-kimi-k2-router\n"
                      "41.5|2|n1,n2|1:00|hpcserve-demo-kimi-k2-prefill-0.attempt2\n"
                      "41.6|1|n3|1:00|hpcserve-other-router\n")
    entry = SimpleNamespace(job_dir=str(tmp_path), allocation="41", cluster="c1", handle="41")
    said = []
    assert ia.cancel(entry, runner, wait=False, echo=said.append) == 0
    assert runner.cancelled == [["41.3", "41.5"]]  # not the user's router or prefill-0
    assert not sd.exists() and other.exists()
    assert "41.3 41.5; the allocation goes on" in said[-1]


def test_foreground_waits_for_the_driver_and_asks_it_to_stop_on_an_interrupt(tmp_path):
    """An interrupt to `submit --in-allocation --foreground` reaches the driver as SIGUSR1 (its
    orderly teardown), and the command ends with the driver's exit code."""
    ready = tmp_path / "ready"
    p = subprocess.Popen(["bash", "-c", f"trap 'exit 3' USR1; touch {ready}; "
                                        "while :; do sleep 0.05; done"],
                         start_new_session=True)

    def interrupt():
        end = time.time() + 10
        while not ready.exists():
            assert time.time() < end, "the stand-in driver did not start"
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # handled: no KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT)   # SIG_IGN where the tests run in the background
    assert ia.run_in_place(p, interrupt) == 3
    assert signal.getsignal(signal.SIGINT) is before  # given back


def test_foreground_without_in_allocation_is_refused_before_anything_runs():
    from click.testing import CliRunner

    from hpcserve.cli import main
    r = CliRunner().invoke(main, ["submit", "--foreground", str(ROOT / "examples" / "demo.yaml")])
    assert r.exit_code == 2 and "--foreground goes with --in-allocation" in r.output, r.output
