"""Every example renders to exactly its golden job directory (tests/golden/<example>/).

Regenerate on purpose with `HPCSERVE_UPDATE_GOLDEN=1 pytest tests/golden` and review the diff.
"""

from __future__ import annotations

import difflib
import shutil

import pytest

from goldenkit import COPIED, EXAMPLES, GOLDEN, ROOT, RUNTIME, copied

STEMS = [ex.stem for ex in EXAMPLES]
# Files of tests/golden/ itself, not golden job directories.
OWN = {"conftest.py", "goldenkit.py", "test_golden.py", "__pycache__", "README.md"}


def test_there_are_examples_to_check():
    assert len(STEMS) >= 4, f"expected the bundled examples, found {STEMS}"


def _diff(rel: str, want: str, got: str) -> str:
    return "".join(difflib.unified_diff(
        want.splitlines(keepends=True), got.splitlines(keepends=True),
        fromfile=f"tests/golden/{rel} (golden)", tofile=f"{rel} (rendered now)"))


@pytest.mark.parametrize("stem", STEMS)
def test_job_directory_matches_golden(stem, rendered, update_golden):
    files = rendered[stem]
    problems = []
    for rel, (text, _mode) in sorted(files.items()):
        if copied(rel):
            continue
        gold = GOLDEN / stem / rel
        if update_golden:
            if not gold.exists() or gold.read_bytes() != text.encode("utf-8"):
                gold.parent.mkdir(parents=True, exist_ok=True)
                gold.write_bytes(text.encode("utf-8"))
            continue
        if not gold.exists():
            problems.append(f"missing golden file tests/golden/{stem}/{rel} "
                            "(HPCSERVE_UPDATE_GOLDEN=1 creates it):\n"
                            + _diff(f"{stem}/{rel}", "", text))
            continue
        want = gold.read_bytes()
        if want != text.encode("utf-8"):
            problems.append(_diff(f"{stem}/{rel}", want.decode("utf-8", "replace"), text)
                            or f"{stem}/{rel}: bytes differ (line endings or encoding)")
    if problems:
        pytest.fail("rendered job directory differs from its golden copy "
                    "(HPCSERVE_UPDATE_GOLDEN=1 pytest tests/golden rewrites it):\n"
                    + "\n".join(problems), pytrace=False)


@pytest.mark.parametrize("stem", STEMS)
def test_copied_runtime_files_equal_their_sources(stem, rendered):
    from hpcserve.author import config, plan
    files = rendered[stem]
    p = plan.build(config.load(next(e for e in EXAMPLES if e.stem == stem)))
    assert set(RUNTIME) <= set(files), "every job directory carries its whole runtime"
    assert ("hpcserve_sim.py" in files) == p.simulate, "the simulated engine only when simulate"
    for rel, (text, _mode) in files.items():
        name = copied(rel)
        if name is None:
            continue
        source = COPIED[name]
        if name == "hpcserve_sim.py":  # the stand-in of the deployment's own engine
            source = ROOT / "hpcserve" / "sim" / f"{p.engine}.py"
        assert text == source.read_text(encoding="utf-8"), f"{rel} != {source}"


@pytest.mark.parametrize("stem", STEMS)
def test_file_modes(stem, rendered):
    for rel, (_text, mode) in rendered[stem].items():
        # the runtime's modules are imported (python3 -m hpcserve_runtime), not executed
        # (an autoscale slot's own job directory, under scale/, is made the same way)
        runnable = rel.endswith((".sh", ".py")) and "hpcserve_runtime/" not in rel
        # and every file is its owner's alone
        want = 0o700 if rel.rsplit("/", 1)[-1] == "job.sbatch" or runnable else 0o600
        assert mode == want, f"{stem}/{rel}: mode {oct(mode)}, expected {oct(want)}"


def test_no_stale_golden_files(rendered, update_golden):
    stale = []
    for d in sorted(GOLDEN.iterdir()):
        if d.name in OWN:
            continue
        if not d.is_dir() or d.name not in rendered:
            stale.append(d)
            continue
        expected = {rel for rel in rendered[d.name] if not copied(rel)}
        for f in sorted(d.rglob("*")):
            if f.is_file() and f.relative_to(d).as_posix() not in expected:
                stale.append(f)
    if update_golden:
        for p in stale:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        for d in GOLDEN.iterdir():  # folders the removals emptied
            for sub in sorted((x for x in d.rglob("*") if x.is_dir()), reverse=True):
                if not any(sub.iterdir()):
                    sub.rmdir()
        return
    if stale:
        pytest.fail("golden files no example renders any more "
                    "(HPCSERVE_UPDATE_GOLDEN=1 pytest tests/golden removes them): "
                    + ", ".join(str(p.relative_to(GOLDEN)) for p in stale), pytrace=False)
