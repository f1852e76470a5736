"""`bash -n` accepts every script hpcserve generates, for every example."""

from __future__ import annotations

import subprocess

import pytest

from unitkit import EXAMPLES, render, scripts_of


def _bash_n(path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=10)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_every_generated_script_parses(example, tmp_path):
    files = render(example, str(tmp_path))
    scripts = scripts_of(files)
    # job.sbatch, a discover step per component, a step and a launch script per instance, router
    assert "job.sbatch" in scripts and any(s.startswith("steps/discover-") for s in scripts)
    assert any(s.startswith("launch/") for s in scripts) and any(s.startswith("steps/") for s in scripts)
    bad = []
    for rel in scripts:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(files[rel][0], encoding="utf-8")
        r = _bash_n(p)
        if r.returncode != 0:
            bad.append(f"{rel}: {r.stderr.strip()}")
    assert not bad, "bash -n rejects generated scripts:\n" + "\n".join(bad)


def test_bash_n_does_reject_a_broken_script(tmp_path):
    """The check above can fail: bash -n does report an unterminated quote."""
    p = tmp_path / "broken.sh"
    p.write_text("#!/bin/bash\necho 'unterminated\n", encoding="utf-8")
    assert _bash_n(p).returncode != 0
