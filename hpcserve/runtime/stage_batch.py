"""Weight staging on the batch host (model.stage): Staging runs the stage step on every node of
the job, reads every node's report, records state.json's stage and ends the job naming node,
file and cause when a node failed, before any engine starts.

Apart from the node's part (stage.py, `python3 -m hpcserve_runtime stage`): that one runs on
every node without the orchestrator; this one is the orchestrator's (job.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from .spec import Stage
from .stage import _write
from .stage_cache import StageError, list_files
from .stage_link import new_key


class Staging:
    def __init__(self, job):
        self.job = job
        self.procs: dict = {}

    def run(self, found: dict) -> None:
        """The stage step on every node of the job; returns once each has a complete copy,
        raises Stop naming node, file and cause where one has not."""
        job, spec = self.job, self.job.plan.stage
        run = os.path.join(job.dir, "run", "stage")
        shutil.rmtree(run, ignore_errors=True)   # an earlier try's statuses say nothing now
        os.makedirs(run, mode=0o700)
        new_key(os.path.join(run, "key"))        # this try's own: no earlier link's frame checks
        chain = list(dict.fromkeys((n[0], n[1]) for c in sorted(found) for n in found[c]))
        _write(os.path.join(run, "chain"), "".join(f"{n} {ip}\n" for n, ip in chain))
        t0 = time.time()
        job.log(f"stage: start, {spec.source} to {spec.path} on {len(chain)} node(s)")
        for c in job.plan.components:
            i = c.index
            with open(os.path.join(job.dir, "logs", f"stage-{i}.log"), "ab") as log:
                self.procs[i] = subprocess.Popen(
                    ["bash", os.path.join(job.dir, "steps", f"stage-{i}.sh")],
                    stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                    env={**os.environ, **job.allocation.env(i)})
        try:
            self._wait()
        finally:
            self.stop()
        self._judge([n for n, _ in chain], t0)

    def _wait(self) -> None:
        while any(p.poll() is None for p in self.procs.values()):
            self.job.check()
            time.sleep(0.05)

    def _judge(self, nodes: list, t0: float) -> None:
        from .failures import Stop
        job, spec = self.job, self.job.plan.stage
        reports = {n: _read_json(os.path.join(job.dir, "run", "stage", "report", n + ".json"))
                   for n in nodes}
        took = round(time.time() - t0, 3)
        record = {"path": spec.path, "took_s": took,
                  "reader": next((n for n, r in reports.items() if r and r["read_shared"]), None),
                  "shared_bytes_read": sum(r["read_shared"] for r in reports.values() if r),
                  "model_bytes": _model_bytes(spec),
                  "nodes": {n: {k: r[k] for k in ("outcome", "read_shared", "took_s", "detail")
                                if k in r} if r else {"outcome": "failed",
                                                      "detail": "no report from this node"}
                            for n, r in reports.items()}}
        job.state.update(stage=record)
        bad = _root_failure(nodes, reports)
        if bad:
            node, rep = bad
            job.log(f"stage: failed on {node}: {rep.get('file') or ''} {rep['detail']}")
            where = f"{rep['file']} on {node}" if rep.get("file") else node
            raise Stop("failed", f"staging failed: {where}: {rep['detail']}",
                       {"step": "stage", "role": None, "instance": None, "node": node,
                        "reason": "staging failed", "file": rep.get("file"),
                        "detail": rep["detail"], "log": "logs/stage-0.log"})
        outcomes = ", ".join(f"{n} {r['outcome']}" for n, r in reports.items())
        job.log(f"stage: end, {took:.2f} s ({outcomes}; {record['shared_bytes_read']} bytes "
                "read from the shared path)")

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def _root_failure(nodes: list, reports: dict):
    """(node, report) of the failure the others follow from: a node that blames itself (the
    reader that found a corrupted file, a node whose disk failed), else the first failed."""
    failed = [(n, reports[n] or {"outcome": "failed", "detail": "no report from this node",
                                 "blame": n}) for n in nodes
              if not reports[n] or reports[n]["outcome"] == "failed"]
    for n, r in failed:
        if r.get("blame") == n:
            return n, r
    return failed[0] if failed else None


def _model_bytes(spec: Stage) -> int:
    try:
        return sum(size for _, size in list_files(spec.source))
    except (OSError, StageError):
        return 0


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
