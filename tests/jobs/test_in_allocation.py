"""`hpcserve submit --in-allocation` inside a real `salloc` on the local cluster: the deployment
serves from steps of THAT allocation (on its nodes), `hpcserve cancel` ends those steps and the
allocation stays RUNNING and usable; an allocation too small is refused before anything starts."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from jobkit import (OWNER, Job, chat, deployment, hand_over, owners_env,
                    python_without_hpcserve, until)

pytestmark = pytest.mark.slurm


@pytest.fixture
def env(dev_cluster, tmp_path, site_python) -> dict:
    """The login shell's environment (jobkit.owners_env)."""
    return owners_env(dev_cluster, tmp_path, site_python)


@pytest.fixture
def hs(owners_hpcserve) -> list[str]:
    """`hpcserve` as the jobs' user runs it in their own shell (salloc's, already theirs)."""
    return owners_hpcserve[owners_hpcserve.index("--") + 1:]


@pytest.fixture
def deploy_file(dev_cluster, tmp_path, site_python) -> Path:
    """The simulated 1P1D deployment (2 nodes), its runtime on a python3 without hpcserve."""
    root = Path(dev_cluster.state_dir).parent
    dep = deployment(name="t-inalloc")
    dep["site"] = {"base": "local", "paths": {
        "python": str(python_without_hpcserve(root, str(site_python / "bin" / "python3")))}}
    f = tmp_path / "t-inalloc.yaml"
    f.write_text(yaml.safe_dump(dep))
    hand_over(tmp_path)
    return f


def _nodes(env: dict) -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return sorted(set(out))


def _salloc(env: dict, nodes: list[str], inner: str, tmp: Path) -> subprocess.Popen:
    """salloc, run by the jobs' user, holding `nodes`, running `inner` in its shell (with every
    SLURM_* variable salloc sets), which writes the allocation's id to tmp/jobid first."""
    script = f"echo $SLURM_JOB_ID > {shlex.quote(str(tmp / 'jobid'))}; {inner}"
    return subprocess.Popen(["runuser", "-u", OWNER, "--", "salloc", "-N", str(len(nodes)),
                             "-w", ",".join(nodes), "-t", "10", "-J", "held", "bash", "-c",
                             script], env=env, cwd=tmp, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _steps(env: dict, job_id: str) -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "--steps", "-j", job_id, "-o", "%i %j"], env=env,
                         capture_output=True, text=True).stdout
    return {ln.split()[1]: ln.split()[0] for ln in out.splitlines() if len(ln.split()) == 2}


def _job_state(env: dict, job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env,
                          capture_output=True, text=True).stdout.strip()


def _end_salloc(salloc: subprocess.Popen, shell: Path, env: dict, alloc: str | None) -> None:
    """The salloc shell's command ends (its sleep, by the PID it wrote): salloc then gives the
    allocation back itself; scancel only where it does not."""
    if shell.exists():
        subprocess.run(["kill", shell.read_text().strip()])
    try:
        salloc.wait(30)
    except subprocess.TimeoutExpired:
        if alloc:
            subprocess.run(["scancel", alloc], env=env, capture_output=True)
        salloc.wait(30)


def _submit_then_hold(hs: list[str], deploy_file: Path, job_dir: Path, done: Path, tmp: Path,
                      *opts) -> str:
    """The salloc shell's command: `hpcserve submit --in-allocation`, its output and exit code
    into `done`, then the shell stays (its PID in tmp/shell: _end_salloc ends it)."""
    argv = [*hs, "submit", "--in-allocation", *opts, str(deploy_file), "--out",
            str(job_dir)]
    return (f"{shlex.join(argv)} > {shlex.quote(str(done))} 2>&1; "
            f"echo rc=$? >> {shlex.quote(str(done))}; "
            f"echo $$ > {shlex.quote(str(tmp / 'shell'))}; exec sleep 600")


