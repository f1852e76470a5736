"""`renew:` on the render side and the command line: the block's bad input (one line, exit 2),
the instance job rendered as a pair of directories that name each other, with ports clear of
each other and Slurm's warning signal asked for at the margin, and status and cancel finding the
successor a job submitted from inside (no index holds it). Slurm is test_scale's strict
stand-in; the job directories are real renders."""

from __future__ import annotations

import json
import signal
import subprocess

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from hpcserve.author import config
from hpcserve.operate import ops
from hpcserve.cli import main
from hpcserve.author.plan_json import SCHEMA
from test_scale import DEMO, NOW, Cluster, front, one_error, state  # noqa: F401 - fixture

RENEW = {"margin": "40s", "time_limit": "00:01:00"}


@pytest.mark.parametrize("block, words", [
    ({"margin": "15m", "every": 1}, "renew.every: unknown key 'every'; valid keys here: margin, "
                                    "time_limit"),
    ({"margin": "40x"}, "renew.margin: expected seconds, or a duration such as 90s, 15m, 1h or "
                        "00:15:00, got '40x'"),
    ({"margin": "19h", "time_limit": "1-00:00:00"},
     "renew.margin: 19h is more than 65535 s, the most sbatch --signal takes (Slurm's warning "
     "signal is sent margin before the limit)"),
    ({"margin": "2m", "time_limit": "00:01:00"},
     "renew.margin: 2m is not shorter than the instance jobs' time limit 00:01:00: every job "
     "would renew as soon as it serves"),
])
def test_a_bad_renew_block_is_one_line_naming_file_line_and_field(tmp_path, block, words):
    doc = yaml.safe_load(DEMO.read_text())
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump({**doc, "renew": block}, sort_keys=False))
    line = next(i for i, ln in enumerate(f.read_text().splitlines(), 1)
                if ln.startswith("renew:"))
    r = CliRunner().invoke(main, ["plan", str(f)])
    said = one_error(r)
    assert said.startswith(f"{f}:") and said.endswith(words), said
    assert line <= int(said.split(":")[1]) <= line + 2, said  # the block or its key


def test_margin_cool_down_and_time_limit_read_as_seconds():
    """One reading of every duration field: a number, a number with a unit, a Slurm time."""
    assert [config.duration_s(t) for t in ("90s", "15m", "1h", "00:15:00", "1-00:00:01", "900",
                                           "1.5m", "0.5s", 30, 2.5)] == \
        [90, 900, 3600, 900, 86401, 900, 90, 0.5, 30, 2.5]


@pytest.fixture
def renewing(front):  # noqa: F811 - test_scale's fixture, extended
    """test_scale's front whose deployment.yaml sets renew:, and its cluster."""
    e, cluster, jd = front
    src = jd / config.SOURCE_FILE
    doc = yaml.safe_load(src.read_text())
    src.write_text(config.source_text({**doc, "renew": RENEW}))
    return e, cluster, jd


def test_add_renders_the_pair_each_naming_its_twin_and_submits_the_first(renewing):
    e, cluster, jd = renewing
    r = CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "1"])
    assert r.exit_code == 0, r.output
    a, b = jd / "scale" / "decode-1", jd / "scale" / "decode-1b"
    assert cluster.called("sbatch") == [["sbatch", "--parsable", str(a / "job.sbatch")]]
    specs = [json.loads((d / "plan.json").read_text()) for d in (a, b)]
    for s in specs:
        jsonschema.validate(s, SCHEMA)
    assert [s["renew"] for s in specs] == [{"twin_dir": str(b), "margin_s": 40},
                                           {"twin_dir": str(a), "margin_s": 40}]
    assert specs[0]["name"] == specs[1]["name"] == "demo-kimi-k2-decode-1"  # one index name
    # both may run on one node while they overlap, beside the front's engines
    front_ports = ops.spec_ports(json.loads((jd / "plan.json").read_text()))
    pa, pb = (ops.spec_ports(s) for s in specs)
    assert not pa & pb and not (pa | pb) & front_ports
    for d in (a, b):
        sb = (d / "job.sbatch").read_text()
        assert "#SBATCH --signal=B:23@40\n" in sb and "#SBATCH --time=00:01:00\n" in sb, sb
        assert "B:TERM@" not in sb
    # the next instance job keeps clear of the twin too, which the index does not hold
    cluster.jobs["77"] = ("demo-kimi-k2-decode-1", "RUNNING")
    assert CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "1"]
                              ).exit_code == 0
    nxt = ops.spec_ports(json.loads((jd / "scale" / "decode-2" / "plan.json").read_text()))
    assert not nxt & (pa | pb)


def test_an_instance_job_without_renew_is_one_directory_with_renew_null(front):  # noqa: F811
    e, cluster, jd = front
    assert CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "1"]
                              ).exit_code == 0
    assert sorted(p.name for p in (jd / "scale").iterdir()) == ["decode-1"]
    assert json.loads((jd / "scale" / "decode-1" / "plan.json").read_text())["renew"] is None


