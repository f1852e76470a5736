#!/usr/bin/env python3
"""Recovery of one failed instance while the others serve, on the local Slurm cluster (needs
root; starts and stops its own cluster):

    .venv/bin/python bench/bench_recovery.py [runs]

The deployment: PD, 1 prefill and 2 decode instances of one node each, simulated SGLang 0.5.23
ready at once (sim_startup_delay 0; 0.01 s per decode token, as tests/jobs/test_recovery.py, so
that requests are in flight), the real sglang-router in front, decode recovery backoff_s 0,
liveness at the test settings {interval: 0.5, timeout: 1, failures: 3} (a SIGKILLed engine is
noticed by its step's end, not by the probes). Every run is a fresh job:

1. baseline, in that job before it serves: decode-1's step started (the job log's "started 3
   engine instance(s)", just after the steps' Popen) -> its engine answers GET /health (polled
   from this host every 10 ms). That is what a replacement cannot avoid: a Slurm step launched
   and the engine up (here with the other two instances starting beside it).
2. once it serves, 4 client threads send short chat requests (8 tokens) through the router;
   decode-1's engine process is SIGKILLed by PID. Watched from this host every 10 ms: its srun
   client exits (Slurm's part of noticing), the router stops listing it (GET /workers), its new
   engine answers /health, the router lists it again. From state.json's instances.decode-1:
   noticed (attempts[0].ended_at), new attempt started (attempts[1].started_at), serving again
   (attempts[1].serving_at; recover_s counts from noticed).
3. the requests of that load that failed: started before the kill (in flight then: only those
   on the dead decode can fail), after the kill but before the router had decode-1 out, and
   after it was out (target 0); and the router's own failed tries at decode-1 (router.log),
   which it sends again to the other decode, unseen by the client.
Medians of `runs` (default 5) jobs.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from bench_job import sim_pid, state, wait  # bench/ is sys.path[0]; it puts the checkout on it

from hpcserve.author import config, plan  # noqa: E402
from hpcserve.devcluster.cluster import DevCluster  # noqa: E402
from hpcserve.runtime.contract import API_KEY_FILE  # noqa: E402
from hpcserve.author.render import render_files, write_job  # noqa: E402

DEPLOY = """
name: bench-recovery
site: local
model: {profile: kimi-k2-instruct, path: /models/k2, served_name: kimi-k2}
engine: {version: "0.5.23", simulate: true, sim_startup_delay: 0, sim_decode_s_per_token: 0.01}
roles:
  prefill: {nodes: 1}
  decode: {nodes: 1, instances: 2, recovery: {backoff_s: 0}}
readiness: {engine_timeout: 60, poll_interval: 0.1}
liveness: {interval: 0.5, timeout: 1, failures: 3, node_interval: 1}
"""
CLIENTS, TOKENS = 4, 8
VICTIM = "decode-1"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def machine() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                  .splitlines() if ln.startswith("model name")), platform.processor() or "?")
    load = Path("/proc/loadavg").read_text().split()[:3]
    return f"{os.cpu_count()} cores, {model}, load average {' '.join(load)} at the start"


def answers(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=0.5) as r:
            return r.status == 200
    except Exception:  # refused, reset, timed out: not answering
        return False


def first_answer(url_of, since: float, timeout: float, step: float = 0.01) -> float:
    """When GET url_of() (None while not known yet) first answered 200 after `since`."""
    end = time.time() + timeout
    while time.time() < end:
        url = url_of()
        t = time.time()
        if url and t >= since and answers(url):
            return t
        time.sleep(step)
    raise SystemExit(f"no answer from {url_of()} in {timeout}s")


def health_url(d: Path, name: str):
    spec = next(i for i in json.loads((d / "plan.json").read_text())["instances"]
                if i["name"] == name)

    def url() -> str | None:
        try:
            addr = (d / "run" / f"{name}.nodes").read_text().split()[2]
        except (OSError, IndexError):
            return None
        return f"http://{addr}:{spec['port']}{spec['health_path']}"
    return url


def log_at(d: Path, pattern: str, t0: float) -> float | None:
    """Epoch of the job log's first line matching `pattern` (lines say +seconds since t0)."""
    text = (d / "logs" / "hpcserve-job.log").read_text(errors="replace")
    for ln in text.splitlines():
        m = re.match(r"\[\S+ \+\s*([\d.]+)s\] (.*)", ln)
        if m and re.search(pattern, m.group(2)):
            return t0 + float(m.group(1))
    return None


def api_headers(job_dir: Path) -> dict:
    """The deployment's API key (made at submit into its job directory, secret/api-key: this
    bench runs as root) as its router asks for it, on requests and on its worker API alike."""
    key = (Path(job_dir) / API_KEY_FILE).read_text().strip()
    return {"Authorization": f"Bearer {key}"}


