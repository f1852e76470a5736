"""Fixtures for real jobs on the local Slurm cluster (simulated SGLang, real sglang-router)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from jobkit import Job, submitter


@pytest.fixture
def submit(dev_cluster: Any, tmp_path: Path, site_python: Path) -> Iterator[Callable[..., Job]]:
    """Render a deployment dict (optionally editing the rendered files) and sbatch it, as the
    unprivileged user the test jobs run as (jobkit.submitter)."""
    with submitter(dev_cluster, tmp_path, site_python) as submit:
        yield submit
