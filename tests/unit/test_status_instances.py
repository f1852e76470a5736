"""What `hpcserve status` and `hpcserve logs` say about instance recovery: the phases degraded and
recovering, each instance's status line, state.json's instances in --json, and every attempt's
logs. The state.json fixtures are validated against the contract's STATE_SCHEMA, so they have the
shape the runtime writes."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from hpcserve.operate import deployments, ops
from hpcserve.cli import main
from hpcserve.runtime.contract import STATE_SCHEMA
from hpcserve.slurm.runner import LocalRunner, Result

NOW = 1_000_000.0
ENDPOINT = "http://n1:8000"
VALIDATOR = jsonschema.Draft202012Validator(STATE_SCHEMA)


def attempt(name: str, n: int, nodes: list[str], end: str | None = None) -> dict:
    """One start of an instance, with the log names the contract gives attempt n."""
    tag = f".attempt{n}" if n else ""
    return {"attempt": n, "nodes": nodes, "started_at": NOW - 600 + 100 * n,
            "serving_at": None if end is None and n else NOW - 550 + 100 * n,
            "ended_at": NOW - 500 + 100 * n if end else None, "end": end, "failure": None,
            "log": f"logs/{name}{tag}.node0.{nodes[0]}.log",
            "srun_log": f"logs/{name}{tag}.srun.log"}


def instance(name: str, status: str, attempts: list[dict], **over) -> dict:
    role, _, index = name.rpartition("-")
    return {"role": role, "index": int(index), "status": status, "why": None,
            "attempt": attempts[-1]["attempt"], "restarts": len(attempts) - 1,
            "nodes": attempts[-1]["nodes"], "since": NOW - 60, "recover_s": None,
            "next_try_at": None, "attempts": attempts} | over


def state(phase: str, instances: dict, excluded: list[str] = ()) -> dict:
    s = {"phase": phase, "history": [{"phase": "serving", "at": NOW - 500},
                                     {"phase": phase, "at": NOW - 60}],
         "job_id": "42", "updated_at": NOW, "endpoint": ENDPOINT,
         "health_urls": {n: f"http://{i['nodes'][0]}:30000/health"
                         for n, i in instances.items()},
         "instances": instances, "excluded_nodes": list(excluded)}
    VALIDATOR.validate(s)  # the shape the runtime writes, or the test is about nothing
    return s


def serving(name: str, node: str) -> dict:
    return instance(name, "serving", [attempt(name, 0, [node])])


def decode1_restarting() -> dict:
    """decode-1 hung twice: attempt 1 (on n5) ended hung as well, attempt 2 starts on n6."""
    tries = [attempt("decode-1", 0, ["n4"], "hung"), attempt("decode-1", 1, ["n5"], "hung"),
             attempt("decode-1", 2, ["n6"])]
    return instance("decode-1", "restarting", tries, why="hung", recover_s=84.2)


def view(s: dict, slurm: str = "RUNNING") -> ops.View:
    return ops.View("42", "dep", "/jobs/dep", None, slurm_state=slurm, phase=s["phase"],
                    endpoint=s.get("endpoint"), state=s)


# ----------------------------------------------------------------------------- one-line summary

def test_degraded_names_the_instance_out_why_and_its_restart():
    s = state("degraded", {"prefill-0": serving("prefill-0", "n1"),
                           "decode-0": serving("decode-0", "n2"),
                           "decode-1": decode1_restarting()})
    assert ops.describe(view(s)) == (f"degraded at {ENDPOINT} "
                                     "(decode-1 out: hung, restarting as attempt 2)")


def test_recovering_names_an_instance_out_and_one_given_up():
    gone = instance("decode-0", "failed", [attempt("decode-0", 0, ["n2"], "node lost")],
                    why="node lost")
    out = instance("prefill-0", "out", [attempt("prefill-0", 0, ["n1"], "exited with code 137")],
                   why="exited with code 137", next_try_at=NOW + 30)
    s = state("recovering", {"prefill-0": out, "decode-0": gone}, excluded=["n2"])
    assert ops.describe(view(s)) == (f"recovering at {ENDPOINT} (prefill-0 out: exited with "
                                     "code 137; decode-0 failed: node lost)")


def test_many_instances_out_keep_the_summary_to_one_short_line():
    out = {f"decode-{k}": instance(f"decode-{k}", "out",
                                   [attempt(f"decode-{k}", 0, [f"n{k}"], "hung")], why="hung")
           for k in range(5)}
    line = ops.describe(view(state("degraded", out)))
    assert line == f"degraded at {ENDPOINT} (decode-0 out: hung; decode-1 out: hung; 3 more " \
                   "not serving)"


def test_every_instance_serving_adds_nothing_to_serving():
    s = state("serving", {"decode-0": serving("decode-0", "n2")})
    assert ops.describe(view(s)) == f"serving at {ENDPOINT}"


# ------------------------------------------------------------------------------ instance lines

def test_one_line_per_instance_with_status_restarts_recovery_time_and_nodes():
    out = instance("prefill-0", "out", [attempt("prefill-0", 0, ["n1"], "exited with code 137")],
                   why="exited with code 137", next_try_at=NOW + 30)
    gone = instance("decode-2", "failed", [attempt("decode-2", 0, ["n7"], "node lost")],
                    why="node lost")
    back = instance("decode-0", "serving", [attempt("decode-0", 0, ["n2"], "hung"),
                                            attempt("decode-0", 1, ["n3", "n8"])],
                    recover_s=7.25)
    s = state("recovering", {"prefill-0": out, "decode-0": back, "decode-1": decode1_restarting(),
                             "decode-2": gone}, excluded=["n7", "n4"])
    lines = ops.instance_lines(view(s), now=NOW)
    assert [ln.split() for ln in lines] == [
        ["INSTANCE", "STATUS", "RESTARTS", "LAST", "RECOVERY", "NODES"],
        ["prefill-0", "out", "(exited", "with", "code", "137;", "next", "try", "in", "30", "s)",
         "0", "-", "n1"],
        ["decode-0", "serving", "1", "7.2", "s", "n3,n8"],
        ["decode-1", "restarting", "(attempt", "2)", "2", "84", "s", "n6"],
        ["decode-2", "failed", "(node", "lost)", "0", "-", "n7"],
        ["excluded", "nodes:", "n7,n4"]]
    # a column each: the restarts of every row start where RESTARTS does
    col = lines[0].index("RESTARTS")
    assert [ln[col] for ln in lines[1:5]] == ["0", "1", "2", "0"]


def test_status_table_puts_each_job_s_instances_under_its_row_and_list_does_not():
    s = state("degraded", {"decode-0": serving("decode-0", "n2"),
                           "decode-1": decode1_restarting()})
    done = view(state("serving", {"decode-0": serving("decode-0", "n9")}), slurm=None)
    table = ops.status_table([view(s), done], instances=True).splitlines()
    assert table[1].startswith("42") and "degraded at" in table[1]
    assert table[2].split()[0] == "INSTANCE" and table[4].split()[:3] == [
        "decode-1", "restarting", "(attempt"]
    # the job Slurm no longer lists: its record says what was, so no instance lines
    assert len(table) == 6 and "ended (Slurm no longer lists the job)" in table[5]
    assert len(ops.status_table([view(s)]).splitlines()) == 2


def test_a_deployment_that_ended_shows_no_instance_lines():
    s = state("serving", {"decode-0": serving("decode-0", "n2")}) | {"phase": "cancelled"}
    VALIDATOR.validate(s)
    assert ops.instance_lines(view(s)) == []


# ------------------------------------------------------------------------- status through Slurm

class Cluster(LocalRunner):
    """squeue lists job 42 running; curl answers every health URL with 200 (and records that it
    was asked); files are read from this machine."""

    def __init__(self):
        super().__init__()
        self.asked: list[list[str]] = []

    def run_once(self, argv, *, check=True, timeout=60.0, env=None):
        self.asked.append(list(argv))
        if argv[0] == "squeue":
            out = "42|42|RUNNING|None|n[1-6]|6|gpu|me|0:05|10:00|9:55|N/A|N/A|N/A|dep\n"
        elif argv[0] == "curl":
            out = "200\n" * sum(a == "/dev/null" for a in argv)
        else:
            return Result(tuple(argv), 1, "", "")
        return Result(tuple(argv), 0, out, "")


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A recorded deployment whose job directory holds a degraded state.json; the commands reach
    the cluster through Cluster."""
    monkeypatch.setenv("HPCSERVE_STATE_DIR", str(tmp_path / "index"))
    jd = tmp_path / "dep-20260101-000000"
    (jd / "logs").mkdir(parents=True)
    s = state("degraded", {"decode-0": serving("decode-0", "n2"),
                           "decode-1": decode1_restarting()}, excluded=["n4"])
    (jd / "state.json").write_text(json.dumps(s))
    e = deployments.Entry("42", "dep", str(jd), None, NOW, None)
    deployments.record(e)
    cluster = Cluster()
    monkeypatch.setattr(ops, "runner_for", lambda remote, **_: cluster)
    return e, cluster, s


