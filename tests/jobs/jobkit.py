"""Helpers for real jobs on the local Slurm cluster: submit rendered job directories with plain
sbatch as an unprivileged user, read state.json, list and find the job's processes per node (by
PID, per namespace)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import jsonschema
import yaml

from hpcserve.author import config, plan
from hpcserve.author.render import render_files, write_job
from hpcserve.runtime.contract import STATE_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
# The unprivileged user the test jobs run as, as a cluster's users do: never root, whose jobs
# would hide every permission the runtime assumes (scripts/setup.sh, as root, makes it).
OWNER = "hpcserve-a"
TERMINAL = {"cancelled", "failed", "done"}
_STATE = jsonschema.Draft202012Validator(STATE_SCHEMA)
# A role whose failed instance is not replaced: its failure ends the deployment, named (the
# failure tests check the naming; test_recovery.py the replacing).
NO_RESTART = {"recovery": {"restart": False}}  # built once: wait() reads state often


def deployment(prefill_nodes: int = 1, decode_nodes: int = 1, **over: Any) -> dict:
    d = {
        "name": "t-pd",
        "site": "local",
        "model": {"profile": "kimi-k2-instruct", "path": "/models/Kimi-K2-Instruct",
                  "served_name": "kimi-k2"},
        "engine": {"name": "sglang", "version": "0.5.23", "simulate": True},
        "time_limit": "00:10:00",
        "roles": {"prefill": {"nodes": prefill_nodes}, "decode": {"nodes": decode_nodes}},
        "router": {"port": 8000},
        "readiness": {"engine_timeout": 60, "router_timeout": 30, "poll_interval": 0.1},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return d


def vllm_deployment(roles: dict, **over: Any) -> dict:
    """A simulated vLLM 0.33.0 deployment of Kimi-K2 on the local cluster, vllm-router in front."""
    d = deployment(**over)
    d["name"] = over.get("name", "t-vllm")
    d["engine"] = {"name": "vllm", "version": "0.33.0", "simulate": True}
    d["roles"] = roles
    return d


def python_without_hpcserve(root: Path, python: str) -> Path:
    """A python3 for the job's nodes as a site has it: `python` (the venv's, for mpi4py and the
    routers' own imports) on which `import hpcserve` fails, so that a runtime which needs
    hpcserve installed fails every job test. A sitecustomize on its PYTHONPATH puts a finder
    ahead of every other (the editable install's own finder included) that refuses hpcserve."""
    d = root / "no-hpcserve"
    d.mkdir(parents=True, exist_ok=True)
    (d / "sitecustomize.py").write_text(_NO_HPCSERVE)
    wrapper = d / "python3"
    wrapper.write_text("#!/bin/sh\n"
                       f'PYTHONPATH={shlex.quote(str(d))}${{PYTHONPATH:+:$PYTHONPATH}} '
                       f'exec {shlex.quote(python)} "$@"\n')
    wrapper.chmod(0o755)
    r = subprocess.run([str(wrapper), "-c", "import hpcserve"], capture_output=True, text=True)
    assert r.returncode == 1 and "not installed on the nodes" in r.stderr, r.stderr
    return wrapper


_NO_HPCSERVE = """import sys


class _NoHpcserve:
    def find_spec(self, name, path=None, target=None):
        if name == "hpcserve" or name.startswith("hpcserve."):
            raise ImportError("hpcserve is not installed on the nodes: the job must not need it")
        return None


sys.meta_path.insert(0, _NoHpcserve())
"""


def chown_tree(top: Path, user: str = OWNER) -> None:
    """What `hpcserve submit` run by `user` would have left: the job directory theirs."""
    pw = pwd.getpwnam(user)
    for d, dirs, files in os.walk(top):
        for name in [d, *(os.path.join(d, n) for n in dirs + files)]:
            os.lchown(name, pw.pw_uid, pw.pw_gid)


def owners_jobs(cluster: Any, user: str = OWNER) -> Path:
    """The folder of `user`'s job directories beside the cluster's state, theirs."""
    jobs = Path(cluster.state_dir).parent / f"jobs-of-{user}"
    jobs.mkdir(mode=0o755, exist_ok=True)
    shutil.chown(jobs, user, user)
    return jobs


def hand_over(tmp_path: Path, user: str = OWNER) -> None:
    """A test's tmp_path made `user`'s, and the folders above it passable (o+x, not readable):
    what the test prepared there for a job of theirs (a stand-in, a config, a model) is theirs,
    as a user's own files would be."""
    chown_tree(tmp_path, user)
    for d in tmp_path.parents:
        if d in (Path("/tmp"), Path("/")):
            break
        os.chmod(d, os.stat(d).st_mode | 0o011)


def owners_env(cluster: Any, tmp_path: Path, site_python: Path) -> dict:
    """The environment of the jobs' user's shell on the login node: the cluster's Slurm, the
    site's python3 first on PATH (the routers hpcserve checks for at submit), and an index of
    hpcserve's deployments for this test alone."""
    e = cluster.client_env()
    return {**e, "PATH": f"{site_python}/bin{os.pathsep}{e['PATH']}",
            "HPCSERVE_STATE_DIR": str(tmp_path / "state")}


def _on_nodes_python(dep: dict, python: Path) -> dict:
    """The deployment with site.paths.python pointed at `python`, unless the test set its own."""
    site = dep.get("site", "local")
    if isinstance(site, str):
        site = {"base": site}
    if "python" in site.get("paths", {}):
        return dep
    return {**dep, "site": {**site, "paths": {**site.get("paths", {}), "python": str(python)}}}


@contextlib.contextmanager
def submitter(cluster: Any, tmp_path: Path, site_python: Path) -> Iterator[Callable[..., "Job"]]:
    """submit(dep, edit=None, extra_env=None) -> Job: the deployment dict rendered as OWNER's
    `hpcserve submit` would (the plan for their user, the job directory theirs, `edit` applied
    to the rendered files first) and handed to sbatch for them (--uid, as root may), with their
    environment and the site's python (no hpcserve in it, as on a site's nodes). Each job is
    cancelled at the end, Slurm waited on, its processes gone and its directory removed."""
    env = cluster.client_env()   # the test's own: Slurm's commands as root, Job.env
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    owner = pwd.getpwnam(OWNER)
    nodes_python = python_without_hpcserve(Path(cluster.state_dir).parent,
                                           str(site_python / "bin" / "python3"))
    jobs: list[Job] = []

    def submit(dep: dict, edit: Callable[[Path], None] | None = None,
               extra_env: dict[str, str] | None = None) -> Job:
        dep = _on_nodes_python(dep, nodes_python)
        f = tmp_path / f"{dep['name']}.yaml"
        f.write_text(yaml.safe_dump(dep))
        p = plan.build(dataclasses.replace(config.load(f), user=OWNER))
        job_dir = owners_jobs(cluster) / f"{dep['name']}-{len(jobs)}-{time.time_ns()}"
        write_job(render_files(p, str(job_dir)), job_dir)
        if edit:
            edit(job_dir)
        chown_tree(job_dir)
        hand_over(tmp_path)
        # the environment of this moment, theirs: sbatch exports it to the job (secrets given
        # by name among it)
        job_env = {**cluster.client_env(), "HOME": owner.pw_dir, "USER": OWNER,
                   "LOGNAME": OWNER, "PATH": f"{site_python}/bin{os.pathsep}{os.environ['PATH']}",
                   **(extra_env or {})}
        r = subprocess.run(["sbatch", "--parsable", f"--uid={OWNER}", f"--gid={OWNER}",
                            str(job_dir / "job.sbatch")], env=job_env, capture_output=True,
                           text=True, timeout=30, cwd=job_dir)
        assert r.returncode == 0, r
        jobs.append(Job(cluster, job_dir, r.stdout.strip().split(";")[0], env))
        return jobs[-1]

    try:
        yield submit
    finally:
        for j in jobs:  # whatever a test left: cancel it and wait until Slurm has it gone
            subprocess.run(["scancel", j.id], env=env, capture_output=True, timeout=30)
        for j in jobs:
            j.squeue_gone(60)
        wait_no_job_processes(cluster, 30)
        for j in jobs:
            shutil.rmtree(j.dir, ignore_errors=True)


def until(what: str, ok, timeout: float, poll: float = 0.05, why=lambda: ""):
    """ok()'s first truthy value, asked every `poll` s; the test fails after `timeout` s naming
    `what` (and why(), what the caller can say of the state then)."""
    end = time.time() + timeout
    while time.time() < end:
        got = ok()
        if got:
            return got
        time.sleep(poll)
    raise AssertionError(f"no {what} within {timeout} s\n{why()}")


class Job:
    def __init__(self, cluster: Any, job_dir: Path, job_id: str, env: dict):
        self.cluster = cluster
        self.dir = job_dir
        self.id = job_id
        self.env = env

    @property
    def key(self) -> str:
        """The deployment's API key, which submit made in its job directory (its front's, for
        an instance job): what a client of the endpoint bears."""
        spec = json.loads((self.dir / "plan.json").read_text())["api_key"]
        return Path(spec["file"]).read_text().strip()

    def state(self) -> dict:
        """state.json as the job last wrote it, checked against its declared schema (every
        state a job test reads is one the operator commands may be handed)."""
        try:
            st = json.loads((self.dir / "state.json").read_text())
        except (OSError, ValueError):
            return {"phase": "pending", "history": []}
        _STATE.validate(st)
        return st

    def wait(self, phases: set[str], timeout: float = 60, restarts: int | None = None) -> dict:
        """The state once its phase is one of phases (in the try after `restarts` requeues,
        when given)."""
        end = time.time() + timeout
        while time.time() < end:
            st = self.state()
            if st.get("phase") in phases and restarts in (None, st.get("restarts")):
                return st
            time.sleep(0.05)
        raise AssertionError(f"job {self.id} did not reach {phases} in {timeout}s; state: "
                             f"{json.dumps(self.state(), indent=1)}\n{self.logs()}")

    def wait_until(self, pred, timeout: float = 60) -> dict:
        """The state once pred(state) is true (a state without the keys pred reads is not)."""
        end = time.time() + timeout
        while time.time() < end:
            st = self.state()
            try:
                if pred(st):
                    return st
            except (KeyError, IndexError, TypeError):
                pass
            time.sleep(0.05)
        raise AssertionError(f"job {self.id}: the condition did not hold in {timeout}s; state: "
                             f"{json.dumps(self.state(), indent=1)}\n{self.logs()}")

    def node_rows(self, inst: str) -> list[list[str]]:
        """run/<inst>.nodes as the runtime wrote it: [rank, node, address, interface, ib]."""
        text = (self.dir / "run" / f"{inst}.nodes").read_text()
        return [ln.split() for ln in text.splitlines()]

    def logs(self) -> str:
        out = []
        for p in sorted((self.dir / "logs").glob("*")):
            out.append(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:]))
        return "\n".join(out)

    def squeue_gone(self, timeout: float = 30) -> None:
        end = time.time() + timeout
        while time.time() < end:
            out = subprocess.run(["squeue", "-h", "-j", self.id, "-o", "%T"], env=self.env,
                                 capture_output=True, text=True).stdout.split()
            if not out or all(s not in ("RUNNING", "PENDING", "COMPLETING", "CONFIGURING")
                              for s in out):
                return
            time.sleep(0.1)
        raise AssertionError(f"job {self.id} still in squeue")

    def scancel(self) -> None:
        subprocess.run(["scancel", self.id], env=self.env, check=True)


