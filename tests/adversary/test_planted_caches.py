"""Another user (hpcserve-b) in the caches a site shares between users: the image cache beside
a shared jobs folder and a site's compile-cache directory. An image and a compiled kernel are
code the deployment runs as its user, so what the other user made at this user's place in them
(their directory, their image in it) is refused in one line naming them, and never used."""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from adversarykit import OTHER, as_other, shared  # noqa: F401  (shared: a fixture)
from hpcserve import config, plan, records, render

ROOT = Path(__file__).resolve().parents[2]
ME = getpass.getuser()
HELPERS = {"enroot": ("enroot-import.sh", ".sqsh"), "apptainer": ("apptainer-build.sh", ".sif")}


def _stub(bin_dir: Path, name: str, calls: Path) -> None:
    """`name` on PATH that records each call and does nothing else."""
    f = bin_dir / name
    f.write_text(f'#!/bin/sh\necho "{name} $*" >>{calls}\nexit 0\n')
    f.chmod(0o755)


@pytest.mark.parametrize("tool", sorted(HELPERS))
def test_an_image_directory_another_user_made_at_this_users_place_is_refused(
        shared, tmp_path, tool):
    helper, suffix = HELPERS[tool]
    mine = shared / ".hpcserve-images" / ME
    target = mine / f"lmsysorg+sglang+v0.5.23{suffix}"
    # their "image", where this user's jobs would look for it, in a directory of theirs
    as_other("sh", "-c", f"umask 022; mkdir -p {mine} && echo theirs > {target}")
    bins, calls = tmp_path / "bin", tmp_path / "calls"
    bins.mkdir()
    _stub(bins, tool, calls)
    r = subprocess.run(["bash", str(ROOT / "containers" / helper),
                        "docker://lmsysorg/sglang:v0.5.23", str(target)],
                       env={**os.environ, "PATH": f"{bins}:{os.environ['PATH']}"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r
    assert f"refusing {mine} for images (owner {OTHER}, mode 755)" in r.stderr, r.stderr
    assert not calls.exists(), calls.read_text()      # nothing imported, nothing built
    assert target.read_text() == "theirs\n"           # nor theirs touched


def test_a_compile_cache_another_user_made_at_this_users_place_stops_the_engine(
        shared, tmp_path):
    cache = shared / "cache"
    as_other("sh", "-c", f"umask 022; mkdir -p {cache}/{ME}/tiny-llama")
    doc = {"name": "cc", "site": {"base": "local", "node": {"gpus": 1},
                                  "paths": {"cache_dir": str(cache)}},
           "model": {"profile": "tiny-llama", "path": "/models/tiny-llama"},
           "engine": {"name": "vllm", "version": "0.32.0", "simulate": True},
           "roles": {"worker": {"nodes": 1}}, "router": {"enabled": False}}
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(doc))
    job = tmp_path / "job"
    p = plan.build(records.replace(config.load(tmp_path / "d.yaml"), user=ME))
    render.write_job(render.render_files(p, str(job)), job)
    (job / "run").mkdir(exist_ok=True)
    (job / "run" / "worker-0.nodes").write_text("0 n1 127.0.0.1 lo -\n")
    env = {**os.environ, "SLURMD_NODENAME": "n1", "SLURM_JOB_ID": "7",
           "PATH": f"{ROOT / 'tests' / 'fakes' / 'engine'}:{os.environ['PATH']}",
           "HPCSERVE_FAKE_ENGINE": "exit:0", "HPCSERVE_FAKE_PYTHON": sys.executable}
    r = subprocess.run(["bash", str(job / "launch" / "worker-0.sh")], env=env,
                       capture_output=True, text=True, timeout=60)
    log = (job / "logs" / "worker-0.node0.n1.log").read_text()
    assert r.returncode == 3, (r, log)
    assert f"compile cache {cache}/{ME} refused (owner {OTHER}, mode 755)" in log, log
    assert not (job / "run" / "caches").exists()      # stopped before any cache or engine