def test_status_json_carries_state_json_s_instances_and_excluded_nodes(job):
    e, _, s = job
    r = CliRunner().invoke(main, ["status", "42", "--json"])
    assert r.exit_code == 0, r.output
    (got,) = json.loads(r.output)
    assert got["phase"] == "degraded"
    assert got["instances"] == s["instances"] and got["excluded_nodes"] == ["n4"]


def test_status_json_of_a_job_without_recovery_has_empty_instances():
    v = view({"phase": "serving", "history": [], "updated_at": NOW, "endpoint": ENDPOINT})
    assert (v.as_json()["instances"], v.as_json()["excluded_nodes"]) == ({}, [])


def test_status_shows_the_instance_lines_and_a_degraded_job_is_not_a_failure(job):
    r = CliRunner().invoke(main, ["status", "42"])
    assert r.exit_code == 0, r.output  # degraded still serves: not the exit 1 of a failed job
    lines = r.output.splitlines()
    assert "degraded at http://n1:8000 (decode-1 out: hung, restarting as attempt 2)" in lines[1]
    assert [ln.split()[:2] for ln in lines[3:5]] == [["decode-0", "serving"],
                                                     ["decode-1", "restarting"]]
    assert lines[5].split() == ["excluded", "nodes:", "n4"]


def test_probe_asks_a_degraded_deployment_s_health(job):
    e, cluster, _ = job
    (v,) = ops.status([e], lambda _r: cluster, probe=True)
    assert any(a[0] == "curl" for a in cluster.asked), "a degraded endpoint was not probed"
    assert v.health == "router ok, decode-0 ok, decode-1 ok"
    assert ops.describe(v).endswith("(router ok, decode-0 ok, decode-1 ok)")