def node_processes(cluster: Any) -> dict[str, set[int]]:
    """PIDs in each node's network namespace except the node's own slurmd: the job's processes."""
    daemons = set(cluster.recorded_pids().values())
    out = {}
    for node, ns in cluster.netns_names().items():
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        procs = set()
        for p in pids.split():
            pid = int(p)
            if pid in daemons or _parent_is(pid, daemons) and _comm(pid) == "slurmd":
                continue
            if _comm(pid) in ("slurmd",):
                continue
            procs.add(pid)
        out[node] = procs
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _parent_is(pid: int, pids: set[int]) -> bool:
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return False
    return ppid in pids


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def find_pid(cluster: Any, node: str, pattern: str) -> int:
    for pid in node_processes(cluster)[node]:
        if re.search(pattern, cmdline(pid)):
            return pid
    raise AssertionError(f"no process matching {pattern!r} on {node}: "
                         + "; ".join(cmdline(p) for p in node_processes(cluster)[node]))


def fire_fault(cluster: Any, node: str, attempt: int = 0) -> int:
    """SIGUSR1 to the simulated engine's process on `node` in instance attempt `attempt`: a
    sim_fault with on_signal fires now, when the test knows the deployment serves, instead of
    at a time from start that a loaded machine may not have reached serving by. Returns its PID
    (its python, never a wrapper shell, which SIGUSR1 would end)."""
    for pid in sorted(node_processes(cluster)[node]):
        argv = cmdline(pid).split()
        if not argv or not Path(argv[0]).name.startswith("python") \
                or not any(a.endswith("hpcserve_sim.py") for a in argv):
            continue
        if environ(pid).get("HPCSERVE_ATTEMPT", "0") == str(attempt):
            os.kill(pid, signal.SIGUSR1)
            return pid
    raise AssertionError(f"no simulated engine of attempt {attempt} on {node}: "
                         + "; ".join(cmdline(p) for p in node_processes(cluster)[node]))


