"""The files hpcserve ships inside its package: batch and launch templates, site configs,
model profiles, engine flag tables, container recipes, the in-job runtime and the simulated
engines. Found through the import system (the package's spec, as importlib.resources.files
finds a plain-file package, without importing importlib.resources' zip and tempfile support:
about 5 ms of every command's start), so an installed wheel reads its own copies and never a
checkout's; pip installs packages as plain files, so each is a real path that Jinja and the job
renderer can read."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

# Folders kept at the top of the checkout, where a cluster admin looks for them, and mapped into
# the package at build time (pyproject.toml, [tool.setuptools.package-dir]): each is a package of
# its own, hpcserve.<name>, found by import in a wheel and in an editable install alike.
MAPPED = {"sbatch_templates": "sbatch_templates", "site_configs": "site_configs",
          "container_recipes": "containers"}


def path(*parts: str) -> Path:
    """hpcserve/<parts...> as a filesystem path."""
    if parts and parts[0] in MAPPED:
        package, parts = f"{__package__}.{parts[0]}", parts[1:]
    else:
        package = __package__
    spec = find_spec(package)
    return Path(next(iter(spec.submodule_search_locations)), *parts)
