#!/usr/bin/env python3
"""hpcserve benchmarks: whole-process wall times, median of several runs.

    .venv/bin/python bench/bench.py            # all
    .venv/bin/python bench/bench.py render     # one group

Each figure is the median of N runs of a complete process (interpreter start-up included), as a
user would feel it; docs/performance.md quotes these figures.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HPCSERVE = [str(Path(sys.executable).parent / "hpcserve")]


def timed(argv: list[str], runs: int = 7, env: dict | None = None, setup=None) -> list[float]:
    out = []
    for _ in range(runs):
        if setup:
            setup()
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
        out.append(time.perf_counter() - t0)
    return out


def report(label: str, samples: list[float], target: float | None = None) -> None:
    med = statistics.median(samples)
    tgt = f"  (target < {target:g} s)" if target else ""
    print(f"{label:58} median {med:6.3f} s  min {min(samples):.3f}  max {max(samples):.3f}  "
          f"n={len(samples)}{tgt}", flush=True)


def bench_render() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for label, f, target in (
                ("hpcserve render examples/kimi-k2-instruct-4p12d.yaml", "examples/kimi-k2-instruct-4p12d.yaml", 0.3),
                ("hpcserve render bench/synthetic-1024.yaml (1,024 nodes)", "bench/synthetic-1024.yaml", 1.0)):
            n = [0]

            def out() -> str:
                n[0] += 1
                return os.path.join(tmp, f"{Path(f).stem}-{n[0]}")
            samples = []
            for _ in range(7):
                d = out()
                t0 = time.perf_counter()
                subprocess.run(HPCSERVE + ["render", str(ROOT / f), "--out", d], check=True,
                               stdout=subprocess.DEVNULL)
                samples.append(time.perf_counter() - t0)
            report(label, samples, target)


def bench_cli() -> None:
    report("hpcserve --help", timed(HPCSERVE + ["--help"]), 0.3)


GROUPS = {"render": bench_render, "cli": bench_cli}

if __name__ == "__main__":
    os.chdir(ROOT)
    for name in sys.argv[1:] or list(GROUPS):
        GROUPS[name]()
