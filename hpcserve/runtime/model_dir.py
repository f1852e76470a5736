"""The files of a model directory, as the preflight checks them and staging copies them."""

from __future__ import annotations

import os

MAX_FILES = 20000  # a weights directory holds tens to hundreds; more is not a model directory


class TooManyFiles(Exception):
    """More files than a model directory holds: the path names something else."""


def model_files(root: str) -> list[tuple[str, str]]:
    """(path relative to root, full path) of every file under root, dot-files and dot-folders
    aside, links followed, in a stable order; TooManyFiles past MAX_FILES."""
    out = []
    for top, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in sorted(names):
            if not n.startswith("."):
                full = os.path.join(top, n)
                out.append((os.path.relpath(full, root), full))
        if len(out) > MAX_FILES:
            raise TooManyFiles(f"{root} holds over {MAX_FILES} files: not a model directory")
    return out
