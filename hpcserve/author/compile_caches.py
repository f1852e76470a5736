"""Compile and JIT caches that outlive the job (site.paths.cache_dir).

Each engine adapter declares the variables its release reads (engines.base.CacheVar, verified in
the release's source); the plan points each at

    <cache_dir>/<user>/<model>/<engine>-<release>/<gpu type>/<cache name>

per user, because a cache holds code the engine loads and runs (compiled kernels, .so files):
the launch script makes <cache_dir>/<user> 0700 and refuses one another user owns or may
write (a planted cache would run that user's code as the deployer). Within it, so that the next job with the same model, engine release and GPU type finds what this one
compiled, while another release or GPU never reads kernels built for something else. <model> is
the model directory's name: two paths to the same weights share one cache, which is right for
kernels (they depend on the shapes, not on the weights' values).

Before the engine starts, its launch script says for each cache whether it is warm: its probe
(the directory, or the part of it that only compiled artifacts fill) holds at least one file.
It reads the directory from the variable as finally exported, so a user's own value in `env:`
is the one reported. The lines go to the engine's log and to run/caches/, which the in-job
runtime puts in state.json (runtime/caches.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
CACHE_REPORTS = "run/caches"  # in the job directory: one file per instance attempt and node


@dataclass(frozen=True)
class CachePlan:
    name: str      # the cache's own name: vllm, triton, deep_gemm, ...
    var: str       # the environment variable the engine reads
    path: str      # where hpcserve points it
    probe: str     # warm when <the variable's value>/<probe> holds a file ("" = the directory)


def user_root(cache_dir: str, user: str) -> str:
    """<cache_dir>/<user>: the part of a site's cache directory that is this user's alone."""
    return f"{cache_dir.rstrip('/')}/{slug(user)}"


def slug(text: str) -> str:
    return _SLUG.sub("_", text).strip("_") or "_"


def plan_caches(cache_dir: str | None, user: str, model_path: str, engine: str, adapter: Any,
                rel: Any, gpu_type: str) -> tuple[CachePlan, ...]:
    """The caches of one deployment: none without a cache_dir."""
    if not cache_dir:
        return ()
    model = slug(model_path.rstrip("/").rsplit("/", 1)[-1])
    base = (f"{user_root(cache_dir, user)}/{model}/{engine}-{rel.version}/"
            f"{slug(gpu_type)}")
    return tuple(CachePlan(c.name, c.var, f"{base}/{c.name}", c.probe)
                 for c in adapter.cache_vars(rel))
