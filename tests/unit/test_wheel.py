"""The install users do first: a wheel built from the checkout, installed with pip into a fresh
venv, run from outside the checkout, renders every example exactly as its golden job directory
(templates, site configs, container recipes, profiles and stand-ins all ship in the package and
are read through importlib.resources); a submit whose router python lacks the router says what
to install before anything reaches Slurm."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


@pytest.fixture
def installed(installed_wheel) -> Path:
    return installed_wheel / "hpcserve"


@pytest.mark.parametrize("stem", sorted(p.stem for p in (ROOT / "examples").glob("*.yaml")))
def test_the_installed_wheel_renders_every_example_as_its_golden(installed, tmp_path, stem):
    out = tmp_path / "job"
    # from a directory that is not the checkout, with the example copied there (and its site
    # taken from the package, not from a site_configs/ beside the file)
    (tmp_path / "d.yaml").write_text((ROOT / "examples" / f"{stem}.yaml").read_text())
    # as the user the goldens are rendered for (their per-user caches: getpass reads LOGNAME)
    r = subprocess.run([str(installed), "render", "d.yaml", "--out", str(out)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "LOGNAME": "alice"})
    assert r.returncode == 0, r.stderr
    gold = GOLDEN / stem
    assert gold.is_dir(), f"every example has a golden job directory: {stem}"
    for g in gold.rglob("*"):
        if g.is_file():
            rel = g.relative_to(gold)
            # the job directory, and the shared image cache beside it
            got = (out / rel).read_text().replace(str(out), f"/jobs/{stem}").replace(
                f"{tmp_path}/.hpcserve-images", "/jobs/.hpcserve-images")
            assert got == g.read_text(), rel
    assert (out / "hpcserve_runtime" / "job.py").is_file()


def test_the_installed_wheel_answers_for_sites_profiles_and_schema(installed, tmp_path):
    for args, want in ((["profiles"], "kimi-k2-instruct"), (["schema", "site"], '"title"'),
                       (["--help"], "Usage")):
        r = subprocess.run([str(installed), *args], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and want in r.stdout, (args, r.stderr)


def test_submit_says_what_to_install_when_the_router_python_lacks_it(installed, tmp_path):
    bare = tmp_path / "bare"  # a python without sglang_router
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    (tmp_path / "d.yaml").write_text((ROOT / "examples" / "demo.yaml").read_text())
    r = subprocess.run([str(installed), "submit", "d.yaml", "--out", str(tmp_path / "job"),
                        "--set", f"router.python={bare}/bin/python"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HPCSERVE_STATE_DIR": str(tmp_path / "state"),
                            "PATH": "/nonexistent"})  # no sbatch: it must not get that far
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"hpcserve: error: the router runs from {bare}/bin/python's "
                               "sglang_router package"), r.stderr
    assert "cannot import sglang_router" in r.stderr and "hpcserve[dev]" in r.stderr
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "job").exists()


def test_the_installed_wheel_draws_a_benchmark_report(installed, tmp_path, monkeypatch):
    """matplotlib comes with the wheel's [dev] extra (and [report]): `hpcserve report` writes
    the PNGs and the page."""
    import json
    from test_bench_gate import listed, spec, vllm_result, write
    from hpcserve.runtime import bench
    jd = tmp_path / "job"
    (jd / "bench").mkdir(parents=True)
    for lb in ("c1", "c4"):
        write(jd / "bench", lb, vllm_result())
    state = {"phase": "done", "benchmark": bench.evaluate(str(jd / "bench"), spec("vllm"))}
    (jd / "state.json").write_text(json.dumps(state))
    (jd / "plan.json").write_text(json.dumps({
        "name": "w", "engine": {"title": "vLLM", "version": "0.32.0"},
        "components": [{"nodes": 2}], "instances": [{"gpus_per_node": 8, "nodes": 2}]}))
    listed(monkeypatch, tmp_path, "5", "w", jd)
    r = subprocess.run([str(installed), "report", "5"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"report: {jd}/report/report.html"
    assert {p.name for p in (jd / "report").iterdir()} == {
        "throughput.png", "latency.png", "throughput.svg", "latency.svg", "report.html",
        "report.json"}
