"""Fixtures for the container tests: the strict stand-ins on PATH and a real squashfs image."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ctkit import FAKES, Fakes


@pytest.fixture
def fakes(tmp_path: Path) -> Fakes:
    """An environment with the stand-ins first on PATH (srun/enroot/apptainer, then the python3
    stub that records engine and router commands)."""
    root = tmp_path / "fakes"
    root.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM", "PYXIS_", "ENROOT_", "APPTAINER", "SINGULARITY"))}
    env.update({
        "PATH": os.pathsep.join([str(FAKES / "bin"), str(FAKES / "engine"), env.get("PATH", "")]),
        "HPCSERVE_FAKE_PYTHON": sys.executable,
        "HPCSERVE_FAKE_LOG": str(root / "calls.jsonl"),
        "ENROOT_DATA_PATH": str(root / "enroot-data"),
        "SLURM_JOB_ID": "4242",
        "HPCSERVE_FAKE_HET_SIZE": "2",
    })
    return Fakes(root, env)


@pytest.fixture
def sqsh(tmp_path: Path) -> Path:
    """A real (tiny) squashfs image file."""
    if not shutil.which("mksquashfs"):
        # must run wherever the suite runs, CI included: a missing package is a failure
        pytest.fail("mksquashfs (squashfs-tools) is not installed; scripts/setup.sh installs it")
    src = tmp_path / "image-root"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "environment").write_text("")
    out = tmp_path / "images" / "sglang.sqsh"
    out.parent.mkdir()
    subprocess.run(["mksquashfs", str(src), str(out), "-quiet", "-no-progress"], check=True,
                   stdout=subprocess.DEVNULL)
    return out
