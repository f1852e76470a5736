"""Pure parsers for what Slurm says of the cluster itself: its configuration (`scontrol show
config`) and its nodes' states (`sinfo -h -N -o NODE_STATES_FORMAT`).

Apart from the jobs' parsers: these read no job, and the runtime asks them on its own (the
cluster's settings, whether a node of the job is lost). Standard library only and nothing of
hpcserve: it ships in the job directory with the runtime.
"""

from __future__ import annotations

__all__ = ["config_argv", "parse_config", "NODE_STATES_FORMAT", "parse_node_states", "node_lost"]


def config_argv() -> list[str]:
    return ["scontrol", "show", "config"]


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config` -> {Key: value} ('ClusterName = dev' lines; values as printed)."""
    out = {}
    for line in (text or "").splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


# sinfo -h -N -o NODE_STATES_FORMAT: one line per node, its compact state ('idle', 'mix*').
NODE_STATES_FORMAT = "%N %t"


def parse_node_states(text: str) -> dict[str, str]:
    """`sinfo -h -N -o NODE_STATES_FORMAT` -> {node: compact state}."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def node_lost(state: str) -> bool:
    """A compact sinfo state of a node that is gone for its jobs: down, failed or not responding
    (any state with '*')."""
    return state.endswith("*") or state.rstrip("*") in ("down", "fail", "failg")
