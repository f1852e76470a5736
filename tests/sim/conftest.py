import sys
from pathlib import Path

import pytest

# `import simlib` from the tests, whatever pytest's import mode
sys.path.insert(0, str(Path(__file__).resolve().parent))

from simlib import Procs  # noqa: E402


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    yield ps
    ps.close()
