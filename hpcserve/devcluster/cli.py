"""`hpcserve dev-cluster`: a real local Slurm cluster (one network namespace per node) for demos and tests.

The cluster logic is imported inside each command so `hpcserve --help` stays fast.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
from typing import Any, Callable

import click

_STATE_DIR_HELP = "Where the cluster keeps everything [default: $HPCSERVE_DEVCLUSTER_DIR or /tmp/hpcserve-devcluster]."


def _state_dir_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--state-dir", type=click.Path(file_okay=False), default=None, help=_STATE_DIR_HELP)(f)


def _reports_errors(f: Callable[..., Any]) -> Callable[..., Any]:
    """DevClusterError -> its message on stderr and exit 2, never a traceback."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from hpcserve.devcluster.cluster import DevClusterError

        try:
            return f(*args, **kwargs)
        except DevClusterError as e:
            click.echo(f"hpcserve dev-cluster: error: {e}", err=True)
            sys.exit(e.exit_code)

    return wrapper


def _state_dir_args(cluster: Any) -> str:
    """` --state-dir DIR` when the cluster is not at the default place, so printed hints work as-is."""
    from hpcserve.devcluster.cluster import default_state_dir

    if cluster.state_dir == default_state_dir().absolute():
        return ""
    return f" --state-dir {shlex.quote(str(cluster.state_dir))}"


@click.group("dev-cluster", short_help="A real multi-node Slurm cluster on this machine (no GPUs).")
def dev_cluster() -> None:
    """A real multi-node Slurm cluster on this machine (needs root and slurm-wlm).

    One slurmctld plus one slurmd per node; every node runs in its own network namespace with its
    own address on a private bridge, so multi-node jobs, het jobs and `srun --mpi=pmix` behave as on
    a real cluster. Nothing leaves the machine.

    \b
    Example:
      hpcserve dev-cluster up --nodes 4
      eval "$(hpcserve dev-cluster env)"; hpcserve submit examples/demo.yaml
    """


@dev_cluster.command("up", short_help="Start the cluster and wait until every node is idle.")
@click.option("--nodes", type=click.IntRange(1, 200), default=4, show_default=True, help="Number of nodes.")
@_state_dir_option
@click.option("--subnet", default=None, help="Private IPv4 subnet for the nodes [default: 10.250.0.0/24].")
@click.option("--prefix", default=None, help="Prefix of namespace/veth names: <prefix>-n1, <prefix>-v1 [default: hs].")
@click.option("--bridge", default=None, help="Bridge name [default: <prefix>-br0].")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait for idle nodes.")
@_reports_errors
def up_cmd(nodes: int, state_dir: str | None, subnet: str | None, prefix: str | None,
           bridge: str | None, timeout: float) -> None:
    """Start the cluster and wait until every node is idle (idempotent).

    \b
    Example:
      hpcserve dev-cluster up --nodes 4
    """
    from hpcserve.devcluster.cluster import DEFAULT_PREFIX, DEFAULT_SUBNET, DevCluster

    cluster = DevCluster(state_dir, nodes=nodes, subnet=subnet or DEFAULT_SUBNET,
                         prefix=prefix or DEFAULT_PREFIX, bridge=bridge, timeout=timeout)
    info = cluster.up()
    ctld = info["controller"]
    addrs = [n["address"] for n in info["nodes"]]
    names = [n["name"] for n in info["nodes"]]
    if info["already_up"]:
        click.echo(f"dev cluster already up in {info['state_dir']} (healthy)")
    else:
        click.echo(f"dev cluster up in {info['elapsed_s']:.1f} s")
    click.echo(f"  nodes:      {len(names)} ({names[0]}..{names[-1]}) at {addrs[0]}..{addrs[-1]}, partition "
               f"'{info['partition']}'")
    click.echo(f"  controller: {ctld['address']}:{ctld['port']} (pid {ctld['pid']})")
    click.echo(f"  state dir:  {info['state_dir']}")
    click.echo("Point Slurm's own commands at it:")
    click.echo(f"  export SLURM_CONF={shlex.quote(info['slurm_conf'])}")
    click.echo(f"or\n  eval \"$(hpcserve dev-cluster env{_state_dir_args(cluster)})\"")
    click.echo(f"Stop it with: hpcserve dev-cluster down{_state_dir_args(cluster)}")


@dev_cluster.command("down", short_help="Stop the cluster's processes; remove its namespaces and links.")
@_state_dir_option
@_reports_errors
def down_cmd(state_dir: str | None) -> None:
    """Stop every process the cluster started and remove its namespaces and links.

    \b
    Example:
      hpcserve dev-cluster down
    """
    from hpcserve.devcluster.cluster import DevCluster

    result = DevCluster(state_dir).down()
    if not result["was_up"]:
        click.echo(f"no dev cluster is up in {result['state_dir']}; nothing to do")
        return
    click.echo(f"dev cluster in {result['state_dir']} is down: ended {len(result['ended'])} process(es), "
               f"removed {', '.join(result['removed']) or 'nothing'}")


@dev_cluster.command("status", short_help="Nodes and their state; exit 1 unless up and healthy.")
@_state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_reports_errors
def status_cmd(state_dir: str | None, as_json: bool) -> None:
    """Nodes and their state; exit 0 when up and healthy, 1 otherwise.

    \b
    Example:
      hpcserve dev-cluster status --json
    """
    from hpcserve.devcluster.cluster import DevCluster

    info = DevCluster(state_dir).status()
    if as_json:
        click.echo(json.dumps(info, indent=2, sort_keys=True))
    elif not info["up"]:
        click.echo(f"no dev cluster is up in {info['state_dir']}")
    else:
        ctld = info["controller"]
        click.echo(f"state dir:  {info['state_dir']}")
        click.echo(f"slurm.conf: {info['slurm_conf']}")
        click.echo(f"controller: pid {ctld['pid']} ({'running' if ctld['alive'] else 'NOT running'}) "
                   f"at {ctld['address']}:{ctld['port']}")
        click.echo(f"health:     {'healthy' if info['healthy'] else 'UNHEALTHY: ' + ', '.join(info['problems'])}")
        click.echo(f"{'NODE':<8} {'STATE':<10} {'ADDRESS':<15} {'NETNS':<12} SLURMD")
        for n in info["nodes"]:
            slurmd = f"pid {n['slurmd_pid']}" + ("" if n["slurmd_alive"] else " (NOT running)")
            click.echo(f"{n['name']:<8} {n['state']:<10} {n['address']:<15} {n['netns']:<12} {slurmd}")
    sys.exit(0 if info["up"] and info["healthy"] else 1)


@dev_cluster.command("env", short_help="Print the SLURM_CONF export that points Slurm's commands at it.")
@_state_dir_option
@_reports_errors
def env_cmd(state_dir: str | None) -> None:
    """Print `export SLURM_CONF=...` for `eval "$(hpcserve dev-cluster env)"`.

    \b
    Example:
      eval "$(hpcserve dev-cluster env)"
    """
    from hpcserve.devcluster.cluster import DevCluster, DevClusterError

    cluster = DevCluster(state_dir)
    if not cluster.conf_path.exists():
        raise DevClusterError(f"no dev cluster is up in {cluster.state_dir}; start one with "
                              f"`hpcserve dev-cluster up{_state_dir_args(cluster)}`")
    click.echo(cluster.env(), nl=False)
