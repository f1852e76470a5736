"""The step registry: every named step the job starts (an engine instance, the router, the
benchmark client), each the srun of its rendered steps/<name>.sh; how it is started, signalled
(through Slurm, by step id), waited for, and what its srun log says since this try started it.

An instance that recovery restarts runs again under the same name as a new attempt: its srun log
and Slurm's step name carry the attempt (".attempt2"), and the attempt before it is retired (no
longer watched; ended through its srun client if Slurm cannot end it on a lost node)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from .failures import srun_terminating
from .logs import read_from


class Steps:
    def __init__(self, job_dir: str):
        self.dir = job_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.offsets: dict[str, int] = {}    # step -> size of its srun log when it started
        self._seen: dict[str, int] = {}      # step -> how far terminating() has read its log
        self._tail: dict[str, str] = {}
        self.tags: dict[str, str] = {}        # step -> its attempt's tag ("" for the first)
        self.retired: list[subprocess.Popen] = []  # earlier attempts' srun clients

    def __contains__(self, name: str) -> bool:
        return name in self.procs

    def __getitem__(self, name: str) -> subprocess.Popen:
        return self.procs[name]

    def items(self):
        return self.procs.items()

    def srun_log(self, name: str) -> str:
        return os.path.join(self.dir, self.srun_log_rel(name))

    def srun_log_rel(self, name: str) -> str:
        return os.path.join("logs", f"{name}{self.tags.get(name, '')}.srun.log")

    def slurm_name(self, name: str) -> str:
        """The step's name in Slurm (its attempt's, for a restarted instance)."""
        return name + self.tags.get(name, "")

    def start(self, name: str, script: str, nodelist: list[str], tag: str = "") -> None:
        self.tags[name] = tag
        self._seen.pop(name, None)
        self._tail.pop(name, None)
        env = dict(os.environ, NODELIST=",".join(nodelist), HPCSERVE_ATTEMPT_TAG=tag,
                   HPCSERVE_ATTEMPT=tag[len(".attempt"):] or "0")
        # Appended to across requeues (logs/<step>.srun.log is read by that name elsewhere), so
        # readers start at the size the file had now.
        with open(self.srun_log(name), "ab") as out:
            self.offsets[name] = os.fstat(out.fileno()).st_size
            self.procs[name] = subprocess.Popen(["bash", os.path.join(self.dir, script)],
                                                env=env, stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL)

    def running(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def retire(self, name: str) -> subprocess.Popen | None:
        """Stop watching `name`'s current attempt (recovery stops and replaces it); its srun
        client is kept until it ended, so that the teardown can end it too."""
        p = self.procs.pop(name, None)
        if p is not None and p.poll() is None:
            self.retired.append(p)
        return p

    def end_retired(self) -> None:
        """SIGKILL to the srun clients of earlier attempts still running (the teardown's last
        word: Slurm ends their tasks with the job)."""
        for p in self.retired:
            if p.poll() is None:
                try:
                    p.kill()
                except OSError:
                    pass

    def live(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def this_try(self, name: str) -> str:
        """srun's log of `name` since this try started it."""
        return read_from(self.srun_log(name), self.offsets.get(name, 0))

    def terminating(self, name: str) -> bool:
        """Whether srun's log (this try's part) says it is terminating the step; read once per
        call from where the last read ended."""
        seen = self._seen.setdefault(name, self.offsets.get(name, 0))
        new = read_from(self.srun_log(name), seen)
        self._seen[name] = seen + len(new.encode())
        self._tail[name] = (self._tail.get(name, "") + new)[-4096:]
        return srun_terminating(self._tail[name])

    def wait(self, names: list[str], until: float) -> bool:
        """Whether all of `names` ended by `until`."""
        while time.time() < until:
            if all(self.procs[n].poll() is not None for n in names):
                return True
            time.sleep(0.05)
        return all(self.procs[n].poll() is not None for n in names)

    def kill_client(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal the srun client of `name` (not its tasks: Slurm signals those)."""
        try:
            self.procs[name].send_signal(sig)
        except OSError:
            pass

    def signal(self, names: list[str], sig: str, ids: dict[str, str], lost: set, slurm,
               log) -> None:
        """`sig` (TERM, KILL, ...) to every task of the running steps among `names`, through
        Slurm by step id."""
        for n in [n for n in names if n in lost and self.running(n)]:
            # A step on a lost node: Slurm cannot signal it there (scancel would block on the
            # dead slurmd); ending its srun client here is all that can be done.
            log(f"step {n} has a lost node: SIGKILL to its srun client")
            self.kill_client(n)
        names = [n for n in names if n not in lost]
        targets = [sid for n in names if self.running(n)
                   for sid in ids.get(self.slurm_name(n), "").split()]
        if targets:
            log(f"scancel --signal={sig} {' '.join(targets)}")
            err = slurm.command(["scancel", f"--signal={sig}", *targets], retry=False)
            if err:
                log(f"scancel failed: {err}")
        for n in names:  # a step Slurm does not list (yet): signal its srun client instead
            if self.running(n) and not ids.get(self.slurm_name(n)):
                log(f"step {n} not listed by squeue: {sig} to its srun client")
                self.kill_client(n, signal.SIGKILL if sig == "KILL" else signal.SIGTERM)
