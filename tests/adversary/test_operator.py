"""Operator commands against another user's job on the real dev cluster's Slurm: a job that
hpcserve-b (a real second Unix user) runs, with a job directory of the shape hpcserve renders
(logs/batch-<id>.out), is refused by `status`, `logs`, `scale`, `upgrade` and `cancel` in one
line naming its owner, exit 2; the job is left running. Before, its job directory was taken
from Slurm's record: `scale` would have rendered and submitted their deployment file as you."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from adversarykit import OTHER
from hpcserve.devcluster.cluster import DevCluster

ROOT = Path(__file__).resolve().parents[2]
HPCSERVE = ROOT / ".venv" / "bin" / "hpcserve"


def test_another_users_job_is_refused_by_every_operator_command(dev_cluster: DevCluster,
                                                                 tmp_path: Path) -> None:
    env = dev_cluster.client_env()
    theirs = Path(tempfile.mkdtemp(prefix="hpcserve-theirs-", dir="/tmp"))
    (theirs / "logs").mkdir()
    (theirs / "deployment.yaml").write_text("name: theirs\n")
    script = theirs / "job.sbatch"
    script.write_text("#!/bin/sh\nexec sleep 600\n")
    script.chmod(0o755)
    shutil.chown(theirs, OTHER, OTHER)
    shutil.chown(theirs / "logs", OTHER, OTHER)
    r = subprocess.run(["sbatch", "--parsable", f"--uid={OTHER}", f"--gid={OTHER}",
                        "--job-name=theirs", f"--output={theirs}/logs/batch-%j.out",
                        f"--chdir={theirs}", str(script)],
                       env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r
    jid = r.stdout.strip().split(";")[0]
    try:
        q = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%u %T"], env=env,
                           capture_output=True, text=True, timeout=30)
        assert q.stdout.split()[0] == OTHER, q  # Slurm's own record: the job is theirs
        me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        cli_env = {**env, "HPCSERVE_STATE_DIR": str(tmp_path / "state")}
        for argv in (["status", jid], ["logs", jid], ["cancel", jid],
                     ["scale", jid, "--role", "worker", "--add", "1"],
                     ["upgrade", jid, "--set", "engine.version=0.5.23"]):
            p = subprocess.run([str(HPCSERVE), *argv], env=cli_env, capture_output=True,
                               text=True, timeout=60, stdin=subprocess.DEVNULL)
            assert (p.returncode, p.stderr) == (
                2, f"hpcserve: error: job {jid} belongs to {OTHER}, not {me}: hpcserve acts "
                   "on your own jobs only\n"), (argv, p)
        q = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], env=env,
                           capture_output=True, text=True, timeout=30)
        assert q.stdout.strip() in ("RUNNING", "PENDING"), q  # cancel did nothing to it
        assert sorted(os.listdir(theirs)) == ["deployment.yaml", "job.sbatch", "logs"]
    finally:
        subprocess.run(["scancel", jid], env=env, capture_output=True, timeout=30)
        subprocess.run(["scontrol", "wait_job", jid], env=env, capture_output=True, timeout=60)
        shutil.rmtree(theirs)
