"""The rendered step and launch scripts per container runtime, compared byte for byte with
tests/containers/golden/<variant>/. Regenerate with HPCSERVE_UPDATE_GOLDEN=1 and review the diff."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from ctkit import GOLDEN, GOLDEN_JOB_DIR, plan_for
from hpcserve.author import render

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("HPCSERVE_UPDATE_GOLDEN") == "1"


def rendered(variant: str) -> dict[str, str]:
    files = render.render_files(plan_for(GOLDEN[variant]), GOLDEN_JOB_DIR)
    return {k: text for k, (text, _mode) in files.items()
            if k.startswith(("steps/", "launch/")) or k.endswith(".sh")}


@pytest.mark.parametrize("variant", sorted(GOLDEN))
def test_golden(variant: str) -> None:
    want_dir = GOLDEN_DIR / variant
    got = rendered(variant)
    if UPDATE:
        if want_dir.exists():
            for old in sorted(want_dir.rglob("*"), reverse=True):
                old.unlink() if old.is_file() else old.rmdir()
        for rel, text in got.items():
            p = want_dir / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(text.encode())
    assert want_dir.is_dir(), f"no golden files for {variant}: run with HPCSERVE_UPDATE_GOLDEN=1"
    have = {str(p.relative_to(want_dir)) for p in want_dir.rglob("*") if p.is_file()}
    assert have == set(got), f"files differ: only golden {sorted(have - set(got))}, " \
                             f"only rendered {sorted(set(got) - have)}"
    for rel, text in sorted(got.items()):
        want = (want_dir / rel).read_bytes()
        if want != text.encode():
            diff = "".join(difflib.unified_diff(
                want.decode(errors="replace").splitlines(True), text.splitlines(True),
                f"golden/{variant}/{rel}", "rendered"))
            pytest.fail(f"{variant}/{rel} differs from the golden file "
                        f"(HPCSERVE_UPDATE_GOLDEN=1 to accept):\n{diff}")
