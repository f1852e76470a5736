"""The Jinja2 environment of sbatch_templates/ (hpcserve.sbatch_templates once installed):
StrictUndefined, and the `q` filter that quotes every word for bash. Shared by the renderer and
the container runtimes' task script."""

from __future__ import annotations

import os
import shlex

from .. import package_data
from .words import quote

TEMPLATES = package_data.path("sbatch_templates")

_env = None


def _bytecode_cache():
    """Compiled templates kept between runs (Jinja checks each against its source): compiling
    them is a third of a render's time. None where no cache directory can be written."""
    import jinja2
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "hpcserve", "jinja")
    try:
        os.makedirs(d, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(d) if os.access(d, os.W_OK) else None


def jinja():
    global _env
    if _env is None:
        import jinja2  # not at import time: `hpcserve --help` and status need no templates
        _env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined,
            trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
            bytecode_cache=_bytecode_cache())
        _env.filters["q"] = lambda v: quote(v) if isinstance(v, (str, tuple)) else shlex.quote(str(v))
    return _env
