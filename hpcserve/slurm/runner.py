"""The one seam through which hpcserve runs commands and touches job directories: locally, or
over SSH (slurm/ssh.py) with the same interface, so one behavioural test suite covers both.

A runner takes an argv (never a shell string) and returns rc/stdout/stderr; a failure names the
command, its exit code and what it printed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import HpcserveError


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    out: str
    err: str


class CommandError(HpcserveError):
    def __init__(self, res: Result, where: str = ""):
        self.result = res
        msg = f"`{shlex.join(res.argv)}`{where} failed with exit code {res.rc}"
        detail = (res.err.strip() or res.out.strip()).splitlines()
        if detail:
            msg += ": " + " | ".join(detail[-3:])
        super().__init__(msg)


def read_json(runner, path: str):
    """A JSON file through a runner (None: absent, unreadable or not JSON yet)."""
    text = runner.read_text(path)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


class LocalRunner:
    """Runs on this machine (the login node)."""

    name = "local"

    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 60.0,
            env: dict[str, str] | None = None) -> Result:
        full = {**(self.env if self.env is not None else os.environ), **(env or {})}
        try:
            p = subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace",
                               env=full, timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise HpcserveError(f"`{argv[0]}` not found: is Slurm's client installed and on PATH?"
                                ) from None
        except subprocess.TimeoutExpired:
            raise HpcserveError(f"`{shlex.join(argv)}` did not finish within {timeout:.0f} s"
                                ) from None
        res = Result(tuple(argv), p.returncode, p.stdout, p.stderr)
        if check and p.returncode != 0:
            raise CommandError(res)
        return res

    def read_text(self, path: str) -> str | None:
        try:
            return Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def list_dir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except OSError:
            return []

    def put_tree(self, local_dir: str, remote_dir: str) -> None:
        """Copy a rendered job directory into place whole: into a hidden sibling, then rename."""
        dst = Path(remote_dir)
        if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
            raise HpcserveError(f"{dst} exists and is not empty (or not a directory); refusing to "
                                "overwrite it")
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.parent / f".{dst.name}.hpcserve-tmp-{os.getpid()}"
        try:
            shutil.copytree(local_dir, tmp)
            if dst.exists():
                dst.rmdir()
            os.rename(tmp, dst)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def expand_path(self, path: str) -> str:
        return str(Path(path).expanduser().resolve())

    def close(self) -> None:
        pass
