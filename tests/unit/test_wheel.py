"""The install users do first: a wheel built from the checkout, installed with pip into a fresh
venv, run from outside the checkout, renders exactly the golden job directories (templates,
site configs, container recipes, profiles and stand-ins all ship in the package)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(base / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = (base / "dist").glob("hpcserve-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return venv / "bin" / "hpcserve"


@pytest.mark.parametrize("stem", ["kimi-k2-instruct-4p12d", "vllm-kimi-k2-pd-nixl", "demo"])
def test_the_installed_wheel_renders_the_golden_job_directory(installed, tmp_path, stem):
    out = tmp_path / "job"
    # from a directory that is not the checkout, with the example copied there (and its site
    # taken from the package, not from a site_configs/ beside the file)
    (tmp_path / "d.yaml").write_text((ROOT / "examples" / f"{stem}.yaml").read_text())
    r = subprocess.run([str(installed), "render", "d.yaml", "--out", str(out)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    gold = GOLDEN / stem
    for g in gold.rglob("*"):
        if g.is_file():
            rel = g.relative_to(gold)
            got = (out / rel).read_text().replace(str(out), f"/jobs/{stem}")
            assert got == g.read_text(), rel
    assert (out / "hpcserve_job.py").is_file()


def test_the_installed_wheel_answers_for_sites_profiles_and_schema(installed, tmp_path):
    for args, want in ((["profiles"], "kimi-k2-instruct"), (["schema", "site"], '"title"'),
                       (["--help"], "Usage")):
        r = subprocess.run([str(installed), *args], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0 and want in r.stdout, (args, r.stderr)
