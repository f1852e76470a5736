"""Fixtures of the pure-layer tests (config, plan, render): no Slurm, no network, no GPUs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import unitkit`, whatever the import mode

import unitkit  # noqa: E402


@pytest.fixture(scope="session")
def flag_matrix() -> dict:
    """The per-release SGLang flag matrix hpcserve spells flags from."""
    from hpcserve.engines import sglang
    return sglang.ADAPTER.matrix.versions()


@pytest.fixture
def stubs(tmp_path: Path):
    """Stub srun/python3/scancel/squeue/apptainer/enroot/sbatch/unsquashfs that append their argv
    and environment to a log (unitkit.read_stub_log reads it); returns (bin dir, log path)."""
    bindir = unitkit.install_stubs(tmp_path / "stub-bin")
    return bindir, tmp_path / "stub-calls.jsonl"


@pytest.fixture
def fresh_cwd(tmp_path: Path) -> Path:
    d = tmp_path / "cwd"
    d.mkdir()
    return d
