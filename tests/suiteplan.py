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

Every other test is its own unit of work. Units are handed out slowest tier first (a Slurm job
takes tens of seconds, a unit test milliseconds), so the short ones fill the gaps at the end.

The summary prints each tier's wall time (first start to last finish, on any worker) and its
summed test time: what CI's log shows of where the time goes.
"""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

# Slowest first: the order in which units are handed out. A tier not named here goes last.
TIERS = ("real", "jobs", "ssh", "devcluster", "sim", "containers", "facts", "engine_parsers",
         "slurm_parsers", "golden", "unit")
REAL_ENGINE_GROUP = "real-engine"
# Session fixtures too costly to set up on every worker: the tests that use one share a worker.
COSTLY_SESSION_FIXTURES = {"installed_wheel": "installed-wheel"}  # a wheel built, a venv installed


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