class Load:
    """Chat requests through the router from `clients` threads, one after another each: every
    request's start, end and error (None when it returned its tokens)."""

    def __init__(self, url: str, clients: int, headers: dict):
        self.url = url + "/v1/chat/completions"
        self.headers = {"Content-Type": "application/json", **headers}
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
            t.join(30)

    def _run(self) -> None:
        body = json.dumps({"model": "kimi-k2", "max_tokens": TOKENS,
                           "messages": [{"role": "user", "content": "hello there"}]}).encode()
        while not self._stop.is_set():
            t0 = time.time()
            try:
                req = urllib.request.Request(self.url, body, self.headers)
                with _DIRECT.open(req, timeout=20) as r:
                    got = json.load(r)["usage"]["completion_tokens"]
                err = None if got == TOKENS else f"{got} tokens"
            except Exception as e:  # every failure counts, whatever it is
                err = repr(e)
            self.results.append((t0, time.time(), err))


def submit(env: dict, tmp: Path, n: int) -> tuple[Path, str]:
    f = tmp / f"d{n}.yaml"
    f.write_text(DEPLOY)
    d = tmp / f"job{n}"
    write_job(render_files(plan.build(config.load(f)), str(d)), d)
    out = subprocess.run(["sbatch", "--parsable", str(d / "job.sbatch")], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    return d, out.split(";")[0]


def srun_pid(d: Path, step: str) -> int:
    """The srun client of `step`'s first attempt in job directory `d` (the step script execs it;
    its last argument is the launch script there: other clusters on this host run their own
    steps of the same name)."""
    launch = str(d / "launch" / f"{step}.sh").encode()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"srun") and f"--job-name={step}".encode() in argv \
                    and launch in argv:
                return int(p.name)
    raise SystemExit(f"no srun of step {step}")


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def router_lists(router: str, worker: str, headers: dict) -> bool | None:
    try:
        with _DIRECT.open(urllib.request.Request(router + "/workers", headers=headers),
                          timeout=1) as r:
            return worker in [w["url"] for w in json.load(r)["workers"]]
    except Exception:  # no answer: cannot tell
        return None


class Watch(threading.Thread):
    """From `since` on, every 10 ms: when each of `conds` (name -> callable, checked in order,
    each only once the one before it held) first held."""

    def __init__(self, conds: dict):
        super().__init__(daemon=True)
        self.conds, self.at = conds, {}
        self.start()

    def run(self) -> None:
        names = list(self.conds)
        end = time.time() + 60
        while len(self.at) < len(names) and time.time() < end:
            for name in names:
                if name in self.at:
                    continue
                if self.conds[name]():
                    self.at[name] = time.time()
                break
            time.sleep(0.01)


def one_run(cluster: DevCluster, env: dict, tmp: Path, n: int) -> dict:
    d, jid = submit(env, tmp, n)
    url = health_url(d, VICTIM)
    # 1. baseline: decode-1's step start -> its /health, in this fresh job
    t_health0 = first_answer(url, 0, 60)
    st = wait(lambda: state(d) if state(d).get("phase") in ("serving", "failed") else None, 60)
    assert st["phase"] == "serving", st
    t0 = st["started_at"]
    t_steps = log_at(d, r"^started \d+ engine instance", t0)
    r = {"baseline": t_health0 - t_steps}

    # 2. the kill under load
    victim_node, victim_addr = (d / "run" / f"{VICTIM}.nodes").read_text().split()[1:3]
    pid, srun = sim_pid(cluster, victim_node), srun_pid(d, VICTIM)
    router = st["endpoint"]
    worker = url().rsplit("/", 1)[0]
    auth = api_headers(d)
    assert router_lists(router, worker, auth), "the router does not list " + worker
    with Load(router, CLIENTS, auth) as load:
        time.sleep(2)
        t_kill = time.time()
        os.kill(pid, signal.SIGKILL)
        watch = Watch({"srun_exited": lambda: gone(srun),
                       "unlisted": lambda: router_lists(router, worker, auth) is False,
                       "health": lambda: answers(url()),
                       "listed": lambda: router_lists(router, worker, auth) is True})
        st = wait(lambda: (s := state(d)).get("instances", {}).get(VICTIM, {}).get("attempt") == 1
                  and s["instances"][VICTIM]["status"] == "serving" and s, 60)
        watch.join(10)
        time.sleep(2)  # requests with decode-1 back in the router
    inst = st["instances"][VICTIM]
    a0, a1 = inst["attempts"][0], inst["attempts"][1]
    w = watch.at
    assert len(w) == 4, f"seen from here: {w}"
    t_out = log_at(d, rf"^{VICTIM} removed from the router", t0)
    assert t_out, "no removal line in the job log"
    r.update(srun_exited=w["srun_exited"] - t_kill, noticed=a0["ended_at"] - t_kill,
             out=w["unlisted"] - t_kill,
             restarted=a1["started_at"] - a0["ended_at"], healthy=w["health"] - a1["started_at"],
             listed=w["listed"] - w["health"], serving=a1["serving_at"] - w["listed"],
             total=a1["serving_at"] - t_kill, recover_s=inst["recover_s"])
    r["own"] = r["total"] - r["healthy"]  # all but the new step's launch and engine start
    fails = [x for x in load.results if x[2] is not None]
    t_out = min(t_out, w["unlisted"])
    r.update(requests=len(load.results),
             failed_inflight=sum(1 for s, _, _ in fails if s < t_kill),
             failed_before_out=sum(1 for s, _, _ in fails if t_kill <= s < t_out),
             failed_after_out=sum(1 for s, _, _ in fails if s >= t_out),
             ok_while_out=sum(1 for s, e, err in load.results
                              if err is None and s >= t_kill and e <= a1["serving_at"]),
             router_retried=router_errors(d, victim_addr),
             errors=sorted({e[:100] for _, _, e in fails}))
    subprocess.run(["scancel", jid], env=env, check=True)
    wait(lambda: not subprocess.run(["squeue", "-h", "-j", jid], env=env, capture_output=True,
                                    text=True).stdout.strip(), 60)
    return r