@pytest.fixture
def renewed(renewing):
    """Job 77 ran decode-1 and renewed into decode-1b as job 78 (which has not written its
    state.json yet): only 77 is in the index."""
    e, cluster, jd = renewing
    assert CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "1"]
                              ).exit_code == 0
    a, b = jd / "scale" / "decode-1", jd / "scale" / "decode-1b"
    st = {**state("done", {"decode-0": "removed"}), "job_id": "77", "reason": "renewed by job 78",
          "renew": {"twin_dir": str(b), "end_at": NOW + 60, "successor_job_id": "78",
                    "submitted_at": NOW + 20, "trigger": "40 s before the time limit",
                    "renewed_at": NOW + 22}}
    (a / "state.json").write_text(json.dumps(st))
    cluster.jobs["78"] = ("demo-kimi-k2-decode-1", "RUNNING")
    return cluster, a, b


def test_status_lists_the_successor_under_its_front(renewed):
    cluster, a, b = renewed
    r = CliRunner().invoke(main, ["status", "42", "--json"])
    assert r.exit_code == 0, r.output
    got = [(v["job_id"], v["job_dir"]) for v in json.loads(r.output)]
    assert ("78", str(b)) in got and ("77", str(a)) in got, got


def test_cancel_of_the_front_stops_the_successor(renewed):
    cluster, a, b = renewed
    assert CliRunner().invoke(main, ["cancel", "42"]).exit_code == 0
    assert cluster.called("scancel") == [["scancel", "--batch", "--signal=USR1", "42"],
                                         ["scancel", "--batch", "--signal=USR1", "78"]]


def test_cancel_of_a_renewing_instance_job_named_stops_the_job_its_pair_runs_now(renewed):
    cluster, a, b = renewed
    assert CliRunner().invoke(main, ["cancel", "77"]).exit_code == 0  # the index's, ended
    assert cluster.called("scancel") == [["scancel", "--batch", "--signal=USR1", "78"]]


# What the runtime stub reports once job.sbatch execs it: the variable, and whether SIGURG
# (signal 23, bit 22 of /proc's SigIgn mask) is ignored in it.
_RUNTIME_STUB = """#!/bin/bash
if [ "$1" = -c ]; then kill -URG "$PPID"; exit 0; fi
echo "signalled=${HPCSERVE_RENEW_SIGNALLED-unset}"
echo "urg_ignored=$(( (16#$(awk '/^SigIgn/ {print $2}' /proc/self/status) >> 22) & 1 ))"
"""


def test_slurms_warning_signal_as_the_batch_script_starts_is_kept_for_the_runtime(
        renewing, tmp_path):
    """Slurm may send --signal's SIGURG up to 60 s early (sbatch(1)): with a short limit, as the
    batch script starts, before the runtime's handler exists. Sent here while job.sbatch checks
    its Python (the stub python3 signals its parent then), it must not end the script, and the
    runtime must start with it recorded and SIGURG ignored until its own handler takes over."""
    e, cluster, jd = renewing
    assert CliRunner().invoke(main, ["scale", "42", "--role", "decode", "--add", "1"]
                              ).exit_code == 0
    a = jd / "scale" / "decode-1"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "python3"
    stub.write_text(_RUNTIME_STUB)
    stub.chmod(0o700)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run(["bash", str(a / "job.sbatch")], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.split() == ["signalled=1", "urg_ignored=1"], r.stdout
    # without the signal: nothing recorded
    stub.write_text(_RUNTIME_STUB.replace('kill -URG "$PPID"; ', ""))
    r = subprocess.run(["bash", str(a / "job.sbatch")], env=env, capture_output=True, text=True,
                       timeout=30)
    assert r.stdout.split() == ["signalled=", "urg_ignored=1"], (r.stdout, r.stderr)


def test_the_runtime_takes_a_warning_signal_that_came_before_its_handler(monkeypatch):
    """runtime/renew.py: HPCSERVE_RENEW_SIGNALLED=1 from job.sbatch counts as the signal."""
    from hpcserve.runtime.renew import Renewal
    from hpcserve.runtime.spec import Spec

    class Job:
        plan = Spec({"renew": {"twin_dir": "/x", "margin_s": 40}, "signal_grace": 5})

    old = signal.getsignal(signal.SIGURG)
    try:
        for value, signalled in (("1", True), ("", False)):
            monkeypatch.setenv("HPCSERVE_RENEW_SIGNALLED", value)
            assert Renewal(Job()).signalled is signalled
    finally:
        signal.signal(signal.SIGURG, old)


def test_the_renewal_signal_ends_no_process_that_has_no_handler_yet():
    """What Slurm sends early can come before any handler (sbatch(1): up to 60 s early): its
    default action must be to ignore it, and sbatch's number must be that signal here."""
    from hpcserve.runtime.contract import RENEW_SIGNAL, RENEW_SIGNAL_NUMBER
    assert signal.Signals[f"SIG{RENEW_SIGNAL}"] == RENEW_SIGNAL_NUMBER
    r = subprocess.run(["bash", "-c", f"kill -{RENEW_SIGNAL} $$; echo alive"],
                       capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, "alive\n"), r
