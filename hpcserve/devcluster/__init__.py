"""A real local Slurm cluster (one network namespace per node) for demos and tests.

`from hpcserve.devcluster import DevCluster, DevClusterError`; the CLI group is in `.cli`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DevCluster", "DevClusterError"]


def __getattr__(name: str) -> Any:
    # Lazy so that importing the CLI group (which imports this package) stays cheap.
    if name in __all__:
        from hpcserve.devcluster import cluster

        return getattr(cluster, name)
    raise AttributeError(name)
