"""The files hpcserve ships inside its package: batch and launch templates, site configs,
model profiles, engine flag tables, container recipes, the in-job runtime and the simulated
engines. Found through importlib.resources, so an installed wheel reads its own copies and
never a checkout's; pip installs packages as plain files, so each is a real path that Jinja
and the job renderer can read."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def path(*parts: str) -> Path:
    """hpcserve/<parts...> as a filesystem path."""
    res = files(__package__)
    for p in parts:
        res = res.joinpath(p)
    return Path(str(res))
