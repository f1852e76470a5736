"""What the benchmarks that compare this checkout with another revision share: the revision
checked out into a temporary git worktree, and runs that alternate between the sides so that the
machine's load falls on both alike."""

from __future__ import annotations

import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def checkout(rev: str) -> Iterator[tuple[Path, Path]]:
    """(the revision's worktree, a scratch directory), both removed afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base),
                        rev], check=True)
        try:
            yield base, Path(tmp)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False)


def alternate(runs: int, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each side's timings, one run of every side per round."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(runs):
        for name, once in sides.items():
            times[name].append(once())
    return times
