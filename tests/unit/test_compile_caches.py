"""Compile caches kept between jobs (site.paths.cache_dir): where the plan points each engine's
cache variables, the site field's validation, and the launch script's warm/cold report as it
runs on a node (the rendered script itself, the engine a recording stand-in), read back by the
runtime's parser."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcserve.author import config, plan, render
from hpcserve.errors import ConfigError
from hpcserve.runtime import caches

from unitkit import write_yaml

ROOT = Path(__file__).resolve().parents[2]
FAKE_PYTHON = ROOT / "tests" / "fakes" / "engine"


def _deployment(tmp_path: Path, cache_dir, engine=("vllm", "0.32.0"), env=None) -> Path:
    doc = {"name": "cc", "site": {"base": "local", "node": {"gpus": 1, "gpu_type": "H100 SXM"},
                                  "paths": {"cache_dir": cache_dir, "cache_storage": "node-local"}},
           "model": {"profile": "tiny-llama", "path": "/models/tiny-llama/"},
           "engine": {"name": engine[0], "version": engine[1], "simulate": True},
           "roles": {"worker": {"nodes": 1}}, "router": {"enabled": False},
           "env": env or {}}
    return write_yaml(tmp_path / "d.yaml", doc)


def test_each_cache_variable_is_keyed_by_user_model_release_and_gpu(tmp_path):
    cfg = dataclasses.replace(config.load(_deployment(tmp_path, str(tmp_path / "c"))), user="alice")
    p = plan.build(cfg)
    # the user's own part of the site's cache directory: kernels are code the engine runs
    base = f"{tmp_path}/c/alice/tiny-llama/vllm-0.32.0/H100_SXM"
    env = dict(p.instances[0].env)
    assert {c.var: env[c.var] for c in p.caches} == {
        "VLLM_CACHE_ROOT": f"{base}/vllm", "TRITON_CACHE_DIR": f"{base}/triton",
        "DG_JIT_CACHE_DIR": f"{base}/deep_gemm",
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": f"{base}/flashinfer_autotune"}
    # SGLang's own variables, for its release
    p = plan.build(config.load(_deployment(tmp_path, str(tmp_path / "c"), ("sglang", "0.5.23"))))
    assert [c.var for c in p.caches] == ["SGLANG_CACHE_DIR", "TRITON_CACHE_DIR",
                                         "SGLANG_DG_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"]
    # a release before the one whose source was read gets none (unverified: not set)
    p = plan.build(config.load(_deployment(tmp_path, str(tmp_path / "c"), ("sglang", "0.5.22"))))
    assert p.caches == ()
    # no cache_dir: nothing set, nothing in plan.json
    p = plan.build(config.load(_deployment(tmp_path, None)))
    assert p.caches == () and not any("CACHE" in k for k, _ in p.instances[0].env)


@pytest.mark.parametrize("bad", ["relative/cache", "/a,b", "/a:b", "/a b", "/a%j"])
def test_a_cache_dir_the_mounts_cannot_hold_is_refused_naming_the_field(tmp_path, bad):
    with pytest.raises(ConfigError) as e:
        config.load(_deployment(tmp_path, bad))
    assert "site.paths.cache_dir" in str(e.value) and "absolute path" in str(e.value)


def _start(job: Path, node: str, tag: str = "") -> subprocess.CompletedProcess:
    """The rendered launch script on node `node`, as srun runs it; python3 is the recording
    stand-in, which exits at once."""
    env = {**os.environ, "SLURMD_NODENAME": node, "SLURM_JOB_ID": "7",
           "HPCSERVE_ATTEMPT_TAG": tag, "PATH": f"{FAKE_PYTHON}:{os.environ['PATH']}",
           "HPCSERVE_FAKE_ENGINE": "exit:0", "HPCSERVE_FAKE_PYTHON": sys.executable,
           "HPCSERVE_API_KEY": "k-test"}  # job.sbatch exports it to the job's steps
    return subprocess.run(["bash", str(job / "launch" / "worker-0.sh")], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_launch_script_reports_each_cache_cold_then_warm(tmp_path):
    job = tmp_path / "job"
    cache = tmp_path / "cache"
    # the user's own Triton cache wins over hpcserve's, and is the one reported
    mine = tmp_path / "my-triton"
    p = plan.build(config.load(_deployment(tmp_path, str(cache),
                                           env={"TRITON_CACHE_DIR": str(mine)})))
    render.write_job(render.render_files(p, str(job)), job)
    (job / "run").mkdir(exist_ok=True)
    (job / "run" / "worker-0.nodes").write_text("0 n1 127.0.0.1 lo -\n")
    r = _start(job, "n1")
    assert r.returncode == 0, r.stderr
    assert caches.read(str(job), "worker-0") == {"n1": {
        "vllm": "cold", "triton": "cold", "deep_gemm": "cold", "flashinfer_autotune": "cold"}}
    log = (job / "logs" / "worker-0.node0.n1.log").read_text()
    assert f"hpcserve: cache triton (TRITON_CACHE_DIR={mine}) cold" in log, log
    # What the first start compiled: vLLM's cache root counts only its torch.compile part
    # (it writes modelinfos/ there even without compiling); Triton's directory, any file.
    root = Path(dict(p.instances[0].env)["VLLM_CACHE_ROOT"])
    (root / "modelinfos").mkdir(parents=True)
    (root / "modelinfos" / "llama.json").write_text("{}")
    (mine / "ab").mkdir(parents=True)
    (mine / "ab" / "kernel.cubin").write_bytes(b"x")
    assert _start(job, "n1", ".attempt1").returncode == 0
    assert caches.read(str(job), "worker-0", ".attempt1")["n1"] == {
        "vllm": "cold", "triton": "warm", "deep_gemm": "cold", "flashinfer_autotune": "cold"}
    (root / "torch_compile_cache" / "aot" / "rank_0_0").mkdir(parents=True)
    (root / "torch_compile_cache" / "aot" / "rank_0_0" / "model").write_bytes(b"x")
    assert _start(job, "n1", ".attempt2").returncode == 0
    got = caches.read(str(job), "worker-0", ".attempt2")["n1"]
    assert (got["vllm"], got["triton"]) == ("warm", "warm")
    # each attempt's report stays its own; the first start's is not another attempt's
    assert caches.read(str(job), "worker-0")["n1"]["triton"] == "cold"
    spec = json.loads((job / "plan.json").read_text())["caches"]
    assert spec["storage"] == "node-local" and spec["dir"] == str(cache)
    assert caches.words({"n1": got}).startswith("n1: vllm warm, triton warm")


def test_status_says_how_many_caches_were_warm_and_where_they_live():
    from hpcserve.operate.ops import View, caches_line, status_table
    v = View("7", "d", "/j", None)
    v.state = {}
    assert caches_line(v) is None                      # a site that keeps no caches
    v.state = {"phase": "serving", "caches": {
        "dir": "/raid/hpcserve-cache", "storage": "node-local", "instances": {
            "worker-0": {"n1": {"vllm": "warm", "triton": "cold"}},
            "worker-1": {"n2": {"vllm": "warm", "triton": "warm"}}}}}
    assert caches_line(v) == "  compile caches (node-local /raid/hpcserve-cache): 3 of 4 warm"
    assert caches_line(v) in status_table([v], instances=True).splitlines()
    assert caches_line(v) not in status_table([v])     # the one-line-per-job table stays so


def _job_with_caches(tmp_path: Path, cache: Path) -> Path:
    job = tmp_path / "job"
    cfg = dataclasses.replace(config.load(_deployment(tmp_path, str(cache))), user="alice")
    render.write_job(render.render_files(plan.build(cfg), str(job)), job)
    (job / "run").mkdir(exist_ok=True)
    (job / "run" / "worker-0.nodes").write_text("0 n1 127.0.0.1 lo -\n")
    return job


def test_the_users_cache_directory_is_made_private_under_a_shared_parent(tmp_path):
    """The site's cache_dir made like /tmp (anyone adds a directory, none removes another's),
    the user's own part of it 0700: what one user compiles no other user can plant or read."""
    cache = tmp_path / "site" / "cache"
    job = _job_with_caches(tmp_path, cache)
    r = _start(job, "n1")
    assert r.returncode == 0, r.stderr
    assert (cache.stat().st_mode & 0o7777, (cache / "alice").stat().st_mode & 0o7777) == (
        0o1777, 0o700)
    assert caches.read(str(job), "worker-0")["n1"]["vllm"] == "cold"


@pytest.mark.parametrize("plant", ["link", "group-writable", "file"])
def test_a_cache_directory_that_is_not_the_users_alone_is_refused_before_the_engine(
        tmp_path, plant):
    cache = tmp_path / "cache"
    cache.mkdir()
    mine = cache / "alice"
    if plant == "link":        # a link to a directory: its target is whoever's it points to
        (tmp_path / "elsewhere").mkdir()
        mine.symlink_to(tmp_path / "elsewhere")
    elif plant == "group-writable":
        mine.mkdir()
        mine.chmod(0o770)
    else:
        mine.write_text("")
    job = _job_with_caches(tmp_path, cache)
    r = _start(job, "n1")
    log = (job / "logs" / "worker-0.node0.n1.log").read_text()
    assert r.returncode == 3, (r.stdout, r.stderr, log)
    assert f"hpcserve: compile cache {mine} refused (owner root," in log, log
    assert not (job / "run" / "caches").exists()  # it stopped before any cache or engine
