"""Slurm's commands are asked again while the controller is busy or restarting, a bounded number
of times, and a controller that stays unreachable is reported as such: one line naming the
command and Slurm's words, exit code 2, never an unknown job or an ended deployment."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcserve.operate import deployments, ops
from hpcserve.cli import main
from hpcserve.runtime.slurm_controller import (RETRY_DELAYS_S, RETRY_WINDOW_S,
                                               controller_unreachable, not_configured, retry_delay)
from hpcserve.runtime.slurm_queue import squeue_argv
from hpcserve.slurm.runner import CommandError, Result, Runner, SlurmUnreachable

# What Debian's Slurm 22.05.8 printed on the test cluster with slurmctld stopped (SIGTERM) and
# stopped with SIGSTOP (a controller that accepts the connection and never answers).
OUTAGE = [
    "slurm_load_jobs error: Unable to contact slurm controller (connect failure)",
    "slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)",
    "slurm_load_partitions: Unable to contact slurm controller (connect failure)",
    "scancel: error: Kill job error on job id 99: Unable to contact slurm controller (connect "
    "failure)",
    "slurm_load_jobs error: Socket timed out on send/recv operation",
    # from src/common/slurm_errno.c: a connection closed mid-request, a backup in standby
    "slurm_load_jobs error: Zero Bytes were transmitted or received",
    "slurm_load_jobs error: Slurm backup controller in standby mode",
    "slurm_load_jobs error: Controller is in standby mode, try a different controller",
    "slurm_load_jobs error: Unable to contact slurm controller (receive failure)",
]
# Answers the controller gave: not an outage.
ANSWERS = [
    "scancel: error: Kill job error on job id 2: Invalid job id specified",
    "slurm_load_jobs error: Invalid job id specified",
    "scancel: error: Kill job error on job id 7: Job/step already completing or completed",
    "Slurm accounting storage is disabled",
    "sbatch: error: Batch job submission failed: Requested node configuration is not available",
    "",
]
SQUEUE_LINE = "5|5|RUNNING|None|node1|1|local|root|0:05|10:00|9:55|N/A|N/A|N/A|dep\n"


@pytest.mark.parametrize("text", OUTAGE)
def test_each_outage_message_reads_as_unreachable(text):
    assert controller_unreachable(text)


@pytest.mark.parametrize("text", ANSWERS)
def test_the_controller_s_own_answers_are_not_an_outage(text):
    assert not controller_unreachable(text)


def test_the_schedule_gives_up_after_five_tries_or_thirty_seconds():
    # instant failures: every wait of the schedule, then no more
    waits = [retry_delay(n, sum(RETRY_DELAYS_S[:n - 1])) for n in range(1, 6)]
    assert waits == [*RETRY_DELAYS_S, None]
    assert sum(RETRY_DELAYS_S) <= RETRY_WINDOW_S
    # a try that starts later than the window after the first one does not start
    assert retry_delay(3, 25.0) is None


class ScriptedRunner(Runner):
    """Answers each command with the next of `script` (rc, stderr, stdout); records each try,
    and the waits in between on a clock of its own (each try takes `try_s` seconds)."""

    def __init__(self, script, try_s: float = 0.0):
        self.script, self.try_s = list(script), try_s
        self.tries: list[list[str]] = []
        self.slept: list[float] = []
        self.now = 0.0
        self.sleep = self._sleep
        self.clock = lambda: self.now

    def _sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def run_once(self, argv, *, check=True, timeout=60.0, env=None):
        self.tries.append(list(argv))
        self.now += self.try_s
        rc, err, out = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        res = Result(tuple(argv), rc, out, err)
        if check and rc:
            raise CommandError(res)
        return res

    def read_text(self, path):
        return None


@pytest.mark.parametrize("fails", [1, 4])
@pytest.mark.parametrize("text", OUTAGE)
def test_a_query_the_controller_answers_after_n_failures_succeeds(text, fails):
    r = ScriptedRunner([(1, text + "\n", "")] * fails + [(0, "", SQUEUE_LINE)])
    res = r.run(squeue_argv())
    assert res.out == SQUEUE_LINE
    assert len(r.tries) == fails + 1
    assert r.slept == list(RETRY_DELAYS_S[:fails])


def test_status_rides_out_a_restart():
    r = ScriptedRunner([(1, OUTAGE[0], "")] * 2 + [(0, "", SQUEUE_LINE)])
    (v,) = ops.status([deployments.Entry("5", "dep", "/jobs/dep", None)], lambda _r: r)
    assert v.slurm_state == "RUNNING"


def test_a_controller_that_never_answers_is_one_line_naming_the_command():
    r = ScriptedRunner([(1, OUTAGE[0] + "\n", "")])
    with pytest.raises(SlurmUnreachable) as e:
        r.run(squeue_argv())
    assert str(e.value) == (
        "Slurm controller unreachable: squeue --me -h -t all -o ...: slurm_load_jobs error: "
        "Unable to contact slurm controller (connect failure) (5 tries in 26 s)")
    assert len(r.tries) == 5 and r.slept == list(RETRY_DELAYS_S)


def test_slow_failures_stop_at_the_window():
    # As on the test cluster: each refused try takes the client ~9 s (MessageTimeout)
    r = ScriptedRunner([(1, OUTAGE[0], "")], try_s=9.0)
    with pytest.raises(SlurmUnreachable) as e:
        r.run(squeue_argv())
    assert len(r.tries) == 3 and str(e.value).endswith("(3 tries in 33 s)")


def test_unchecked_queries_do_not_read_an_outage_as_an_answer():
    # resolve() asks scontrol without check: an outage is not "Slurm does not know it"
    r = ScriptedRunner([(1, OUTAGE[0], "")])
    with pytest.raises(SlurmUnreachable) as e:
        ops.resolve("12345", None, r)
    assert "scontrol show job -o 12345" in str(e.value)
    assert "does not know" not in str(e.value)


def test_other_failures_are_not_retried():
    r = ScriptedRunner([(1, ANSWERS[0], "")])
    with pytest.raises(CommandError):
        r.run(["scancel", "2"])
    assert len(r.tries) == 1
    r = ScriptedRunner([(7, OUTAGE[0], "")])  # not a Slurm command: its words mean nothing here
    assert r.run(["curl", "-s", "http://x"], check=False).rc == 7
    assert len(r.tries) == 1


def test_a_submission_that_may_have_reached_the_controller_is_not_sent_again():
    text = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"
    r = ScriptedRunner([(1, text, ""), (0, "", "6\n")])
    with pytest.raises(SlurmUnreachable) as e:
        r.run(["sbatch", "--parsable", "/jobs/dep/job.sbatch"])
    assert len(r.tries) == 1
    assert "(1 try in 0 s); not sent again: the job may have been submitted" in str(e.value)
    assert "\n" not in str(e.value)
    # ...one that never reached it is, and so is a --test-only, which submits nothing
    refused = "sbatch: error: Batch job submission failed: " + OUTAGE[0].split(": ", 1)[1]
    r = ScriptedRunner([(1, refused, ""), (0, "", "6\n")])
    assert r.run(["sbatch", "--parsable", "/jobs/dep/job.sbatch"]).out == "6\n"
    r = ScriptedRunner([(1, "allocation failure: " + text.rsplit(": ", 1)[1], ""), (0, "", "ok")])
    assert r.run(["sbatch", "--test-only", "/jobs/dep/job.sbatch"]).out == "ok"
    assert len(r.tries) == 2


# ------------------------------------------------------------- through the command line

def _stub(bindir: Path, name: str, body: str) -> None:
    p = bindir / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def one_deployment(tmp_path, monkeypatch):
    """A deployment in the index whose state.json says serving; Slurm's commands on PATH are
    stubs in tmp_path/bin; waits between tries recorded, not slept."""
    monkeypatch.setenv("HPCSERVE_STATE_DIR", str(tmp_path / "state"))
    job_dir = tmp_path / "dep-20260101-000000"
    job_dir.mkdir()
    (job_dir / "state.json").write_text(json.dumps(
        {"phase": "serving", "endpoint": "http://10.0.0.1:8000", "history": []}))
    deployments.record(deployments.Entry("5", "dep", str(job_dir), None, 1.0, None))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    slept: list[float] = []
    monkeypatch.setattr(Runner, "sleep", staticmethod(slept.append))
    return bindir, slept


def test_status_with_an_unreachable_controller_exits_2_with_one_line(one_deployment):
    bindir, slept = one_deployment
    _stub(bindir, "squeue", f"echo '{OUTAGE[0]}' >&2; exit 1\n")
    r = CliRunner().invoke(main, ["status", "5"])
    assert r.exit_code == 2, r.output
    assert r.stderr == ("hpcserve: error: Slurm controller unreachable: squeue --me -h -t all "
                        f"-o ...: {OUTAGE[0]} (5 tries in 0 s)\n")
    assert r.stdout == "" and "ended" not in r.output
    assert slept == list(RETRY_DELAYS_S)


def test_status_after_two_refusals_shows_the_deployment_serving(one_deployment, tmp_path):
    bindir, slept = one_deployment
    count = tmp_path / "tries"
    _stub(bindir, "squeue", f"echo x >> {count}\n"
                            f"if [ $(wc -l < {count}) -le 2 ]; then echo '{OUTAGE[4]}' >&2; "
                            f"exit 1; fi\nprintf '{SQUEUE_LINE}'\n")
    r = CliRunner().invoke(main, ["status", "5"])
    assert r.exit_code == 0, r.output
    assert "serving at http://10.0.0.1:8000" in r.stdout
    assert slept == list(RETRY_DELAYS_S[:2])


# What Debian's Slurm 22.05.8 client prints on a machine with no slurm.conf and no configless
# DNS record (this project's development machines before the test cluster is up).
NO_CONFIG = ("squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
             "squeue: error: fetch_config: DNS SRV lookup failed\n"
             "squeue: error: _establish_config_source: failed to fetch config\n"
             "squeue: fatal: Could not establish a configuration source\n")


def test_a_client_that_knows_no_cluster_is_one_line_at_once_not_an_unknown_job(one_deployment):
    bindir, slept = one_deployment
    for tool in ("squeue", "scontrol"):
        _stub(bindir, tool, f"printf '%s' '{NO_CONFIG.replace('squeue', tool)}' >&2; exit 1\n")
    for argv, cmd in ((["status"], "squeue --me -h -t all -o ..."),
                      (["status", "12345"], "scontrol show job -o 12345")):
        r = CliRunner().invoke(main, argv)
        assert r.exit_code == 2, r.output
        tool = cmd.split()[0]
        assert r.stderr == (
            f"hpcserve: error: Slurm's commands here know no cluster: {cmd} says '{tool}: fatal: "
            "Could not establish a configuration source' (no slurm.conf, no configless DNS "
            "record): run hpcserve on a login node, set SLURM_CONF, or give --remote USER@LOGIN "
            "before the command\n")
        assert "does not know" not in r.output and "%i|" not in r.output
    assert slept == []  # asking again cannot help: no retries
    assert not controller_unreachable(NO_CONFIG) and not_configured(NO_CONFIG)
