"""Golden job directories: every examples/*.yaml rendered for a fixed job directory.

`HPCSERVE_UPDATE_GOLDEN=1 pytest tests/golden` rewrites tests/golden/<example>/ from the current
renderer (and removes files it no longer renders), so every change of generated output shows up
in the diff that is reviewed; without it, a missing or different file fails with a unified diff.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import goldenkit`, whatever the import mode

from goldenkit import EXAMPLES, render_example  # noqa: E402


@pytest.fixture(scope="session")
def update_golden() -> bool:
    return os.environ.get("HPCSERVE_UPDATE_GOLDEN", "") not in ("", "0")


@pytest.fixture(scope="session")
def rendered() -> dict[str, dict[str, tuple[str, int]]]:
    """{example stem: {relative path: (text, mode)}} for every example."""
    return {ex.stem: render_example(ex) for ex in EXAMPLES}