def environ(pid: int) -> dict[str, str]:
    """A process's environment ({} where it cannot be read, or it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.decode(errors="replace").partition("=")[::2] for kv in raw.split(b"\0") if kv)


def wait_no_job_processes(cluster: Any, timeout: float) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        left = {n: p for n, p in node_processes(cluster).items() if p}
        if not left:
            return time.time() - t0
        time.sleep(0.05)
    left = {n: [cmdline(p) for p in ps] for n, ps in node_processes(cluster).items() if ps}
    raise AssertionError(f"job processes still running after {timeout}s: {left}")


# A sample line of Prometheus's text exposition format: name{label="value",...} value [time]
_SAMPLE = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*'
                     r'(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})?'
                     r' [-+]?([0-9.]+([eE][-+]?[0-9]+)?|NaN|Inf)( -?[0-9]+)?')


def scrape(target: str, labels: dict) -> set[str]:
    """One scrape of a file-SD target as Prometheus makes it (at its __metrics_path__, else
    /metrics): the metric names, after checking the answer is Prometheus text (its content type,
    and every sample line in the format)."""
    url = f"http://{target}{labels.get('__metrics_path__', '/metrics')}"
    with urllib.request.urlopen(url, timeout=10) as r:
        ctype, text = r.headers.get("Content-Type", ""), r.read().decode()
    assert ctype.startswith("text/plain"), (url, ctype)
    samples = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    bad = [ln for ln in samples if not _SAMPLE.fullmatch(ln)]
    assert samples and not bad, (url, bad[:3], text[:300])
    return {ln.split("{", 1)[0].split(" ", 1)[0] for ln in samples}


def chat(url: str, max_tokens: int, stream: bool = False, timeout: float = 30,
         key: str | None = None) -> Any:
    """One chat request to `url`, bearing the deployment's API key `key` (None: none)."""
    body = {"model": "kimi-k2", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": "hello there"}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  **({"Authorization": f"Bearer {key}"} if key else {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        if not stream:
            return json.load(r)
        events = []
        for line in r.read().decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
        return events




# Each phase is rounded to the millisecond on its own, and so are unknown_s and the total.
def _rounding(n: int) -> float:
    return (n + 2) * 0.0005


# The deployment phases of a job without staging or an image import (docs/operating.md).
STARTUP_PHASES = ["job_setup", "preflight", "engine_load", "engine_warmup",
                  "router_registration", "smoke_request"]


def check_startup(st: dict, job_dir: Path, weights_line: str) -> None:
    """Every start-up phase present and known, the deployment's and each instance's (with
    unknown_s) summing to what was measured, each instance's engine lines seen and its weights
    line (the engine's own words) in its log."""
    s = st["startup"]
    assert list(s["phases"]) == STARTUP_PHASES, s
    assert None not in s["phases"].values() and s["unknown_s"] == 0, s
    assert s["total_s"] == st["serving_after_s"]
    assert abs(sum(s["phases"].values()) + s["unknown_s"] - s["total_s"]) <= \
        _rounding(len(s["phases"]) + 1), s
    assert s["queue_wait_s"] is not None and s["queue_wait_s"] >= 0, s  # scontrol answered
    for name, inst in s["instances"].items():
        assert inst["lines_seen"] == ["ready", "weights_loaded"], (name, inst)
        assert None not in inst["phases"].values(), (name, inst)
        assert abs(sum(inst["phases"].values()) + inst["unknown_s"] - inst["total_s"]) <= \
            _rounding(len(inst["phases"]) + 1), (name, inst)
        assert weights_line in (job_dir / inst["log"]).read_text(errors="replace"), inst["log"]
    slow = s["slowest"]
    assert slow["total_s"] == max(i["total_s"] for i in s["instances"].values()), s
    assert slow["phase_s"] == max(s["instances"][slow["instance"]]["phases"].values())
    log = (job_dir / "logs" / "hpcserve-job.log").read_text()
    assert f"slowest instance: {slow['instance']}" in log


class Load:
    """Chat requests through the router from `clients` threads, one after another each (`pause`
    s between two of a thread): every request's start, end, and error (None when it returned
    its tokens). one() sends one request: a subclass may send another kind."""

    def __init__(self, url: str, clients: int = 2, tokens: int = 8, pause: float = 0.0,
                 key: str | None = None):
        self.url, self.tokens, self.pause, self.key = url, tokens, pause, key
        self.results: list[tuple[float, float, str | None]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.JOIN_S)

    JOIN_S = 30  # s a thread's last request may take to end (one() times out before)

    def one(self) -> str | None:
        """One request: its error, or None."""
        got = chat(self.url, self.tokens, timeout=20, key=self.key)["usage"]["completion_tokens"]
        return None if got == self.tokens else f"{got} tokens"

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.time()
            try:
                err = self.one()
            except Exception as e:  # every failure is counted, whatever it is
                err = repr(e)
            self.results.append((t0, time.time(), err))
            self._stop.wait(self.pause)

    def failures(self) -> list[tuple[float, float, str]]:
        return [r for r in self.results if r[2] is not None]

    def ok_between(self, t0: float, t1: float) -> int:
        return sum(1 for s, e, err in self.results if err is None and s >= t0 and e <= t1)


def requests_in(log_path) -> int:
    """Generation requests an engine's own log shows."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return sum(1 for ln in text.splitlines() if '"POST ' in ln or "POST /" in ln)
