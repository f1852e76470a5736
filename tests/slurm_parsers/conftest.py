"""Fixtures for the Slurm output parsers (samples: slurm_samples.py).

The 22.05 samples were recorded in UTC; Slurm prints local times without a zone, so the text
parsers read them in this process's zone. `utc` pins TZ=UTC for a test and restores it after.
"""

from __future__ import annotations

import os
import time
from typing import Iterator

import pytest


@pytest.fixture
def utc() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()
