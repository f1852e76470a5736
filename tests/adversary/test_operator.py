"""Operator commands against another user's job on the real dev cluster's Slurm: a job that
hpcserve-b (a real second Unix user) runs, with a job directory of the shape hpcserve renders
(logs/batch-<id>.out), is refused by `status`, `logs`, `scale`, `upgrade` and `cancel` in one
line naming its owner, exit 2; the job is left running. Before, its job directory was taken
from Slurm's record: `scale` would have rendered and submitted their deployment file as you."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from adversarykit import OTHER, others_job
from hpcserve.devcluster.cluster import DevCluster

ROOT = Path(__file__).resolve().parents[2]
HPCSERVE = ROOT / ".venv" / "bin" / "hpcserve"


def test_another_users_job_is_refused_by_every_operator_command(dev_cluster: DevCluster,
                                                                 tmp_path: Path) -> None:
    env = dev_cluster.client_env()
    with others_job(env) as (jid, theirs):
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