def router_errors(d: Path, addr: str) -> int:
    """The router's own failed tries at the dead instance (sglang-router logs each; it tries
    such a request again on the other decode, so the client may not see it)."""
    text = (d / "logs" / "router.log").read_text(errors="replace")
    return sum(1 for ln in text.splitlines() if "request failed" in ln and addr in ln)


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    print("machine:", machine())
    # Unpinned as bench_job.py: pinned nodes would serialise the batch host's runtime, the router
    # and an engine on one core and measure that instead of hpcserve.
    cluster = DevCluster("/tmp/hpcserve-bench-recovery/cluster", nodes=4, subnet="10.253.9.0/24",
                         prefix="hsr", pin_cpus=False)
    cluster.down()
    cluster.up()
    env = cluster.client_env()
    env["PATH"] = str(Path(sys.executable).parent) + ":" + env["PATH"]
    out: list[dict] = []
    Path("/tmp/hpcserve-bench-recovery").mkdir(exist_ok=True)
    keep = Path("/tmp/hpcserve-bench-recovery/last")  # the job directories, for their logs
    try:
        with tempfile.TemporaryDirectory(dir="/tmp/hpcserve-bench-recovery") as t:
            for i in range(runs):
                r = one_run(cluster, env, Path(t), i)
                out.append(r)
                print(f"run {i + 1}: " + ", ".join(
                    f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in r.items() if k != "errors"), flush=True)
            subprocess.run(["rm", "-rf", str(keep)])
            subprocess.run(["cp", "-a", t, str(keep)])
    finally:
        cluster.down()

    def med(k: str) -> float:
        return statistics.median(r[k] for r in out)

    def row(label: str, k: str, target: str = "", unit: str = "s", fmt: str = "6.2f") -> None:
        xs = [r[k] for r in out]
        print(f"{label:58} median {med(k):{fmt}} {unit}  min {min(xs):{fmt}}  "
              f"max {max(xs):{fmt}}  {target}")
    print(f"\nrecovery of {VICTIM} (SIGKILL of its engine), 1P2D, backoff_s 0, {runs} runs:")
    row("death -> its srun exited (Slurm's part of noticing)", "srun_exited")
    row("death -> noticed (attempts[0].ended_at)", "noticed")
    row("death -> the router no longer lists it", "out")
    row("noticed -> new attempt started (attempts[1].started_at)", "restarted")
    row("started -> its engine answers /health", "healthy")
    row("/health -> the router lists it (probe, smoke, add)", "listed")
    row("listed -> serving (attempts[1].serving_at)", "serving")
    row("death -> serving again (attempts[1].serving_at)", "total", "(target <= 2 s)")
    row("recover_s (noticed -> serving again)", "recover_s")
    row("hpcserve's own part (the whole less started -> /health)", "own")
    row("baseline: fresh job, step start -> /health", "baseline")
    print(f"{'ratio: death -> serving again / baseline':58} median "
          f"{statistics.median(r['total'] / r['baseline'] for r in out):6.2f}")
    print(f"\nrequests under load ({CLIENTS} clients, {TOKENS} tokens each), per run:")
    row("requests sent", "requests", unit="", fmt="6.0f")
    row("failed, started before the kill (in flight)", "failed_inflight", unit="", fmt="6.0f")
    row("failed, started after the kill, before out", "failed_before_out", unit="", fmt="6.0f")
    row("failed, started after decode-1 was out", "failed_after_out", "(target 0)", unit="",
        fmt="6.0f")
    row("succeeded between the kill and serving again", "ok_while_out", unit="", fmt="6.0f")
    row("the router's failed tries at decode-1 (router.log)", "router_retried", unit="",
        fmt="6.0f")
    print("errors seen:", sorted({e for r in out for e in r["errors"]}) or "none")
    print(f"job directories (logs/hpcserve-job.log): {keep}")
    print(f"reproduce: .venv/bin/python bench/bench_recovery.py {runs}   (as root)")


if __name__ == "__main__":
    main()