@pytest.mark.parametrize("phase", ["degraded", "recovering"])
def test_follow_ends_with_success_once_the_deployment_serves_degraded(job, phase, monkeypatch):
    e, cluster, s = job
    Path(e.job_dir, "state.json").write_text(json.dumps(s | {"phase": phase}))
    looks = []

    def status_once(entries, runner_of, probe=False):
        # a second look means follow kept waiting on a deployment whose endpoint answers
        assert not looks, f"follow kept waiting on a {phase} deployment"
        looks.append(1)
        return real(entries, runner_of, probe)

    real = ops.status
    monkeypatch.setattr(ops, "status", status_once)
    lines: list[str] = []
    assert ops.follow(e, cluster, echo=lines.append, quiet=True, interval=0) == 0
    assert lines == [ops.describe(real([e], lambda _r: cluster)[0])]
    assert lines[0].startswith(f"{phase} at {ENDPOINT}")


# ------------------------------------------------------------------------------ attempts' logs

EXTRA_LOGS = [
    "decode-1.attempt1.node1.n9.log",       # attempt 1 ran on two nodes
    "decode-1.attempt10.node0.n7.log",      # attempt 10 sorts after 2 (by name it would not)
    "decode-1.attempt10.srun.log",
    "decode-10.node0.n3.log",               # another instance whose name starts the same
    "decode-0.node0.n2.log", "decode-0.srun.log",
    "prefill-0.node0.n1.task0.log",         # an MPI engine: one log per task
    "prefill-0.attempt1.node0.n1.task0.log", "prefill-0.attempt1.node0.n1.task1.log",
    "router.log", "hpcserve-job.log", "batch-42.out",
]


@pytest.fixture
def logs(job):
    """The job's logs/: every attempt's log and srun log that state.json names, and more."""
    e, _, s = job
    named = [a[k].removeprefix("logs/") for i in s["instances"].values()
             for a in i["attempts"] for k in ("log", "srun_log")]
    for n in set(named + EXTRA_LOGS):
        Path(e.job_dir, "logs", n).write_text(f"a line of {n}\n")
    return e, s


def names(files: list[str]) -> list[str]:
    return [Path(f).name for f in files]


