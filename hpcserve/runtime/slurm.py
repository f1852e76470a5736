"""What the job asks Slurm, and tells it: every query through one place, retried with backoff
while the controller is busy or restarting, read with the parsers the operator commands use.

A controller that does not answer within the retries is not an answer: a query then raises
Unreachable, and each caller says what it falls back to (the serving deployment goes on; a
TERM whose cause cannot be asked is not called a cancel).
"""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import contextmanager

from .slurm_cluster import NODE_STATES_FORMAT, config_argv, parse_config, parse_node_states
from .slurm_controller import RETRY_DELAYS_S, RETRY_WINDOW_S, controller_unreachable, retry_delay
from .slurm_jobs import TERMINAL_STATES
from .slurm_queue import parse_steps, steps_argv
from .slurm_scontrol import parse_scontrol_fields
from .slurm_values import parse_duration


class Unreachable(Exception):
    """The controller did not answer a query through all its tries."""

    def __init__(self, argv: list[str], words: str, tries: int):
        self.argv, self.words, self.tries = argv, words, tries
        super().__init__(f"Slurm controller unreachable: {' '.join(argv)}: {words} "
                         f"({tries} {'try' if tries == 1 else 'tries'})")


class Slurm:
    TIMEOUT = 10.0  # s for one command

    def __init__(self, job_id: str, pause=time.sleep, delays=RETRY_DELAYS_S,
                 window: float = RETRY_WINDOW_S):
        self.job_id = job_id
        self.pause = pause        # how to wait between tries (the job's watches signals)
        self.delays, self.window = delays, window
        self._config: dict | None = None
        self._slurmd: dict | None = None

    @contextmanager
    def within(self, seconds: float):
        """Queries in this block give up on an absent controller after `seconds` (a teardown's
        grace is running), not after the whole retry window."""
        saved, self.window = self.window, min(self.window, seconds)
        try:
            yield
        finally:
            self.window = saved

    # -- the one way a command runs
    def run(self, argv: list[str], retry: bool = True, timeout: float | None = None,
            env: dict | None = None) -> str:
        """The command's stdout. A failure other than an unreachable controller raises
        RuntimeError with Slurm's words; an unreachable one is retried (unless retry is False)
        and then raises Unreachable."""
        tries, t0 = 0, time.monotonic()
        while True:
            tries += 1
            try:
                res = subprocess.run(argv, capture_output=True, text=True,
                                     timeout=timeout or self.TIMEOUT, env=env)
            except subprocess.TimeoutExpired:
                words = f"no answer within {timeout or self.TIMEOUT:g} s"
            except OSError as e:
                raise RuntimeError(f"{argv[0]}: {e}") from None
            else:
                if res.returncode == 0:
                    return res.stdout
                words = (res.stderr or res.stdout).strip()
                if not controller_unreachable(words):
                    raise RuntimeError(words or f"{argv[0]} exited {res.returncode}")
            delay = retry_delay(tries, time.monotonic() - t0, self.delays, self.window) \
                if retry else None
            if delay is None or self.pause(delay) is False:
                raise Unreachable(argv, words, tries)

    def command(self, argv: list[str], retry: bool = True) -> str:
        """Run a command that changes something; its error text, or '' when it succeeded."""
        try:
            self.run(argv, retry=retry, timeout=30)
            return ""
        except (RuntimeError, Unreachable) as e:
            return str(e)

    # -- the job
    def records(self) -> list[dict]:
        """`scontrol -o show job`: one key=value record per component of this job."""
        if not self.job_id:
            return []
        return parse_scontrol_fields(self.run(["scontrol", "-o", "show", "job", self.job_id]))

    def time_left(self, retry: bool = True) -> int | None:
        """Seconds until the job's time limit (squeue %L)."""
        if not self.job_id:
            return None
        out = self.run(["squeue", "-h", "-j", self.job_id, "-o", "%L"], retry=retry,
                       timeout=5).split()
        return parse_duration(out[0]) if out else None

    def job_alive(self, job_id: str) -> bool | None:
        """Whether another job (a twin's, a slot's) is still on its way or running for Slurm;
        None where the controller does not answer. squeue -j lists an ended job for a while
        (MinJobAge), its end state saying so, and refuses an id it no longer knows."""
        try:
            state = self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], retry=False,
                             timeout=5).strip()
        except RuntimeError as e:
            return False if "invalid job id" in str(e).lower() else None
        except Unreachable:
            return None
        return bool(state) and state.split()[0] not in TERMINAL_STATES

    def submit(self, script: str) -> str:
        """`sbatch --parsable SCRIPT`: the new job's id. Not retried: a controller that took
        the job but did not answer would get it twice (the caller tries again later)."""
        # this job's own SLURM_* (its restart count, its nodes) are not the new job's: it gets
        # the environment a login shell hands sbatch (SLURM_CONF and SBATCH_* kept)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        out = self.run(["sbatch", "--parsable", script], retry=False, timeout=30,
                       env=env).strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise RuntimeError(f"sbatch {script}: no job id in its answer {out!r}")
        return job_id

    def component_ids(self) -> list[str]:
        """Each het component's own job id: `squeue --steps -j LEADER` lists only component 0's
        steps (Slurm 22.05), so the others must be named by their own ids."""
        n = int(os.environ.get("SLURM_HET_SIZE") or 0)
        ids = [os.environ.get(f"SLURM_JOB_ID_HET_GROUP_{i}", "") for i in range(n)]
        return [i for i in ids if i] or ([self.job_id] if self.job_id else [])

    def step_ids(self, retry: bool = True) -> dict[str, str]:
        """step name -> its step ids, space-separated (a name may run as several steps)."""
        comps = self.component_ids()
        if not comps:
            return {}
        ids: dict[str, list[str]] = {}
        for s in parse_steps(self.run(steps_argv(comps), retry=retry)):
            ids.setdefault(s.name, []).append(s.step_id)
        return {k: " ".join(v) for k, v in ids.items()}

    def config(self, key: str) -> str | None:
        """A value of `scontrol show config` (asked once per job)."""
        if self._config is None:
            self._config = parse_config(self.run(config_argv(), timeout=5))
        return self._config.get(key)

    # -- the nodes
    def node_states(self, names: list[str], retry: bool = True) -> dict[str, str]:
        """node -> its compact sinfo state."""
        if not names:
            return {}
        return parse_node_states(self.run(
            ["sinfo", "-h", "-N", "-n", ",".join(names), "-o", NODE_STATES_FORMAT],
            retry=retry))

    def slurmd_addresses(self, names: list[str]) -> dict:
        """node -> (address, slurmd port), from `scontrol show node` (asked once)."""
        if self._slurmd is None:
            recs = parse_scontrol_fields(
                self.run(["scontrol", "-o", "show", "node", ",".join(names)]), first="NodeName")
            conf = self.config("SlurmdPort") or ""
            default_port = int(conf) if conf.isdigit() else 6818
            # a node's own Port= where slurm.conf gives one, else SlurmdPort for all
            self._slurmd = {r["NodeName"]: (r["NodeAddr"], int(r["Port"]) if r.get(
                "Port", "").isdigit() else default_port) for r in recs
                if r.get("NodeName") and r.get("NodeAddr")}
        return self._slurmd
