"""state.json while the deployment serves (runtime/state.py): a write that fails is counted,
logged as the failures begin and end, and tried again; before it serves, it still ends the start.
`hpcserve status` says how many failed."""

from __future__ import annotations

import json

import pytest

from hpcserve.operate.ops import View, write_failures_line
from hpcserve.runtime import state as statemod


class Clock:
    def __init__(self):
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(statemod, "now", c)
    return c


def test_before_serving_a_write_that_fails_is_raised(tmp_path, clock):
    s = statemod.State(str(tmp_path))
    (tmp_path / "state.json.tmp").mkdir()  # the write's temp file: open() fails, even as root
    with pytest.raises(IsADirectoryError):
        s.update("starting")


def test_while_serving_failed_writes_are_counted_logged_once_and_retried_when_due(tmp_path, clock):
    logged: list[str] = []
    s = statemod.State(str(tmp_path))
    s.update("serving", endpoint="http://n1:8000")
    s.serving(logged.append)
    blocker = tmp_path / "state.json.tmp"
    blocker.mkdir()
    s.update(instances={"decode-0": {"status": "out"}})   # a change: its write fails
    clock.t += 1
    s.update(instances={"decode-0": {"status": "restarting"}})
    assert [ln.split(" (")[0] for ln in logged] == ["state.json cannot be written"]
    assert "serves on" in logged[0] and "Is a directory" in logged[0]
    on_disk = json.loads((tmp_path / "state.json").read_text())
    assert "instances" not in on_disk and on_disk["phase"] == "serving"  # the last good write
    blocker.rmdir()
    clock.t += statemod.RETRY_S - 2
    s.retry()                                              # not due yet: nothing written
    assert "instances" not in json.loads((tmp_path / "state.json").read_text())
    clock.t += 2
    s.retry()
    on_disk = json.loads((tmp_path / "state.json").read_text())
    assert on_disk["instances"] == {"decode-0": {"status": "restarting"}}
    wf = on_disk["write_failures"]
    assert (wf["count"], wf["first_at"], wf["last_at"]) == (2, 1_000_000.0, 1_000_001.0), wf
    assert "Is a directory" in wf["error"]
    assert logged[-1] == "state.json written again, after 2 failed write(s) in all"
    s.retry()  # nothing failing: no write, no line
    assert len(logged) == 2


def test_status_says_how_many_writes_failed_and_when(tmp_path):
    v = View(job_id="7", name="d", job_dir=None, remote=None, phase="serving",
             state={"write_failures": {"count": 3, "first_at": 0.0, "last_at": 0.0,
                                       "error": "[Errno 28] No space left on device"}})
    line = write_failures_line(v)
    assert line.startswith("  state.json: 3 write(s) failed while serving, the last at ")
    assert "No space left on device" in line and "hpcserve-job.log" in line
    assert write_failures_line(View(job_id="7", name="d", job_dir=None, remote=None,
                                    state={})) is None
