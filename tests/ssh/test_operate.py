"""Operating a deployment the way users do, through the `hpcserve` command, on the real test
cluster: submit -> follow -> status -> logs -> cancel, from the login node (local runner) and from
a laptop over SSH (a real sshd on loopback), with simulated engines and the real router."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sshkit import start_sshd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "adversary"))
from adversarykit import OTHER, others_job  # noqa: E402
from jobkit import OWNER, hand_over, owners_env, owners_jobs  # noqa: E402  (adversarykit's path)

pytestmark = pytest.mark.slurm

HPCSERVE = str(Path(sys.executable).parent / "hpcserve")   # this machine's, over SSH


@pytest.fixture(scope="module")
def login_sshd(tmp_path_factory, ssh_keys, dev_cluster):
    # The "login node": an sshd whose sessions see the test cluster's slurm.conf, as a real login
    # node's sessions see the site's; it lets the jobs' user in (who reads authorized_keys).
    d = tmp_path_factory.mktemp("login")
    hand_over(d)
    s = start_sshd(d, "login", ssh_keys,
                   f"SetEnv SLURM_CONF={dev_cluster.conf_path}\nAllowTcpForwarding no",
                   user=OWNER)
    yield s
    from sshkit import stop
    stop(s.proc)


@pytest.fixture(params=["local", "ssh"])
def hs(request, dev_cluster, tmp_path, owners_hpcserve, site_python):
    """`hpcserve ARGS` as the jobs' user: on the login node, or from this machine over SSH to
    their account there."""
    env = owners_env(dev_cluster, tmp_path, site_python)
    hand_over(tmp_path)
    cli, remote = owners_hpcserve, []
    if request.param == "ssh":
        cli = [HPCSERVE]
        s = request.getfixturevalue("login_sshd")
        env.pop("SLURM_CONF")  # over SSH, only the login node knows the cluster
        remote = ["--remote", s.target, "-i", str(s.user_key), "--known-hosts", str(s.known_hosts)]

    def run(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        # the SSH options are the group's: before the command
        cmd = [*cli, *(remote if args[0] in ("submit", "status", "logs", "cancel", "list")
                       else []), *args]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                           cwd=tmp_path)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} -> {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    run.mode = request.param
    run.jobs_dir = str(owners_jobs(dev_cluster) / f"ops-{request.param}")
    run.python = f"{site_python}/bin/python3"
    yield run
    for e in json.loads(run("status", "--json", check=False).stdout or "[]"):
        subprocess.run(["scancel", e["job_id"]], env=dev_cluster.client_env(), capture_output=True)


def _deployment(tmp_path: Path, jobs_dir: str, python: str, **roles_over) -> Path:
    d = {"name": "ops-demo", "site": {"base": "local"}, "jobs_dir": jobs_dir,
         "model": {"profile": "kimi-k2-instruct", "path": "/models/k2", "served_name": "kimi-k2"},
         "engine": {"version": "0.5.23", "simulate": True},
         # the router's python must have sglang_router: the site's
         "router": {"python": python},
         "roles": {"prefill": {"nodes": 1}, "decode": {"nodes": 2, **roles_over}},
         "readiness": {"engine_timeout": 60, "poll_interval": 0.1}}
    f = tmp_path / "deploy.yaml"
    f.write_text(yaml.safe_dump(d))
    hand_over(tmp_path)
    return f


def test_submit_follow_status_logs_cancel(hs, tmp_path, dev_cluster):
    f = _deployment(tmp_path, hs.jobs_dir, hs.python)
    # --check asks Slurm whether and where it would run, without submitting
    check = hs("submit", str(f), "--check", "--out",
               f"{hs.jobs_dir}-check-{time.time_ns()}").stdout
    assert "to start at" in check and "processors on node" in check, check
    out = hs("submit", str(f), "--follow").stdout
    job = out.split("submitted job ")[1].split(":")[0]
    phases = [ln.split("] ", 1)[1] for ln in out.splitlines() if ln.startswith("[")]
    endpoint = f"http://{dev_cluster.node_addresses()['node1']}:8000"
    assert phases[-1] == f"serving at {endpoint}", out
    # each printed phase is a known one, in the lifecycle's order (polling may skip some)
    order = ["pending", "starting", "engines ready", "router ready", "serving"]
    idx = [next(i for i, o in enumerate(order) if p.startswith(o)) for p in phases]
    assert idx == sorted(idx), out

    st = json.loads(hs("status", job, "--json").stdout)[0]
    assert (st["job_id"], st["slurm_state"], st["phase"], st["endpoint"]) == (
        job, "RUNNING", "serving", endpoint)
    assert len(st["components"]) == 2  # the het job folded into one deployment
    table = hs("status").stdout
    assert f"serving at {endpoint}" in table and job in table
    assert job in hs("list").stdout

    log = hs("logs", job, "--role", "decode", "--node", "1").stdout
    assert "decode-0 node-rank 1 on node3" in log
    assert "joined" in log  # rank 1's own engine log, not another node's

    out = hs("cancel", job, "--wait").stdout
    assert "orderly teardown" in out and out.strip().endswith("cancelled")
    st = json.loads(hs("status", job, "--json").stdout)[0]
    assert st["phase"] == "cancelled"
    history = [h["phase"] for h in st["history"]]
    assert history[-2:] == ["stopping", "cancelled"]
    joblog = Path(st["job_dir"], "logs", "hpcserve-job.log").read_text()
    # router first, then the engines
    assert joblog.index("SIGTERM to router") < joblog.index("SIGTERM to prefill-0, decode-0")
    # a restarted instance's logs, named as recovery names attempt 1's: every attempt in order,
    # --attempt picks one (over SFTP as well), --node a rank inside the attempt's names
    again_log = Path(st["job_dir"], "logs", "decode-0.attempt1.node1.node4.log")
    again_log.write_text("attempt 1 of decode-0, node rank 1\n")
    log = hs("logs", job, "--role", "decode", "--node", "1", "--attempt", "1").stdout
    assert log.strip() == "attempt 1 of decode-0, node rank 1", log
    both = hs("logs", job, "--role", "decode", "--node", "1").stdout
    assert both.index("decode-0.node1.node3.log <==") < both.index(f"{again_log} <=="), both
    # a second cancel finds the job ended: it says so, sends nothing, and is not an error
    again = hs("cancel", job).stdout.strip()
    assert again == f"job {job} (ops-demo) had already ended: cancelled; nothing to cancel", again


def test_status_names_the_failed_node(hs, tmp_path, dev_cluster):
    # The rank exits as it starts: the deployment fails before it serves, however fast the rest
    # starts (an exit after a delay raced the router's start: recovery, not failure, once the
    # router came up first).
    f = _deployment(tmp_path, hs.jobs_dir, hs.python,
                    sim_fault={"kind": "exit", "exit_code": 7, "after": 0, "ranks": [1]})
    out = hs("submit", str(f), "--follow", check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    job = out.stdout.split("submitted job ")[1].split(":")[0]
    st = json.loads(hs("status", job, "--json", check=False).stdout)[0]
    assert st["phase"] == "failed"
    f = st["failure"]
    assert (f["role"], f["instance"], f["node"], f["node_rank"], f["exit_code"]) == (
        "decode", 0, "node3", 1, 7)
    out = hs("status", job, check=False).stdout
    line, *detail = out.splitlines()[1:]
    assert "failed" in line and "node node3" in line and "exit code 7" in line
    assert "http://" not in out, out  # the dead endpoint is not offered
    # why: the failed rank's own log, its last lines
    header = f"job {job}: last lines of {st['job_dir']}/logs/decode-0.node1.node3.log:"
    assert header in detail, out
    assert any("fault injection: exiting with code 7" in ln
               for ln in detail[detail.index(header) + 1:]), out
    assert "had already ended: failed" in hs("cancel", job).stdout


def test_unknown_host_key_is_refused_and_nothing_reaches_the_cluster(login_sshd, dev_cluster,
                                                                       tmp_path, site_python):
    env = dev_cluster.client_env()
    env["HPCSERVE_STATE_DIR"] = str(tmp_path / "state")
    jobs = owners_jobs(dev_cluster) / "ops-refused"
    f = _deployment(tmp_path, str(jobs), f"{site_python}/bin/python3")
    before = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], env=env,
                            capture_output=True, text=True).stdout
    for kh, key in ((login_sshd.empty_known_hosts, login_sshd.user_key),
                    (login_sshd.known_hosts, login_sshd.other_key)):
        p = subprocess.run([HPCSERVE, "--remote", login_sshd.target, "-i", str(key),
                            "--known-hosts", str(kh), "submit", str(f)], env=env,
                           capture_output=True, text=True)
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith("hpcserve: error: ssh: ") and "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    assert not jobs.exists()  # nothing uploaded
    after = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], env=env,
                           capture_output=True, text=True).stdout
    # nothing submitted (earlier jobs may age out of squeue meanwhile: only new ids count)
    assert set(after.split()) - set(before.split()) == set()


def test_another_users_job_is_refused_from_the_login_node_and_over_ssh(hs, dev_cluster):
    """A job of hpcserve-b's: `status`, `logs` and `cancel` refuse it, naming its owner and the
    user they act as (over SSH, the account at the login node: Slurm's UserId against `id -un`
    there), exit 2, and the job runs on."""
    env = dev_cluster.client_env()
    with others_job(env) as (jid, theirs):
        me = OWNER   # the jobs' user, here and the one the test sshd logs in as
        for argv in (["status", jid], ["logs", jid], ["cancel", jid]):
            p = hs(*argv, check=False, timeout=60)
            assert (p.returncode, p.stderr.splitlines()[-1]) == (
                2, f"hpcserve: error: job {jid} belongs to {OTHER}, not {me}: hpcserve acts "
                   "on your own jobs only"), (hs.mode, argv, p)
        q = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], env=env,
                           capture_output=True, text=True, timeout=30)
        assert q.stdout.strip() in ("RUNNING", "PENDING"), q
