"""The demo deployment run with nothing but the installed wheel (`pip install 'hpcserve[dev]'`
into a fresh venv, outside the checkout): submit, serve through the real sglang-router it
brought, answer a request, cancel. The job's python3 is the venv's, as a user's would be."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcserve.runtime.contract import API_KEY_FILE
from jobkit import OWNER, chat, hand_over, owners_jobs, wait_no_job_processes

pytestmark = pytest.mark.slurm

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_wheel_runs_the_demo_deployment(installed_wheel, dev_cluster, tmp_path):
    """Run by the test jobs' unprivileged user, as a user who pip-installed hpcserve would."""
    hs = str(installed_wheel / "hpcserve")
    # the checkout's venv off PATH: python3 (the job's, the router's) can only be the wheel's
    checkout_bin = str(Path(sys.executable).parent)
    path = [installed_wheel, *(d for d in os.environ["PATH"].split(":") if d != checkout_bin)]
    env = {**dev_cluster.client_env(), "HPCSERVE_STATE_DIR": str(tmp_path / "state"),
           "PATH": ":".join(map(str, path)), "HOME": pwd.getpwnam(OWNER).pw_dir}
    dep = tmp_path / "demo.yaml"
    dep.write_text((ROOT / "examples" / "demo.yaml").read_text())
    hand_over(tmp_path)
    jobs = str(owners_jobs(dev_cluster) / f"wheel-demo-{time.time_ns()}")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(["runuser", "-u", OWNER, "--", hs, *args], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=180)
        assert not check or p.returncode == 0, (args, p.stdout, p.stderr)
        return p

    out = run("submit", "demo.yaml", "--set", f"jobs_dir={jobs}", "--follow").stdout
    job = out.split("submitted job ")[1].split(":")[0]
    try:
        st = json.loads(run("status", job, "--json").stdout)[0]
        assert st["phase"] == "serving", out
        key = (Path(st["job_dir"]) / API_KEY_FILE).read_text().strip()  # made at submit
        assert chat(st["endpoint"], 5, key=key)["usage"]["completion_tokens"] == 5
    finally:
        done = run("cancel", job, "--wait", check=False)
    assert done.returncode == 0 and done.stdout.strip().endswith("cancelled"), done.stdout
    wait_no_job_processes(dev_cluster, 15)
