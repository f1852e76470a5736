"""What the benchmarks that compare this checkout with another revision share: the revision
checked out into a temporary git worktree, and runs that alternate between the sides so that the
machine's load falls on both alike."""

from __future__ import annotations

import atexit
import os
import shutil
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


# Each side imports its own hpcserve: `python -c` puts its working directory first on sys.path,
# and the project venv's editable install maps this checkout's package and its top-level data
# folders (pyproject.toml's package-dir) for every side. So each side runs in a folder of its
# own that holds what `pip install` would lay out: its hpcserve/ with the mapped folders inside.
CLI = "import sys; from hpcserve.cli import main; sys.argv[0] = 'hpcserve'; main()"
_LAID_OUT: dict[Path, Path] = {}


def _laid_out(root: Path) -> Path:
    if root not in _LAID_OUT:
        side = Path(tempfile.mkdtemp(prefix="hpcserve-side-"))
        atexit.register(shutil.rmtree, side, True)
        pkg = side / "hpcserve"
        pkg.mkdir()
        for entry in (root / "hpcserve").iterdir():
            (pkg / entry.name).symlink_to(entry)
        for name, folder in (("sbatch_templates", "sbatch_templates"),
                             ("site_configs", "site_configs"),
                             ("container_recipes", "containers")):
            if not (pkg / name).exists():
                (pkg / name).symlink_to(root / folder)
        _LAID_OUT[root] = side
    return _LAID_OUT[root]


def hpcserve(root: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """`hpcserve ARGS` as the checkout at `root` runs it (paths in ARGS absolute)."""
    side = _laid_out(root)
    env = {**kw.pop("env", os.environ), "PYTHONPATH": str(side)}
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=side, env=env, check=True,
                          **kw)


def alternate(runs: int, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    """Each side's timings, one run of every side per round."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(runs):
        for name, once in sides.items():
            times[name].append(once())
    return times
