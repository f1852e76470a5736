#!/usr/bin/env python3
"""What the preflight adds to a start-up, on the local Slurm cluster (needs root; starts and stops
its own cluster):

    .venv/bin/python bench/bench_preflight.py [runs]

A 4-node deployment (2 simulated SGLang workers x 2 nodes, the real sglang-router) whose model
directory holds Kimi-K2's file count (62 shards + 9 others) is started `runs` times (default 5)
with the preflight and as many times without it, alternately. Reported: the median time from the
batch script's first line to `serving` each way and their ratio, and the median of the
discovery step with the checks (state.json's preflight.took_s).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpcserve.author import config, plan  # noqa: E402
from hpcserve.devcluster.cluster import DevCluster  # noqa: E402
from hpcserve.author.render import render_files, write_job  # noqa: E402

DEPLOY = """
name: bench-preflight
site: local
model: {profile: kimi-k2-instruct, path: %s, served_name: kimi-k2}
engine: {version: "0.5.23", simulate: true}
roles: {worker: {nodes: 2, instances: 2}}
readiness: {engine_timeout: 60, poll_interval: 0.05}
preflight: {enabled: %s}
"""


def state(d: Path) -> dict:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def run_once(env: dict, tmp: Path, model: Path, n: int, enabled: bool) -> dict:
    f = tmp / f"d{n}.yaml"
    f.write_text(DEPLOY % (model, str(enabled).lower()))
    d = tmp / f"job{n}"
    write_job(render_files(plan.build(config.load(f)), str(d)), d)
    jid = subprocess.run(["sbatch", "--parsable", str(d / "job.sbatch")], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    end = time.time() + 60
    while state(d).get("phase") not in ("serving", "failed") and time.time() < end:
        time.sleep(0.02)
    st = state(d)
    subprocess.run(["scancel", jid], env=env, check=True)
    while subprocess.run(["squeue", "-h", "-j", jid], env=env, capture_output=True,
                         text=True).stdout.strip():
        time.sleep(0.1)
    if st.get("phase") != "serving":
        raise SystemExit(f"job {jid} did not serve: {st.get('reason')}")
    return st


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    cluster = DevCluster("/tmp/hpcserve-bench/cluster", nodes=4, subnet="10.253.7.0/24",
                         prefix="hsb", pin_cpus=False)
    cluster.down()
    cluster.up()
    env = cluster.client_env()
    env["PATH"] = str(Path(sys.executable).parent) + ":" + env["PATH"]
    with_pf, without, took = [], [], []
    try:
        with tempfile.TemporaryDirectory(dir="/tmp/hpcserve-bench") as t:
            tmp = Path(t)
            model = tmp / "model"
            model.mkdir()
            for i in range(1, 63):
                (model / f"model-{i:05d}-of-00062.safetensors").write_bytes(b"\0" * 1024)
            for name in ("config.json", "configuration_deepseek.py", "generation_config.json",
                         "model.safetensors.index.json", "modeling_deepseek.py",
                         "tiktoken.model", "tokenization_kimi.py", "tokenizer_config.json",
                         "chat_template.jinja"):
                (model / name).write_text("{}")
            for i in range(runs):
                st = run_once(env, tmp, model, 2 * i, True)
                with_pf.append(st["serving_after_s"])
                took.append(st["preflight"]["took_s"])
                without.append(run_once(env, tmp, model, 2 * i + 1, False)["serving_after_s"])
    finally:
        cluster.down()
        shutil.rmtree("/tmp/hpcserve-bench", ignore_errors=True)
    med = statistics.median
    print(f"start -> serving, with preflight:    {med(with_pf):.2f} s (median of {runs})")
    print(f"start -> serving, without preflight: {med(without):.2f} s (median of {runs})")
    print(f"ratio: {med(with_pf) / med(without):.2f}; preflight + discovery step: "
          f"{med(took):.2f} s; added: {med(with_pf) - med(without):+.2f} s")


if __name__ == "__main__":
    main()
