"""The `hpcserve` command. Imports stay inside the commands so `hpcserve --help` starts fast."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .errors import HpcserveError


class _Group(click.Group):
    """Turns hpcserve's own errors into one line on stderr and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except HpcserveError as e:
            click.echo(f"hpcserve: error: {e}", err=True)
            sys.exit(e.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hpcserve")
def main() -> None:
    """Serve the largest open LLMs on Slurm from one YAML file.

    \b
    hpcserve plan deploy.yaml      what would run where (components, nodes, ranks, ports, argv)
    hpcserve render deploy.yaml    write the self-contained job directory
    hpcserve schema                JSON Schemas of the deployment and site files
    hpcserve dev-cluster up        a real local Slurm cluster to try it without GPUs
    """


_set_opt = click.option("--set", "sets", multiple=True, metavar="KEY.PATH=VALUE",
                        help="override any deployment value (repeatable), e.g. "
                             "--set roles.decode.nodes=8 --set site.slurm.partition=gpu")


def _plan(file: str, sets: tuple[str, ...]):
    from . import config, plan
    return plan.build(config.load(file, sets))


def _default_out(p, jobs_dir: str) -> Path:
    import time
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(jobs_dir).expanduser() / f"{p.name}-{stamp}"


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@_set_opt
@click.option("--out", "-o", type=click.Path(file_okay=False),
              help="job directory to write (default: <jobs_dir>/<name>-<timestamp>)")
def render(file: str, sets: tuple[str, ...], out: str | None) -> None:
    """Write the job directory for FILE and print its path."""
    from .render import render_files, write_job
    p = _plan(file, sets)
    target = Path(out) if out else _default_out(p, p.jobs_dir)
    target = target.resolve()
    written = write_job(render_files(p, str(target)), target)
    for w in p.warnings:
        click.echo(f"hpcserve: warning: {w}", err=True)
    click.echo(str(written))


@main.command("plan")
@click.argument("file", type=click.Path(dir_okay=False))
@_set_opt
@click.option("--json", "as_json", is_flag=True, help="the plan as JSON")
def plan_cmd(file: str, sets: tuple[str, ...], as_json: bool) -> None:
    """Show what FILE would run where: components, nodes, roles, ranks, ports, commands."""
    p = _plan(file, sets)
    if as_json:
        import json
        from .render import plan_json
        click.echo(json.dumps(plan_json(p, "<job-dir>"), indent=1))
        return
    from .table import plan_table
    click.echo(plan_table(p))


@main.command()
@click.argument("which", type=click.Choice(["deployment", "site", "profile", "all"]),
                default="all")
def schema(which: str) -> None:
    """Print the JSON Schema of deployment and site files (for editors' YAML validation)."""
    import json
    from .config import schemas
    s = schemas()
    click.echo(json.dumps(s if which == "all" else s[which], indent=1))


@main.command()
def profiles() -> None:
    """List the bundled model profiles."""
    from .config import BUNDLED_PROFILES, load_profile
    for f in sorted(BUNDLED_PROFILES.glob("*.yaml")):
        prof, _ = load_profile(f.stem)
        click.echo(f"{prof.name:20} {prof.description}")


def _register_dev_cluster() -> None:
    try:
        from .devcluster.cli import dev_cluster
    except ImportError:  # pragma: no cover - package incomplete
        return
    main.add_command(dev_cluster)


_register_dev_cluster()
