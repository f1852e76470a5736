"""`hpcserve bench` without --in-allocation submits its own one-node job through submitit: with
the deployment's partition, account, QOS, constraint and reservation (what a site requires of
every job), read back from the job directory's plan.json, in the batch script submitit writes."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest

from hpcserve.operate import bench_ops
from hpcserve.author import config, plan
from hpcserve.author.render import render_files, write_job
from hpcserve.slurm.runner import LocalRunner
from unitkit import small_pd, write_yaml

SITE = {"partition": "gpu-long", "account": "proj-42", "qos": "serving",
        "constraint": "h200&ib", "reservation": "kimi-week"}


def _job_dir(tmp_path, slurm: dict):
    doc = small_pd()
    doc["site"]["slurm"].update(slurm)
    p = plan.build(config.load(write_yaml(tmp_path / "d.yaml", doc)))
    return write_job(render_files(p, str(tmp_path / "job")), tmp_path / "job")


def _sbatch_lines(tmp_path, site: dict) -> list[str]:
    """The #SBATCH lines of the batch script submitit writes for these options (its own
    parameter check and script writer, nothing submitted)."""
    submitit = pytest.importorskip("submitit")
    ex = submitit.SlurmExecutor(folder=str(tmp_path / "submitit"))
    ex.update_parameters(**bench_ops.job_parameters(site, 31, "t"))  # refuses unknown keys
    text = ex._make_submission_file_text("python3 -c pass", "uid")
    return [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]


def test_the_benchmark_job_takes_the_sites_slurm_options(tmp_path):
    jd = _job_dir(tmp_path, SITE)
    site = bench_ops.slurm_options_of(LocalRunner(), SimpleNamespace(job_dir=str(jd)))
    assert site == SITE
    lines = _sbatch_lines(tmp_path, site)
    for key, value in SITE.items():
        # submitit quotes a value as the shell would; sbatch reads the quotes off
        assert f"#SBATCH --{key}={shlex.quote(value)}" in lines, (key, lines)
    assert "#SBATCH --nodes=1" in lines and "#SBATCH --time=31" in lines
    # the engines' requests are not the client's: no GPUs, no exclusive node
    assert not [ln for ln in lines if "gpus" in ln or "exclusive" in ln or "gres" in ln], lines


def test_a_site_without_them_adds_none(tmp_path):
    jd = _job_dir(tmp_path, {"partition": None})
    site = bench_ops.slurm_options_of(LocalRunner(), SimpleNamespace(job_dir=str(jd)))
    assert site == {}
    lines = _sbatch_lines(tmp_path, site)
    assert not [ln for ln in lines if ln.split("=")[0].removeprefix("#SBATCH --") in SITE]
