"""The files hpcserve ships inside its package: batch and launch templates, site configs,
model profiles, engine flag tables, container recipes, the in-job runtime and the simulated
engines. Found through importlib.resources, so an installed wheel reads its own copies and
never a checkout's; pip installs packages as plain files, so each is a real path that Jinja
and the job renderer can read."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# Folders kept at the top of the checkout, where a cluster admin looks for them, and mapped into
# the package at build time (pyproject.toml, [tool.setuptools.package-dir]): each is a package of
# its own, hpcserve.<name>, found by import in a wheel and in an editable install alike.
MAPPED = {"sbatch_templates": "sbatch_templates", "site_configs": "site_configs",
          "container_recipes": "containers"}


def path(*parts: str) -> Path:
    """hpcserve/<parts...> as a filesystem path."""
    if parts and parts[0] in MAPPED:
        res, parts = files(f"{__package__}.{parts[0]}"), parts[1:]
    else:
        res = files(__package__)
    for p in parts:
        res = res.joinpath(p)
    return Path(str(res))
