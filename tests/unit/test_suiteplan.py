"""The suite's plan for running side by side (tests/suiteplan.py): what it groups is what
pytest-xdist keeps on one worker, and the per-tier timings reach the log."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import suiteplan

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
import pytest, suiteplan

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    suiteplan.order_and_group(items)

def pytest_configure(config):
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(suiteplan.TierClock(), "tier-clock")
"""

RECORD = """
import json, os, pytest
@pytest.fixture(scope="module")
def shared():
    return os.getpid()
{tests}
"""


def _test(name: str, uses: str = "") -> str:
    return (f"def {name}({uses}):\n"
            f"    with open({{out!r}}, 'a') as f:\n"
            f"        f.write(json.dumps([__name__ + '::{name}', os.environ['PYTEST_XDIST_WORKER']]) + '\\n')\n")


def test_a_lane_and_a_module_fixture_each_stay_on_one_worker_and_the_tiers_are_timed(tmp_path):
    out = tmp_path / "ran.jsonl"
    (tmp_path / "tests" / "real").mkdir(parents=True)
    (tmp_path / "tests" / "jobs").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(CONFTEST)
    lane = "pytestmark = pytest.mark.real_engine\n" + "".join(_test(f"test_r{i}")
                                                            for i in range(4))
    shared = "".join(_test(f"test_s{i}", "shared") for i in range(4))
    alone = "".join(_test(f"test_j{i}") for i in range(8))
    for path, tests in (("real/test_lane.py", lane), ("jobs/test_shared.py", shared),
                        ("jobs/test_alone.py", alone)):
        (tmp_path / "tests" / path).write_text(RECORD.format(tests=tests.format(out=str(out))))
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "3",
                        "--dist", "loadgroup", "--no-loadscope-reorder", "tests"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = [json.loads(ln) for ln in out.read_text().splitlines()]
    worker = {}
    for test, w in ran:
        worker.setdefault(test.split("::")[0].rsplit(".", 1)[-1], set()).add(w)
    assert len(ran) == 16
    # the real tier's lane on one worker, the module fixture's users on one worker
    assert len(worker["test_lane"]) == 1 and len(worker["test_shared"]) == 1, worker
    # the lone tests are spread: three workers, so not all on one
    assert len(worker["test_alone"]) > 1, worker
    table = r.stdout.split("wall time per tier", 1)[1]
    rows = {ln.split()[0]: ln.split()[1] for ln in table.splitlines()[1:5]}
    assert rows == {"tier": "tests", "real": "4", "jobs": "12", "all": "16"}, table


def test_tier_is_the_folder_under_tests():
    assert suiteplan.tier("tests/jobs/test_x.py::test_y[a/b]") == "jobs"
    assert suiteplan.tier("tests/real/test_vllm_cpu.py::test_z@real-engine-0") == "real"
    assert suiteplan.tier("test_top.py::test_y") == "other"


def test_a_costly_session_fixture_groups_before_a_module_fixture():
    """The wheel's users in every module go to one worker, which builds the wheel once, even
    where a module-scoped fixture of theirs would group them by module."""
    from types import SimpleNamespace as NS
    item = NS(nodeid="tests/unit/test_w.py::test_a", fixturenames=["names", "installed_wheel"],
              _fixtureinfo=NS(name2fixturedefs={"names": [NS(scope="module")]}),
              get_closest_marker=lambda name: None)
    assert suiteplan.group_of(item) == "installed-wheel"
    item.fixturenames = ["names"]
    assert suiteplan.group_of(item) == "tests/unit/test_w.py"


def test_the_real_engine_lane_is_the_tests_marked_real_engine():
    """Not the whole real tier: its tests of vLLM's client against simulated engines start no
    engine and run anywhere."""
    from types import SimpleNamespace as NS

    def item(marks):
        return NS(nodeid="tests/real/test_b.py::test_a", fixturenames=[],
                  _fixtureinfo=NS(name2fixturedefs={}),
                  get_closest_marker=lambda name: object() if name in marks else None)

    assert suiteplan.group_of(item({"real_engine", "slurm"})) == suiteplan.REAL_ENGINE_GROUP
    assert suiteplan.group_of(item({"slurm"})) is None
