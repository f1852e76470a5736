"""Fixtures for real jobs on the local Slurm cluster (simulated SGLang, real sglang-router)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from hpcserve import config, plan
from hpcserve.render import render_files, write_job
from jobkit import Job, python_without_hpcserve, wait_no_job_processes


def _without_hpcserve(dep: dict, python: Path) -> dict:
    """The deployment with site.paths.python pointed at `python`, unless the test set its own."""
    site = dep.get("site", "local")
    if isinstance(site, str):
        site = {"base": site}
    if "python" in site.get("paths", {}):
        return dep
    return {**dep, "site": {**site, "paths": {**site.get("paths", {}), "python": str(python)}}}


@pytest.fixture
def submit(dev_cluster: Any, tmp_path: Path) -> Callable[..., Job]:
    """Render a deployment dict (optionally editing the rendered files) and sbatch it."""
    env = dev_cluster.client_env()
    # The job's python3 must be the project venv's (it has sglang_router); sbatch exports PATH.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    jobs: list[Job] = []
    # the runtime runs with a python3 that has no hpcserve, as on a site's nodes
    nodes_python = python_without_hpcserve(Path(dev_cluster.state_dir).parent, sys.executable)

    def _submit(dep: dict, edit: Callable[[Path], None] | None = None,
                extra_env: dict[str, str] | None = None) -> Job:
        dep = _without_hpcserve(dep, nodes_python)
        f = tmp_path / f"{dep['name']}.yaml"
        f.write_text(yaml.safe_dump(dep))
        p = plan.build(config.load(f))
        job_dir = Path(dev_cluster.state_dir).parent / "jobs" / f"{dep['name']}-{len(jobs)}-{time.time_ns()}"
        write_job(render_files(p, str(job_dir)), job_dir)
        if edit:
            edit(job_dir)
        # the environment of this moment: sbatch exports it to the job (secrets given by name)
        job_env = {**dev_cluster.client_env(), "PATH": env["PATH"], **(extra_env or {})}
        out = subprocess.run(["sbatch", "--parsable", str(job_dir / "job.sbatch")], env=job_env,
                             capture_output=True, text=True, check=True).stdout.strip()
        job = Job(dev_cluster, job_dir, out.split(";")[0], env)
        jobs.append(job)
        return job

    yield _submit
    for j in jobs:  # whatever a test left: cancel it and wait until Slurm has it gone
        subprocess.run(["scancel", j.id], env=env, capture_output=True)
    for j in jobs:
        j.squeue_gone(60)
    wait_no_job_processes(dev_cluster, 30)
