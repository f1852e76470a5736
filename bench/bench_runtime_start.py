#!/usr/bin/env python3
"""How long the in-job runtime takes to start, this checkout against another revision, in one run.

    .venv/bin/python bench/bench_runtime_start.py REV [RUNS]

Each side renders the demo deployment into a job directory (the revision's package first on
PYTHONPATH), then the runtime is started there as job.sbatch starts it, up to its argument parser
(`--help`): a single hpcserve_job.py before the runtime became a package, `python3 -m
hpcserve_runtime` after. Whole processes, alternating run by run so that the machine's load falls
on both alike; prints each median and their ratio.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from revision import ROOT, alternate, checkout, hpcserve



def render(root: Path, out: Path) -> list[str]:
    """The job directory of examples/demo.yaml rendered by `root`; the runtime's argv there."""
    hpcserve(root, "render", str(root / "examples" / "demo.yaml"), "--out", str(out),
             capture_output=True)
    if (out / "hpcserve_job.py").is_file():
        return [sys.executable, str(out / "hpcserve_job.py"), "--help"]
    return [sys.executable, "-m", "hpcserve_runtime", "--help"]


def start_once(argv: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=cwd, capture_output=True, check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return time.perf_counter() - t0


def main() -> None:
    rev, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 21
    with checkout(rev) as (base, tmp):
        sides = {}
        for name, root in (("base", base), ("this", ROOT)):
            out = tmp / f"job-{name}"
            argv = render(root, out)
            sides[name] = lambda argv=argv, out=out: start_once(argv, out)
        times = alternate(runs, sides)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"runtime start, median of {runs}: {rev} {med['base'] * 1000:.1f} ms, this checkout "
          f"{med['this'] * 1000:.1f} ms, ratio {med['this'] / med['base']:.2f}")


if __name__ == "__main__":
    main()