def _alive(drv: dict) -> bool:
    """Whether the recorded driver still runs: its PID with its start time, and not a zombie
    (ended, not yet reaped by the process that inherited it)."""
    try:
        fields = Path(f"/proc/{drv['pid']}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == drv["start"] and fields[0] not in ("Z", "X")


def test_serves_in_an_salloc_and_cancel_leaves_it(dev_cluster, env, deploy_file, tmp_path, hs,
                                                   owners_hpcserve):
    held = _nodes(env)[-2:]  # not the first nodes: a het job of its own would start there
    job_dir = tmp_path / "jobs" / "t-inalloc"
    done = tmp_path / "submitted"
    salloc = _salloc(env, held, _submit_then_hold(hs, deploy_file, job_dir, done, tmp_path),
                     tmp_path)
    alloc = None
    try:
        text = until("hpcserve submit's end in the salloc shell",
                     lambda: done.exists() and "rc=" in done.read_text() and done.read_text(),
                     120, 0.1)
        alloc = (tmp_path / "jobid").read_text().strip()
        assert "rc=0" in text and f"in allocation {alloc}" in text, text
        job = Job(dev_cluster, job_dir, alloc, env)
        st = job.wait({"serving", "failed"}, 120)
        assert st["phase"] == "serving", job.logs()
        # served through the router by engines on the allocation's nodes, as its steps
        reply = chat(st["endpoint"], 4, key=job.key)
        assert reply["usage"]["completion_tokens"] == 4
        on = {inst: [r[1] for r in job.node_rows(inst)] for inst in ("prefill-0", "decode-0")}
        assert on == {"prefill-0": [held[0]], "decode-0": [held[1]]}, on
        assert st["router_node"] == held[0]
        steps = _steps(env, alloc)
        assert {"hpcserve-t-inalloc-prefill-0", "hpcserve-t-inalloc-decode-0",
                "hpcserve-t-inalloc-router"} <= set(steps), steps  # apart from the user's own
        assert all(sid.startswith(f"{alloc}.") for sid in steps.values()), steps
        drv = json.loads((job_dir / "run" / "driver.json").read_text())
        assert drv["allocation"] == alloc

        status = subprocess.run([*owners_hpcserve, "status", alloc], env=env, cwd="/",
                                capture_output=True, text=True)
        assert status.returncode == 0 and "alloc RUNNING" in status.stdout and \
            f"serving at {st['endpoint']}" in status.stdout, status.stdout + status.stderr

        r = subprocess.run([*owners_hpcserve, "cancel", alloc, "--wait"], env=env, cwd="/",
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "the allocation goes on" in r.stdout, r.stdout + r.stderr
        assert job.state()["phase"] == "cancelled"
        until("the deployment's steps gone from the allocation",
              lambda: not [n for n in _steps(env, alloc) if n.startswith("hpcserve-")], 30,
              why=lambda: str(_steps(env, alloc)))
        assert not _alive(drv), "the driver outlived its cancel"
        # the allocation is the user's: still running, and a new step runs in it
        assert _job_state(env, alloc) == "RUNNING"
        step = subprocess.run(["runuser", "-u", OWNER, "--", "srun", f"--jobid={alloc}",
                               "--overlap", "-N1", "-w", held[1], "printenv",
                               "SLURMD_NODENAME"], env=env, cwd="/", capture_output=True,
                              text=True, timeout=60)
        assert step.returncode == 0 and step.stdout.strip() == held[1], step.stderr
    finally:
        _end_salloc(salloc, tmp_path / "shell", env, alloc)


def test_foreground_ends_with_the_deployment(dev_cluster, env, deploy_file, tmp_path, hs,
                                             owners_hpcserve):
    """A batch script's last line: `submit --in-allocation --foreground` runs until the
    deployment ends and exits with its end (0: cancelled); the allocation goes on."""
    held = _nodes(env)[-2:]
    job_dir = tmp_path / "jobs" / "t-fg"
    done = tmp_path / "submitted"
    inner = _submit_then_hold(hs, deploy_file, job_dir, done, tmp_path, "--foreground",
                              "--wait")
    salloc = _salloc(env, held, inner, tmp_path)
    alloc = None
    try:
        until("serving, said by submit --wait", lambda: done.exists() and
              "serving at" in done.read_text(), 120, 0.1, why=lambda: done.read_text())
        alloc = (tmp_path / "jobid").read_text().strip()
        assert "rc=" not in done.read_text()  # still in the foreground while it serves
        r = subprocess.run([*owners_hpcserve, "cancel", alloc], env=env, cwd="/",
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        text = until("submit --foreground's end", lambda: "rc=" in done.read_text() and
                     done.read_text(), 120, 0.1, why=lambda: done.read_text())
        assert text.rstrip().endswith("rc=0"), text
        assert json.loads((job_dir / "state.json").read_text())["phase"] == "cancelled"
        assert _job_state(env, alloc) == "RUNNING"
    finally:
        _end_salloc(salloc, tmp_path / "shell", env, alloc)


def test_too_small_an_allocation_is_refused(dev_cluster, env, deploy_file, tmp_path, hs):
    held = _nodes(env)[-1:]
    job_dir = tmp_path / "jobs" / "t-small"
    inner = shlex.join([*hs, "submit", "--in-allocation", str(deploy_file), "--out",
                        str(job_dir)])
    salloc = _salloc(env, held, inner, tmp_path)
    out, err = salloc.communicate(timeout=120)
    alloc = (tmp_path / "jobid").read_text().strip()
    mine = [ln for ln in err.splitlines() if ln.startswith("hpcserve")]
    assert salloc.returncode == 2, err
    assert mine == [f"hpcserve: error: does not fit: the deployment needs 2 node(s) (prefill 1, "
                    f"decode 1) and allocation {alloc} holds 1 ({held[0]})"], err
    assert not job_dir.exists()  # nothing rendered, nothing started
    assert not (tmp_path / "state" / "deployments.jsonl").exists()


def test_preflight_in_an_salloc_checks_its_nodes(dev_cluster, env, deploy_file, tmp_path, hs):
    held = _nodes(env)[-2:]
    inner = shlex.join([*hs, "preflight", "--in-allocation", str(deploy_file)])
    salloc = _salloc(env, held, inner, tmp_path)
    out, err = salloc.communicate(timeout=120)
    assert salloc.returncode == 0, out + err
    assert f"started preflight in allocation {(tmp_path / 'jobid').read_text().strip()}" in err
    rows = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines()[1:] if ln.split()}
    assert set(rows) == set(held), out  # the checks ran on the allocation's nodes
    assert all(r[0] == "ok" for r in rows.values()), out
