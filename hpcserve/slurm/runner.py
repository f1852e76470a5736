"""The one seam through which hpcserve runs commands and touches job directories: locally, or
over SSH (slurm/ssh.py) with the same interface, so one behavioural test suite covers both.

A runner takes an argv (never a shell string) and returns rc/stdout/stderr; a failure names the
command, its exit code and what it printed.

Slurm's commands that ask slurmctld are asked again, a bounded number of times with growing
waits, while Slurm says the controller did not answer (busy or restarting: see
runtime/slurm_controller.py); one it still does not answer then is SlurmUnreachable, one line,
whether the caller checks the exit code or not: no caller may read an outage as an answer (a job
Slurm does not know, a deployment that ended).
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import HpcserveError
from ..runtime.slurm_controller import (RETRY_DELAYS_S, RETRY_WINDOW_S, controller_unreachable,
                                        not_configured, request_not_delivered, retry_delay)

# The commands that ask slurmctld (srun is not among them: it runs a step, which may have started
# when it fails, and `hpcserve bench` reports its exit itself).
SLURM_COMMANDS = frozenset({"squeue", "sacct", "scontrol", "sinfo", "scancel", "sbatch"})


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


class SlurmUnreachable(HpcserveError):
    """slurmctld did not answer a command through every try: one line with the command, Slurm's
    own words, and how long it was asked."""

    def __init__(self, res: Result, tries: int, seconds: float, note: str = "", where: str = ""):
        self.result = res
        words = " | ".join((res.err.strip() or res.out.strip()).splitlines()[-2:])
        super().__init__(f"Slurm controller unreachable: {short_command(res.argv)}{where}: {words} "
                         f"({tries} {'try' if tries == 1 else 'tries'} in {seconds:.0f} s){note}")


class SlurmNotConfigured(HpcserveError):
    """Slurm's commands are installed here but know no cluster: one line saying so, the
    command, its last words, and where hpcserve must run instead."""

    def __init__(self, res: Result, where: str = ""):
        words = (res.err.strip() or res.out.strip()).splitlines()[-1:]
        super().__init__(f"Slurm's commands here know no cluster: {short_command(res.argv)}{where}"
                         f" says {' '.join(words)!r} (no slurm.conf, no configless DNS record): "
                         "run hpcserve on a login node, set SLURM_CONF, or give --remote "
                         "USER@LOGIN before the command")


def short_command(argv) -> str:
    """The command as a person would name it: an output format's value is left out ('...')."""
    # -o is the format in squeue, sinfo and sacct (scontrol's -o is a flag: one line per record)
    takes = ("-o", "-O", "--format", "--Format") if posixpath.basename(str(argv[0])) in (
        "squeue", "sinfo", "sacct") else ()
    words, skip = [], False
    for a in argv:
        if skip:
            words.append("...")
        elif a.startswith(("--format=", "--Format=")):
            words.append(a.split("=", 1)[0] + "=...")
        else:
            words.append(a)
        skip = a in takes
    return shlex.join(words).replace("'...'", "...")


# After a submission the controller may have taken: sending it again could queue the job twice.
_MAYBE_SUBMITTED = ("; not sent again: the job may have been submitted all the same (look for it "
                    "with `squeue --me` once Slurm answers)")


class Runner:
    """What every runner shares: run() asks Slurm again while its controller does not answer.
    A runner provides run_once() (one try) and may set _where (' on HOST')."""

    _where = ""
    retry_delays = RETRY_DELAYS_S
    retry_window = RETRY_WINDOW_S
    sleep = staticmethod(time.sleep)     # tests replace these, so that they do not wait
    clock = staticmethod(time.monotonic)

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 60.0,
            env: dict[str, str] | None = None) -> Result:
        if posixpath.basename(str(argv[0])) not in SLURM_COMMANDS:
            return self.run_once(argv, check=check, timeout=timeout, env=env)
        t0, tries = self.clock(), 0
        while True:
            res = self.run_once(argv, check=False, timeout=timeout, env=env)
            tries += 1
            said = res.err + "\n" + res.out
            if res.rc != 0 and not_configured(said):
                raise SlurmNotConfigured(res, self._where)
            if res.rc == 0 or not controller_unreachable(said):
                break
            elapsed = self.clock() - t0
            if not _may_send_again(argv, said):
                raise SlurmUnreachable(res, tries, elapsed, _MAYBE_SUBMITTED, self._where)
            delay = retry_delay(tries, elapsed, self.retry_delays, self.retry_window)
            if delay is None:
                raise SlurmUnreachable(res, tries, elapsed, where=self._where)
            self.sleep(delay)
        if check and res.rc != 0:
            raise CommandError(res, self._where)
        return res

    def run_once(self, argv: list[str], *, check: bool = True, timeout: float = 60.0,
                 env: dict[str, str] | None = None) -> Result:
        raise NotImplementedError


def _may_send_again(argv, said: str) -> bool:
    """Every query may be asked again; a submission only where it never reached the controller
    (sbatch --test-only submits nothing)."""
    if posixpath.basename(str(argv[0])) != "sbatch" or "--test-only" in argv:
        return True
    return request_not_delivered(said)


def read_json(runner, path: str):
    """A JSON file through a runner (None: absent, unreadable or not JSON yet)."""
    text = runner.read_text(path)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


class LocalRunner(Runner):
    """Runs on this machine (the login node)."""

    name = "local"

    def __init__(self, env: dict[str, str] | None = None):
        self.env = env

    def run_once(self, argv: list[str], *, check: bool = True, timeout: float = 60.0,
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
        if os.path.lexists(dst):
            raise HpcserveError(f"{dst} exists: a job directory is made new, never one that "
                                "was there; refusing to write into it")
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.hpcserve-tmp-", dir=dst.parent))
        try:
            shutil.copytree(local_dir, tmp, dirs_exist_ok=True)
            os.chmod(tmp, os.stat(local_dir).st_mode & 0o7777)
            # rename(2) replaces a link or an empty directory made meanwhile with this tree
            # (never writes into it): refused all the same, as a path that was there
            if os.path.lexists(dst):
                raise HpcserveError(f"{dst} appeared while it was written; refusing it")
            os.rename(tmp, dst)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def expand_path(self, path: str) -> str:
        return str(Path(path).expanduser().resolve())

    def close(self) -> None:
        pass
