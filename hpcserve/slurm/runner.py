"""The one seam through which hpcserve runs commands: locally now, over SSH later.

A runner takes an argv (never a shell string) and returns rc/stdout/stderr; a failure names the
command, its exit code and what it printed.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass

from ..errors import HpcserveError


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    rc: int
    out: str
    err: str


class CommandError(HpcserveError):
    def __init__(self, res: Result):
        self.result = res
        msg = f"`{shlex.join(res.argv)}` failed with exit code {res.rc}"
        detail = (res.err.strip() or res.out.strip()).splitlines()
        if detail:
            msg += ": " + " | ".join(detail[-3:])
        super().__init__(msg)


class LocalRunner:
    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 60.0) -> Result:
        try:
            p = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout,
                               stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise HpcserveError(f"`{argv[0]}` not found: is Slurm's client installed and on PATH?"
                                ) from None
        res = Result(tuple(argv), p.returncode, p.stdout, p.stderr)
        if check and p.returncode != 0:
            raise CommandError(res)
        return res
