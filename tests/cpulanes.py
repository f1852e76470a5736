"""CPU shares of the suite's lanes (tests/suiteplan.py): the real-engine lane first.

A real vLLM's start-up is CPU-bound (its imports alone take some 15 s of a core in each of its
processes) and the real-engine tests run one after another on one worker: that lane is the run's
critical path. The other workers' tests mostly wait on Slurm and the stand-in engines. Given
the same share of the CPU, the waiting lanes' bursts stretch the engines' steps (three workers
sharing alike made the real lane 30% longer than two did), so the real lane gets ENGINES_SHARE
to the waiting lanes' WAITING_SHARE whenever both want the CPU, and the waiting lanes run in what
it leaves: every timing a test checks is a bound met under either share.

How: cgroup v1's cpu controller (cpu.shares). A nice value would not do: Linux groups the
processes of each session into an autogroup and shares the CPU between autogroups alike
(sched(7), "The autogroup feature"), and every Slurm step is a session of its own; a task in a
cgroup other than the root is outside autogroups. The controlling pytest makes
<its cpu cgroup>/hpcserve-tests-<pid>/{engines,waiting}; before each test a worker moves itself
and its dev cluster's daemons to the test's lane, and what they start later (Slurm's steps, the
engines) is born there. Only root may do this; elsewhere (or with the cpu controller absent)
every lane shares alike, as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable

import pytest

ENV = "HPCSERVE_TEST_CPU_LANES"  # the controller's group, for its workers
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
ENGINES, WAITING = "engines", "waiting"
ENGINES_SHARE, WAITING_SHARE = 4096, 1024
# The suite's own group against the other sessions of the machine (a test command's set-up steps
# still building beside it: they get what the suite leaves)
SUITE_SHARE = 4096
PREFIX = "hpcserve-tests-"


def lane_of(item: pytest.Item) -> str:
    return ENGINES if item.get_closest_marker("real_engine") else WAITING


def _own_cgroup(pid: int | str = "self") -> Path | None:
    """This process's cgroup in the v1 cpu hierarchy, as a directory; None without one."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for ln in lines:
        _, controllers, path = ln.split(":", 2)
        if "cpu" in controllers.split(","):
            return CPU_ROOT / path.lstrip("/")
    return None


def create() -> Path | None:
    """The controller's lane groups under its own cpu cgroup; None where it cannot make them."""
    base = _own_cgroup()
    if os.geteuid() != 0 or base is None or not (base / "cgroup.procs").is_file():
        return None
    _remove_stale(base)
    top = base / f"{PREFIX}{os.getpid()}"
    try:
        top.mkdir()
        (top / "cpu.shares").write_text(str(SUITE_SHARE))
        for lane, share in ((ENGINES, ENGINES_SHARE), (WAITING, WAITING_SHARE)):
            (top / lane).mkdir()
            (top / lane / "cpu.shares").write_text(str(share))
    except OSError:
        remove(top)
        return None
    return top


def join(top: Path, lane: str, pids: Iterable[int]) -> None:
    """Move each process (all its threads) to `lane`; one that ended meanwhile is skipped."""
    for pid in pids:
        try:
            (top / lane / "cgroup.procs").write_text(str(pid))
        except (ProcessLookupError, FileNotFoundError):
            pass
        except OSError as e:
            if e.errno != 3:  # ESRCH: it ended
                raise


def remove(top: Path) -> None:
    """The groups gone: whatever still runs in them (processes of this run) goes to the parent
    group first, as a group with tasks cannot be removed."""
    parent = top.parent / "cgroup.procs"
    for d in (top / ENGINES, top / WAITING, top):
        if not d.is_dir():
            continue
        try:
            pids = (d / "cgroup.procs").read_text().split()
        except OSError:
            pids = []
        for pid in pids:
            try:
                parent.write_text(pid)
            except OSError:
                pass  # it ended
        try:
            d.rmdir()
        except OSError:
            pass


def _remove_stale(base: Path) -> None:
    """The groups of controllers that died before their clean-up."""
    for d in base.glob(PREFIX + "*"):
        pid = d.name[len(PREFIX):]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            remove(d)


class Lanes:
    """A worker's plugin: before each test, this worker and its dev cluster's daemons in the
    test's lane."""

    def __init__(self, top: Path, daemon_pids: Callable[[], list[int]]) -> None:
        self.top, self.daemon_pids = top, daemon_pids
        self.lane: str | None = None

    @pytest.hookimpl(tryfirst=True)  # before the test's fixtures start anything
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        lane = lane_of(item)
        if lane != self.lane:
            self.lane = lane
            join(self.top, lane, [os.getpid(), *self.daemon_pids()])

    def pytest_unconfigure(self) -> None:
        join(self.top.parent, "", [os.getpid()])  # out of the lanes, so that they can go


def configure(config: pytest.Config, daemon_pids: Callable[[], list[int]]) -> None:
    """The lanes of a run under xdist: made by the controller, joined by its workers."""
    if hasattr(config, "workerinput"):
        top = os.environ.get(ENV)
        if top:
            config.pluginmanager.register(Lanes(Path(top), daemon_pids), "hpcserve-cpu-lanes")
        return
    if (getattr(config.option, "numprocesses", None) or 0) < 2:
        return
    top = create()
    if top is None:
        return
    os.environ[ENV] = str(top)  # the workers, started after this, inherit it
    config.add_cleanup(lambda: remove(top))
