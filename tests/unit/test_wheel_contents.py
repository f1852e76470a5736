"""The top-level sbatch_templates/, site_configs/ and containers/ are mapped into the package at
build time (pyproject.toml, [tool.setuptools.package-dir]): the wheel holds every file of them and
of hpcserve/, and nothing else; a wheel installed outside the checkout reads its own copies through
package_data, and the checkout's editable install reads the top-level folders themselves."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest

from hpcserve import package_data

ROOT = Path(__file__).resolve().parents[2]


def _files(top: Path) -> set[str]:
    """Every file under `top`, relative to it, leaving out Python's byte-code caches."""
    return {p.relative_to(top).as_posix() for p in top.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _expected() -> set[str]:
    want = {f"hpcserve/{f}" for f in _files(ROOT / "hpcserve")}
    for pkg, top in package_data.MAPPED.items():
        want |= {f"hpcserve/{pkg}/{f}" for f in _files(ROOT / top)}
    return want


@pytest.fixture(scope="module")
def wheel_names(built_wheel) -> set[str]:
    with zipfile.ZipFile(built_wheel) as z:
        return {n for n in z.namelist() if ".dist-info/" not in n}


def test_mapped_folders_are_the_ones_pyproject_maps():
    import tomllib  # the standard library's since 3.11, CI's python
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    want = {f"hpcserve.{pkg}": top for pkg, top in package_data.MAPPED.items()}
    assert setup["package-dir"] == want
    assert set(want) <= set(setup["packages"])
    assert all((ROOT / top).is_dir() for top in want.values())


def test_the_wheel_holds_every_file_of_the_package_and_the_mapped_folders(wheel_names):
    want = _expected()
    assert not want - wheel_names, f"left out of the wheel: {sorted(want - wheel_names)}"
    # anything more would be a stale build/lib/ (setuptools copies it whole), which the
    # fixture builds without
    assert not wheel_names - want, f"not in the checkout: {sorted(wheel_names - want)}"


def test_the_installed_wheel_reads_its_own_copies(installed_wheel, tmp_path):
    code = ("import sys; from hpcserve import package_data as p; "
            "print('\\n'.join(str(p.path(k)) for k in sys.argv[1:]))")
    r = subprocess.run([str(installed_wheel / "python"), "-c", code, *package_data.MAPPED],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True)
    site = installed_wheel.parent
    for (pkg, top), got in zip(package_data.MAPPED.items(), r.stdout.split()):
        got = Path(got)
        assert got.is_relative_to(site) and got.name == pkg, got
        for f in _files(ROOT / top):
            assert (got / f).read_bytes() == (ROOT / top / f).read_bytes(), f


def test_the_checkout_reads_its_top_level_folders():
    """The editable install (scripts/setup.sh): the mapping resolves to the folders themselves,
    so an edit there is what the next render uses."""
    for pkg, top in package_data.MAPPED.items():
        assert package_data.path(pkg) == ROOT / top
