#!/usr/bin/env python3
"""hpcserve benchmarks: whole-process wall times, median of several runs.

    .venv/bin/python bench/bench.py            # all
    .venv/bin/python bench/bench.py render     # one group

Each figure is the median of N runs of a complete process (interpreter start-up included), as a
user would feel it; docs/performance.md quotes these figures. The `ratio` group times a render
of the 4P12D example against `python -c "import yaml, jinja2, click"` (the libraries it cannot
start without), alternating run by run, so the machine's load falls on both alike. The package's
bytecode is compiled first, as `pip install` does (a checkout run under PYTHONDONTWRITEBYTECODE
otherwise compiles hpcserve's modules again in every process, ~70 ms on the 2-core machine).
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
                ("hpcserve render examples/kimi-k2-instruct-4p12d.yaml", "examples/kimi-k2-instruct-4p12d.yaml", 0.5),
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


def bench_ratio(runs: int = 31) -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "hpcserve")], check=True)
    sys.path.insert(0, str(ROOT / "bench"))
    from revision import alternate
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "job")

        def once(argv: list[str]) -> float:
            subprocess.run(["rm", "-rf", out], check=True)
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            return time.perf_counter() - t0
        times = alternate(runs, {
            "python -c 'import yaml, jinja2, click'":
                lambda: once([sys.executable, "-c", "import yaml, jinja2, click"]),
            "hpcserve render examples/kimi-k2-instruct-4p12d.yaml":
                lambda: once(HPCSERVE + ["render", "examples/kimi-k2-instruct-4p12d.yaml",
                                         "--out", out])})
    for label, samples in times.items():
        report(label, samples)
    base, render = (statistics.median(v) for v in times.values())
    print(f"{'ratio render / import yaml, jinja2, click':58} {render / base:.2f}"
          f"\nreproduce: .venv/bin/python bench/bench.py ratio", flush=True)


def bench_cli() -> None:
    report("hpcserve --help", timed(HPCSERVE + ["--help"]), 0.3)


GROUPS = {"render": bench_render, "ratio": bench_ratio, "cli": bench_cli}

if __name__ == "__main__":
    os.chdir(ROOT)
    for name in sys.argv[1:] or list(GROUPS):
        GROUPS[name]()
