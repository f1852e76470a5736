"""KTransformers on the real test cluster, both ways, simulated: kt-kernel inside SGLang (the
SGLang stand-in given the --kt-* argv) behind the real sglang-router, its CPU request reaching
the engine's step; and the legacy server, its state kept in a home of the job's own."""

from __future__ import annotations

import json
import urllib.request

import pytest

from jobkit import chat, deployment, wait_no_job_processes

pytestmark = pytest.mark.slurm

# One "GPU" and both CPUs of a test node for the engine.
NODE = {"gpus": 1, "cpu_cores": 2, "cpus": 2, "numa_nodes": 1, "memory_gb": 16}


def _log(job, inst: str) -> str:
    node = job.node_rows(inst)[0][1]
    return (job.dir / "logs" / f"{inst}.node0.{node}.log").read_text()


def test_kt_kernel_in_sglang_serves_with_its_cpu_share(submit, dev_cluster, tmp_path):
    weights = tmp_path / "cpu-weights"
    weights.mkdir()
    d = deployment(name="t-kt")
    d["site"] = {"base": "local", "node": NODE}
    d["model"] = {"profile": "tiny-deepseek-v3", "path": "/models/tiny-dsv3",
                  "served_name": "kimi-k2"}
    d["engine"] = {"name": "ktransformers", "version": "0.5.23", "simulate": True}
    d["roles"] = {"worker": {"kt_weight_path": str(weights), "kt_method": "AMXINT4",
                             "kt_num_gpu_experts": 2}}
    job = submit(d)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    assert chat(st["endpoint"], 3, key=job.key)["usage"]["completion_tokens"] == 3
    text = _log(job, "worker-0")
    # cores 2 - GPUs 1 = 1 thread; the step was given both CPUs of the node
    assert "kt-kernel AMXINT4: 1 CPU threads in 1 pool(s), 2 experts per layer" in text, text
    assert "SLURM_CPUS_PER_TASK=2" in text, text
    job.scancel()
    assert job.wait({"cancelled", "failed", "done"}, 60)["phase"] == "cancelled"
    wait_no_job_processes(dev_cluster, 30)


def test_kt_weights_missing_on_the_node_fail_for_that_reason(submit, tmp_path):
    d = deployment(name="t-kt-missing")
    d["site"] = {"base": "local", "node": NODE}
    d["model"] = {"profile": "tiny-deepseek-v3", "path": "/models/tiny-dsv3"}
    d["engine"] = {"name": "ktransformers", "version": "0.5.23", "simulate": True}
    d["roles"] = {"worker": {"kt_weight_path": str(tmp_path / "absent")}}
    job = submit(d)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "failed", job.logs()
    f = st["failure"]
    assert f["step"] == "worker-0" and f["node"] == job.node_rows("worker-0")[0][1], f
    assert any("--kt-weight-path" in ln and "absent" in ln for ln in f["log_tail"]), f


def test_legacy_server_serves_from_a_home_of_the_jobs_own(submit, dev_cluster, tmp_path):
    gguf = tmp_path / "gguf"
    gguf.mkdir()
    # the preflight compares the model files across nodes: an empty directory is refused
    (gguf / "Kimi-K2-Instruct-Q4_K_M-00001-of-00001.gguf").write_bytes(b"GGUF")
    d = deployment(name="t-kt-legacy")
    d["site"] = {"base": "local", "node": NODE}
    d["model"] = {"profile": "tiny-deepseek-v3", "path": str(gguf), "served_name": "kimi-k2"}
    d["engine"] = {"name": "ktransformers_legacy", "version": "0.4.1", "simulate": True}
    d["roles"] = {"worker": {"gguf_path": str(gguf), "cache_lens": 4096}}
    d["router"] = {"enabled": False}
    job = submit(d)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    node, addr = job.node_rows("worker-0")[0][1:3]
    url = f"http://{addr}:10002"
    assert st["health_urls"] == {"worker-0": url + "/v1/models"}
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        assert json.load(r)["data"][0]["id"] == "kimi-k2"
    assert chat(url, 4)["usage"]["completion_tokens"] == 4
    assert (job.dir / "run" / "ktransformers-home" / node / ".ktransformers").is_dir()
    assert "cpu_infer=1" in _log(job, "worker-0")
    job.scancel()
    assert job.wait({"cancelled", "failed", "done"}, 60)["phase"] == "cancelled"
    wait_no_job_processes(dev_cluster, 30)
