#!/usr/bin/env python3
"""A render of the 16-node 4P12D example, this checkout against another revision, in one run.

    .venv/bin/python bench/bench_render_vs.py REV [RUNS]

The revision is checked out into a temporary git worktree; both render with this venv's
python (the revision's package first on PYTHONPATH), alternating run by run so that the
machine's load falls on both alike. Prints each median and their ratio.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path

from revision import ROOT, alternate, checkout, hpcserve

EXAMPLE = "examples/kimi-k2-instruct-4p12d.yaml"


def render_once(root: Path, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    hpcserve(root, "render", str(root / EXAMPLE), "--out", str(out), capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    rev, runs = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 9
    with checkout(rev) as (base, tmp):
        times = alternate(runs, {rev: lambda: render_once(base, tmp / "out-base"),
                                 "this checkout": lambda: render_once(ROOT, tmp / "out-head")})
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:<16} median {med[k]:.3f} s  min {min(v):.3f}  max {max(v):.3f}  n={len(v)}")
    print(f"ratio (this checkout / {rev}): {med['this checkout'] / med[rev]:.2f}")


if __name__ == "__main__":
    main()
