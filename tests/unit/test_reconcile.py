"""What the router's worker list is set against (runtime/reconcile.py): the instance jobs under
scale/ that still run name their instances' URLs; one that ended names none, so a worker another
user puts at its address later is removed as unknown."""

from __future__ import annotations

import json
from types import SimpleNamespace

from hpcserve.runtime.reconcile import Reconcile


def _state(d, phase: str, urls: dict) -> None:
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"phase": phase, "health_urls": urls}))


def test_only_instance_jobs_that_still_run_name_known_workers(tmp_path):
    _state(tmp_path / "scale" / "decode-1", "serving",
           {"decode-0": "http://10.0.0.5:30020/health"})
    _state(tmp_path / "scale" / "decode-2", "pending",  # joining: says its URLs first
           {"decode-0": "http://10.0.0.6:30040/health"})
    for phase, host in (("done", "10.0.0.7"), ("cancelled", "10.0.0.8"), ("failed", "10.0.0.9")):
        _state(tmp_path / "scale" / f"ended-{phase}", phase,
               {"decode-0": f"http://{host}:30060/health"})
    known = Reconcile(SimpleNamespace(dir=str(tmp_path)))._instance_jobs()
    assert known == {"http://10.0.0.5:30020", "http://10.0.0.6:30040"}
