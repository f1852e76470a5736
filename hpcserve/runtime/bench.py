"""The serving benchmark's results read the same way whoever's client wrote them, and the gate
that refuses results which prove nothing (stdlib only, Python 3.7+).

The job runs the gate when the benchmark step ends (bench_step.py); `hpcserve report` reads the
same files with the same code. What a client's results file holds, and under which names, comes from plan.json's benchmark.keys (the engines'
bench_clients module), so nothing here names a client.

A point fails the gate when its client failed (exit code, no results file), when fewer requests
succeeded than min_success of those asked, when it produced 0 output tokens (the "successful"
benchmark of a deployment whose KV transfer is broken), or when the mean output length falls
more than output_tolerance short of the requested length.
"""

from __future__ import annotations

import json
import os
import time

from .probes import DIRECT
from .spec import Benchmark, BenchPoint

STATS = ("mean", "median", "p90", "p99")


def _load(path: str, json_lines: bool):
    """The results object; with JSON lines (appended per run) the last complete line."""
    with open(path) as f:
        text = f.read()
    if not json_lines:
        return json.loads(text)
    for line in reversed(text.splitlines()):
        if line.strip():
            return json.loads(line)
    raise ValueError("empty results file")


def _num(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def read_point(bench_dir: str, spec: Benchmark, point: BenchPoint) -> dict:
    """One point as the report and the gate see it: what was asked, the client's exit, and
    its counts and latencies under one set of names (milliseconds, tokens, per second)."""
    out = {"label": point.label, "concurrency": point.concurrency, "rate": point.rate,
           "prompts": point.prompts}
    run = {}
    try:
        with open(os.path.join(bench_dir, f"{point.label}.run.json")) as f:
            run = json.load(f)
    except (OSError, ValueError):
        pass
    out.update(rc=run.get("rc"), start=run.get("start"), end=run.get("end"), results=False)
    keys = spec.keys
    try:
        r = _load(os.path.join(bench_dir, point.file), keys.json_lines)
    except (OSError, ValueError):
        return out
    completed = int(r.get("completed") or 0)
    failed = r.get(keys.failed) if keys.failed else None
    lens = [n for n in (r.get("output_lens") or []) if isinstance(n, int)]
    output = _num(r.get(keys.output))
    if output is None:
        output = float(sum(lens))
    errors = [e for e in (r.get("errors") or []) if e]
    out.update(results=True, completed=completed,
               failed=int(failed) if failed is not None else point.prompts - completed,
               output_tokens=int(output), duration_s=_num(r.get("duration")),
               request_throughput=_num(r.get("request_throughput")),
               output_throughput=_num(r.get("output_throughput")),
               input_tokens=_num(r.get("total_input_tokens")),
               mean_output=(output / completed) if completed else 0.0,
               min_output=min(lens) if lens else None,
               errors=[str(e)[:300] for e in errors[:3]], error_count=len(errors))
    for m, name in keys.metrics.items():
        out[m] = {s: _num(r.get(f"{s}_{name}_ms")) for s in STATS}
    return out


def gate(spec: Benchmark, point: BenchPoint, p: dict) -> str | None:
    """Why point p proves nothing (None: it passes)."""
    want = spec.output_tokens
    g = spec.gate
    if p.get("rc") is None and not p["results"]:
        return "the client did not run (no exit code, no results)"
    if not p["results"]:
        return f"the client exited with code {p['rc']} and wrote no results"
    why = []
    if p["output_tokens"] == 0:
        why.append("0 output tokens")
    ok = p["completed"]
    if ok < g.min_success * point.prompts:
        why.append(f"{ok} of {point.prompts} requests succeeded")
    elif p["output_tokens"] and p["mean_output"] < (1 - g.output_tolerance) * want:
        why.append(f"mean output {p['mean_output']:.1f} tokens of the {want} asked")
    if p["rc"] not in (0, None) and not why:
        why.append(f"the client exited with code {p['rc']}")
    if why and p.get("errors"):
        why.append(f"first error: {p['errors'][0]}")
    return "; ".join(why) or None


def evaluate(bench_dir: str, spec: Benchmark) -> dict:
    """Every point read and judged: {passed, points, failed: {point, reason} or None}; a point
    that never ran (the sweep stopped before it) is listed as not run."""
    rows, failed = [], None
    for point in spec.points:
        p = read_point(bench_dir, spec, point)
        ran = p["rc"] is not None or p["results"]
        if not ran and failed is not None:
            p["verdict"] = "not run"
        else:
            reason = gate(spec, point, p)
            p["verdict"] = "fail" if reason else "ok"
            p["reason"] = reason
            if reason and failed is None:
                failed = {"point": point.label, "reason": reason}
        rows.append(p)
    return {"passed": failed is None, "points": rows, "failed": failed,
            "client": spec.client, "title": spec.title,
            "input_tokens": spec.input_tokens, "output_tokens": spec.output_tokens}


def one_line(p: dict) -> str:
    """A point for the job's log."""
    if not p.get("results"):
        return f"{p['label']}: {p['verdict']}" + (f" ({p['reason']})" if p.get("reason") else "")
    t = p.get("ttft") or {}
    return (f"{p['label']}: {p['verdict']}, {p['completed']}/{p['prompts']} requests, "
            f"{p['output_tokens']} output tokens, "
            f"{p['output_throughput'] or 0:.1f} output tok/s, TTFT p50 "
            f"{t.get('median') or 0:.1f} ms" + (f" ({p['reason']})" if p.get("reason") else ""))


def scrape(targets: list, metrics_dir: str, timeout: float = 2.0) -> None:
    """One scrape of each (name, url) Prometheus endpoint, appended to metrics/NAME.prom after a
    '# hpcserve-scrape UNIX_TIME' line; what did not answer is noted there instead."""
    os.makedirs(metrics_dir, exist_ok=True)
    for name, url in targets:
        at = time.time()
        try:
            with DIRECT.open(url, timeout=timeout) as r:  # no proxy (probes.py)
                body = r.read().decode("utf-8", "replace")
        except Exception as e:  # noqa: BLE001 - whatever it was, it is noted, not raised
            body = f"# hpcserve-scrape-error {url}: {e}\n"
        with open(os.path.join(metrics_dir, f"{name}.prom"), "a") as f:
            f.write(f"# hpcserve-scrape {at:.3f} {url}\n{body}")
            if not body.endswith("\n"):
                f.write("\n")
