"""docs/architecture.md describes the tree as it is: each folder's table names every module of
that folder and no other, and the plan.json spec version it gives is the code's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpcserve.runtime.contract import SPEC_VERSION

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
TABLED = ["", "author", "engines", "operate", "slurm", "devcluster", "runtime"]


def section(text: str, folder: str) -> str:
    """The text under the first heading that names `hpcserve/<folder>/`, up to the next."""
    name = f"`hpcserve/{folder}/`".replace("//", "/")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#") and name in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")),
               len(lines))
    return "\n".join(lines[start + 1:end])


def tabled_modules(text: str) -> set[str]:
    """The modules a section's table names in its first column."""
    return {m for row in text.splitlines() if row.startswith("| `")
            for m in re.findall(r"`([\w.]+\.py)`", row.split("|")[1])}


def modules(folder: str) -> set[str]:
    return {p.name for p in (ROOT / "hpcserve" / folder).glob("*.py") if p.name != "__init__.py"}


@pytest.mark.parametrize("folder", TABLED)
def test_each_folder_table_names_every_module_of_the_folder(folder):
    text = DOC.read_text(encoding="utf-8")
    named = tabled_modules(section(text, folder)) - {"__init__.py"}
    assert named == modules(folder), (
        f"hpcserve/{folder}: missing from the doc {sorted(modules(folder) - named)}, "
        f"named but absent {sorted(named - modules(folder))}")


def test_the_stand_ins_are_named():
    text = section(DOC.read_text(encoding="utf-8"), "sim")
    assert all(f"`{m}`" in text for m in modules("sim")), sorted(modules("sim"))


def test_the_spec_version_is_the_codes():
    text = DOC.read_text(encoding="utf-8")
    said = re.findall(r"spec version (\d+)|the run-time spec \(version (\d+)\)", text)
    assert said, "the doc names no spec version"
    assert {int(a or b) for a, b in said} == {SPEC_VERSION}


def test_the_reader_sees_a_missing_module(tmp_path):
    text = "### `hpcserve/x/`\n\n| module | holds |\n|---|---|\n| `a.py`, `b.py` | ab |\n" \
           "### `hpcserve/y/`\n| `c.py` | c |\n"
    assert tabled_modules(section(text, "x")) == {"a.py", "b.py"}
    assert tabled_modules(section(text, "y")) == {"c.py"}