def test_logs_lists_an_instance_s_attempts_in_order(logs, job):
    e, _ = logs
    got = names(ops.log_files(job[1], e, "decode", 1, None))
    assert got == ["decode-1.node0.n4.log", "decode-1.srun.log",
                   "decode-1.attempt1.node0.n5.log", "decode-1.attempt1.node1.n9.log",
                   "decode-1.attempt1.srun.log",
                   "decode-1.attempt2.node0.n6.log", "decode-1.attempt2.srun.log",
                   "decode-1.attempt10.node0.n7.log", "decode-1.attempt10.srun.log"]


def test_attempt_picks_the_logs_state_json_names_for_that_attempt(logs, job):
    e, s = logs
    for a in s["instances"]["decode-1"]["attempts"]:
        got = names(ops.log_files(job[1], e, "decode", 1, None, a["attempt"]))
        want = {Path(a["log"]).name, Path(a["srun_log"]).name}
        assert want <= set(got), (a["attempt"], got)
        assert all((f".attempt{a['attempt']}." in n) == (a["attempt"] > 0) for n in got), got
    assert names(ops.log_files(job[1], e, "prefill", None, None, 1)) == [
        "prefill-0.attempt1.node0.n1.task0.log", "prefill-0.attempt1.node0.n1.task1.log"]


def test_node_picks_a_rank_or_host_in_every_attempt(logs, job):
    e, _ = logs
    assert names(ops.log_files(job[1], e, "decode", None, "1")) == [
        "decode-1.attempt1.node1.n9.log"]
    assert names(ops.log_files(job[1], e, None, None, "n6")) == ["decode-1.attempt2.node0.n6.log"]
    assert names(ops.log_files(job[1], e, "decode", 10, "0")) == ["decode-10.node0.n3.log"]
    # a host name with dots is matched whole or by its first label, as before attempts
    Path(e.job_dir, "logs", "worker-0.attempt1.node2.gpu7.site.org.task1.log").write_text("x")
    for node in ("gpu7", "gpu7.site.org", "2"):
        assert names(ops.log_files(job[1], e, "worker", 0, node)) == [
            "worker-0.attempt1.node2.gpu7.site.org.task1.log"], node


def test_the_job_s_own_logs_are_still_found_by_role(logs, job):
    e, _ = logs
    assert names(ops.log_files(job[1], e, "router", None, None)) == ["router.log"]
    assert names(ops.log_files(job[1], e, "batch", None, None)) == ["batch-42.out"]
    assert names(ops.log_files(job[1], e, "hpcserve-job", None, None)) == ["hpcserve-job.log"]
    every = names(ops.log_files(job[1], e, None, None, None))
    assert len(every) == len(set(EXTRA_LOGS)) + 6  # decode-1's three attempts, two logs each
    firsts = [n.split(".")[0] for n in every]
    assert firsts.index("decode-1") < firsts.index("decode-10")


def test_logs_attempt_prints_that_attempt_s_files(logs):
    r = CliRunner().invoke(main, ["logs", "42", "--role", "decode", "--instance", "1",
                                  "--attempt", "2"])
    assert r.exit_code == 0, r.output
    heads = [ln for ln in r.output.splitlines() if ln.startswith("==> ")]
    assert [Path(h[4:-4]).name for h in heads] == ["decode-1.attempt2.node0.n6.log",
                                                   "decode-1.attempt2.srun.log"]
    assert "a line of decode-1.attempt2.node0.n6.log" in r.output
    assert "attempt1." not in r.output and ".node0.n4." not in r.output


def test_an_attempt_without_logs_is_refused_with_the_attempts_that_have_some(logs):
    r = CliRunner().invoke(main, ["logs", "42", "--role", "decode", "--instance", "1",
                                  "--attempt", "5"])
    assert r.exit_code == 2
    assert "no log of job 42 matches attempt 5 (attempts with logs: 0, 1, 2, 10)" in r.output


def test_follow_goes_on_into_a_new_attempt_s_log_and_says_whose_lines_follow(logs, monkeypatch):
    e, _ = logs
    new = Path(e.job_dir, "logs", "decode-1.attempt11.node0.n8.log")
    naps = []

    def nap(_s):
        # first nap: the runtime restarts decode-1 as attempt 11; second: the user's Ctrl-C
        naps.append(1)
        if len(naps) == 1:
            new.write_text("attempt 11 loading\n")
        else:
            raise SystemExit(0)

    monkeypatch.setattr("time.sleep", nap)
    r = CliRunner().invoke(main, ["logs", "42", "--role", "decode", "--instance", "1",
                                  "--node", "0", "-f"])  # a rank: the same in every attempt
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[-2:] == [f"==> {new} <==", "attempt 11 loading"], r.output
