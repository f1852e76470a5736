"""Another user of the same machine against a deployment's job directory: hpcserve-b, a real
second Unix user (scripts/setup.sh makes it), on a shared file system (a sticky, world-writable
directory, as /tmp or a site's scratch is). They read, list and write nothing in a job
directory; a path they made first (an empty directory, a link) is refused by name and owner,
with nothing written into it; and a job directory they could write is refused by the job
itself, in bash and in the runtime, before anything runs.

The deployment's side is root here (the dev cluster runs its jobs as root)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from adversarykit import OTHER, as_other, shared  # noqa: F401  (shared: a fixture)

ROOT = Path(__file__).resolve().parents[2]
HPCSERVE = ROOT / ".venv" / "bin" / "hpcserve"
DEMO = ROOT / "examples" / "demo.yaml"


def render(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(HPCSERVE), "render", str(DEMO), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)


def test_another_user_reads_lists_and_writes_nothing_in_a_job_directory(shared):
    # what they can do where nothing stops them: the test's reason is the job's modes
    assert as_other("sh", "-c", f"echo mine > {shared}/theirs && cat {shared}/theirs"
                    ).stdout == "mine\n"
    job = shared / "job"
    assert render(job).returncode == 0
    files = list(job.rglob("*"))
    assert len(files) > 20 and job / "plan.json" in files
    assert job / "secret" / "api-key" in files  # the deployment's key, made with it
    for argv in (["ls", str(job)], ["touch", f"{job}/planted"],
                 ["cat", f"{job}/plan.json"], ["cat", f"{job}/hpcserve_runtime/job.py"],
                 ["cat", f"{job}/secret/api-key"]):
        r = as_other(*argv, check=False)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (argv, r)
    # nothing in it is open to them by its own mode either (were the directory opened)
    loose = [str(p) for p in files if p.lstat().st_mode & 0o077]
    assert loose == [], loose
    assert not (job / "planted").exists()


def test_a_directory_or_link_another_user_made_first_is_refused_by_name_and_owner(shared):
    """Made before the render at the path it would write: an empty directory of theirs, a
    link to one. Refused in one line naming the path and its owner; nothing is written into
    what they made."""
    theirs = shared / "theirs"
    for argv in (["mkdir", "-m", "777", f"{shared}/job"], ["mkdir", "-m", "777", str(theirs)],
                 ["ln", "-s", str(theirs), f"{shared}/job2"]):
        as_other(*argv)
    for name in ("job", "job2"):
        r = render(shared / name)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r
        assert f"{shared / name} exists (owner {OTHER}): a job directory is made new" in \
            r.stderr, r.stderr
    assert os.listdir(shared / "job") == [] and os.listdir(theirs) == []


def test_a_job_directory_another_user_can_write_is_refused_before_anything_runs(shared):
    """A job directory left writable by others (a careless chmod), into which the other user
    put a plan.json of their own: job.sbatch refuses the directory, then, once its mode is
    fixed, their plan.json; the runtime refuses both the same way. Nothing starts."""
    job = shared / "job"
    assert render(job).returncode == 0
    os.chmod(job, 0o777)
    as_other("sh", "-c", f"mv {job}/plan.json {job}/plan.old && echo '{{}}' > {job}/plan.json")

    def batch() -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(job / "job.sbatch")], capture_output=True,
                              text=True, timeout=60, cwd="/", stdin=subprocess.DEVNULL)

    def runtime() -> subprocess.CompletedProcess:
        return subprocess.run(["python3", "-m", "hpcserve_runtime", "run", str(job)],
                              capture_output=True, text=True, timeout=60, cwd=job,
                              stdin=subprocess.DEVNULL)

    for run in (batch, runtime):
        r = run()
        assert r.returncode == 2, (run.__name__, r)
        assert f"{job} is not this user's alone" in r.stderr and "777" in r.stderr, r.stderr
    os.chmod(job, 0o700)
    uid = int(as_other("id", "-u").stdout)
    r = batch()
    assert r.returncode == 2 and f"{job}/plan.json is not this user's alone (owner {OTHER}" \
        in r.stderr, r.stderr
    r = runtime()
    assert r.returncode == 2 and f"{job}/plan.json is not this user's alone (uid {uid}," \
        in r.stderr, r.stderr
    assert not (job / "logs" / "job.log").exists() and os.listdir(job / "run") == []
