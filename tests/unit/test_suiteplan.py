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



LANES_CONFTEST = CONFTEST.replace("import pytest, suiteplan", "import pytest, suiteplan, cpulanes") + """
    cpulanes.configure(config, lambda: DAEMONS)

import os, subprocess
DAEMONS = []

@pytest.fixture(scope="session")
def daemon():
    # a daemon this worker started before its lane was known, as a dev cluster's slurmd
    p = subprocess.Popen(["sleep", "60"])
    DAEMONS.append(p.pid)
    yield p.pid
    p.kill()
    p.wait()
"""

LANE_TEST = """
def {name}(daemon):
    child = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True).stdout
    cpu = lambda text: next(ln.split(":", 2)[2] for ln in text.splitlines()
                            if "cpu" in ln.split(":")[1].split(","))
    seen = [cpu(open(f"/proc/{{p}}/cgroup").read()) for p in (os.getpid(), daemon)]
    with open({out!r}, "a") as f:
        f.write(json.dumps([{lane!r}, os.environ.get("HPCSERVE_TEST_CPU_LANES"), *seen,
                            cpu(child)]) + "\\n")
"""


def test_the_real_engine_lane_gets_the_larger_cpu_share(tmp_path):
    """As root under xdist: a worker runs a real-engine test in the controller's `engines` cpu
    cgroup and any other in `waiting` (their cpu.shares 4:1), and so do the processes it starts
    then and the daemons it started before; the groups are gone after the run. Elsewhere every
    lane shares alike."""
    import os

    import cpulanes
    out = tmp_path / "lanes.jsonl"
    (tmp_path / "tests" / "real").mkdir(parents=True)
    (tmp_path / "tests" / "jobs").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(LANES_CONFTEST)
    tests = {lane: "".join(LANE_TEST.format(name=f"test_{lane}{i}", out=str(out), lane=lane)
                           for i in range(3)) for lane in ("real", "jobs")}
    (tmp_path / "tests" / "real" / "test_lane.py").write_text(
        "import json, os, subprocess, pytest\npytestmark = pytest.mark.real_engine\n"
        + tests["real"])
    (tmp_path / "tests" / "jobs" / "test_wait.py").write_text(
        "import json, os, subprocess\n" + tests["jobs"])
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                        "--dist", "loadgroup", "--no-loadscope-reorder", "tests"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(ran) == 6
    top = ran[0][1]
    if os.geteuid() != 0 or cpulanes._own_cgroup() is None:
        assert top is None, ran
        return
    assert top and Path(top).name.startswith(cpulanes.PREFIX), ran
    rel = "/" + str(Path(top).relative_to(cpulanes.CPU_ROOT))
    for lane, _, worker, daemon, child in ran:
        want = f"{rel}/{'engines' if lane == 'real' else 'waiting'}"
        assert (worker, daemon, child) == (want, want, want), (lane, ran)
    assert (Path(top).parent / "cgroup.procs").exists() and not Path(top).exists()
