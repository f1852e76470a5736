"""What the benchmarks that compare this checkout with another revision share: the revision
checked out into a temporary git worktree, and runs that alternate between the sides so that the
machine's load falls on both alike."""

from __future__ import annotations

import os
import subprocess
import sys
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
        compile_package(base)
        compile_package(ROOT)
        try:
            yield base, Path(tmp)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False)


def compile_package(root: Path) -> None:
    """hpcserve's bytecode, written once as `pip install` writes it: a checkout run under
    PYTHONDONTWRITEBYTECODE would compile its modules again in every process, and only the side
    without bytecode would pay for it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "hpcserve")], check=True)


# `python -c` puts its working directory first on sys.path (before PYTHONPATH), and the project
# venv's editable install finds this checkout: each side runs in its own root, with that root on
# PYTHONPATH as well, so that the revision's hpcserve is the one imported.
CLI = "import sys; from hpcserve.cli import main; sys.argv[0] = 'hpcserve'; main()"


def hpcserve(root: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """`hpcserve ARGS` as the checkout at `root` runs it (paths in ARGS absolute)."""
    env = {**kw.pop("env", os.environ), "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=root, env=env, check=True,
                          **kw)


def alternate(runs: int, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each side's timings, one run of every side per round."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(runs):
        for name, once in sides.items():
            times[name].append(once())
    return times
