"""How the suite runs side by side (pytest-xdist, `./scripts/test`), and where its time goes.

Each xdist worker is a pytest session of its own: it holds its own dev-cluster slot (its own
state dir, subnet and interface names, tests/conftest.py), so tests on different workers never
share a Slurm cluster, a port of a node or a file. What must stay on one worker is named here:

- the tests that run a real engine (marked `real_engine`: vLLM's CPU release) run on one
  worker, one test after another: a real engine's start-up is what costs CPU here (importing
  vLLM alone takes some 15 s of a core, in each of its processes), two at once on a 2-core
  machine stretch each other's steps past what the tests allow, and their leftover checks read
  this machine's /dev/shm, which two engines' jobs would share. The real tier's other tests
  (vLLM's benchmark client against simulated engines) run anywhere;
- tests that share a module- or class-scoped fixture (a serving deployment some tests only read)
  run on the worker that set it up, so it is set up once; so do the tests that use one of the
  costly session fixtures (the installed wheel).

Lanes and their CPU shares: with more than one worker, run as root, a worker running a real-engine
test runs at the default priority and every other at nice WAITING_NICE, it and the dev cluster's
daemons it started (slurmd and slurmctld: the jobs' processes inherit their nice value, Slurm's
PropagatePrioProcess=0). The real engines' start-ups are CPU-bound and what the run waits on; the
other lanes mostly wait on Slurm and the stand-ins, and take the CPU the engines leave. Nothing
decides differently for it: every timing a test checks is a bound, never a race between lanes.

Every other test is its own unit of work. Units are handed out slowest tier first (a Slurm job
takes tens of seconds, a unit test milliseconds), so the short ones fill the gaps at the end.

The summary prints each tier's wall time (first start to last finish, on any worker) and its
summed test time: what CI's log shows of where the time goes.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

# Slowest first: the order in which units are handed out. A tier not named here goes last.
TIERS = ("real", "jobs", "ssh", "devcluster", "sim", "containers", "facts", "engine_parsers",
         "slurm_parsers", "golden", "unit")
REAL_ENGINE_GROUP = "real-engine"
# Session fixtures too costly to set up on every worker: the tests that use one share a worker.
COSTLY_SESSION_FIXTURES = {"installed_wheel": "installed-wheel"}  # a wheel built, a venv installed
# The nice value of the lanes that run no real engine (HPCSERVE_TEST_WAITING_NICE overrides it).
WAITING_NICE = int(os.environ.get("HPCSERVE_TEST_WAITING_NICE", "5"))


def tier(nodeid: str) -> str:
    """tests/<tier>/test_x.py::test_y -> <tier>"""
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def _shares_a_wider_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "class")
               for defs in info.name2fixturedefs.values())


def group_of(item: pytest.Item) -> str | None:
    """The xdist group that keeps this test on one worker with others, or None."""
    if item.get_closest_marker("real_engine"):
        return REAL_ENGINE_GROUP
    # a costly session fixture first: its users in every module share one build of it
    for name in getattr(item, "fixturenames", ()):
        if name in COSTLY_SESSION_FIXTURES:
            return COSTLY_SESSION_FIXTURES[name]
    if _shares_a_wider_fixture(item):
        return item.nodeid.split("::")[0]
    return None


def order_and_group(items: list[pytest.Item]) -> None:
    """Slowest tier first (a stable sort: within a tier, the order of collection), and the xdist
    groups above. Every worker collects the same items, so every worker sorts them alike."""
    rank = {t: i for i, t in enumerate(TIERS)}
    items.sort(key=lambda it: rank.get(tier(it.nodeid), len(TIERS)))
    for it in items:
        group = group_of(it)
        if group and not it.get_closest_marker("xdist_group"):
            it.add_marker(pytest.mark.xdist_group(group))


def lane_nice(item: pytest.Item) -> int:
    """The nice value a worker runs `item` at: the real engines' lane first."""
    return 0 if item.get_closest_marker("real_engine") else WAITING_NICE


class LanePriority:
    """A worker's plugin (root, under xdist): before each test, this worker's process and the
    daemons of its dev cluster at the test's lane_nice. Only root may lower a nice value again,
    so elsewhere every lane runs at the default."""

    def __init__(self, daemon_pids) -> None:
        self.daemon_pids = daemon_pids  # () -> the PIDs of this worker's cluster daemons
        self.nice = 0

    @pytest.hookimpl(tryfirst=True)  # before the test's fixtures start anything
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        want = lane_nice(item)
        if want != self.nice:
            self.nice = want
            for pid in (os.getpid(), *self.daemon_pids()):
                renice(pid, want)


def renice(pid: int, nice: int) -> None:
    """Every thread of `pid` at `nice` (Linux keeps a nice value per thread; a thread or process
    made later inherits its maker's)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return  # ended
    for tid in tids:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass  # the thread ended meanwhile


class TierClock:
    """A plugin of the controlling session: per tier, the first start and last finish of its
    tests (setup to teardown) and the sum of their durations, from the reports of any worker;
    printed at the end of the run."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.busy: dict[str, float] = defaultdict(float)
        self.tests: dict[str, set[str]] = defaultdict(set)
        self.began = time.time()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if start is None or stop is None:
            return
        t = tier(report.nodeid)
        self.first[t] = min(self.first.get(t, start), start)
        self.last[t] = max(self.last.get(t, stop), stop)
        self.busy[t] += report.duration
        self.tests[t].add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.first:
            return  # nothing ran (--collect-only)
        terminalreporter.write_sep("=", "wall time per tier (first start to last finish)")
        for line in self.lines():
            terminalreporter.write_line(line)

    def lines(self) -> list[str]:
        rows = sorted(self.first, key=lambda t: self.first[t])
        out = [f"{'tier':<16}{'tests':>6}{'starts at':>11}{'wall':>9}{'test time':>11}"]
        for t in rows:
            out.append(f"{t:<16}{len(self.tests[t]):>6}{_mmss(self.first[t] - self.began):>11}"
                       f"{_mmss(self.last[t] - self.first[t]):>9}{_mmss(self.busy[t]):>11}")
        out.append(f"{'all':<16}{sum(len(s) for s in self.tests.values()):>6}{'':>11}"
                   f"{_mmss(time.time() - self.began):>9}{_mmss(sum(self.busy.values())):>11}")
        return out


def _mmss(seconds: float) -> str:
    s = max(0, round(seconds))
    return f"{s // 60}:{s % 60:02d}"
