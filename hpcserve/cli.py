"""The `hpcserve` command. Imports stay inside the commands so `hpcserve --help` starts fast."""

from __future__ import annotations

import json
import os
import posixpath
import sys
from pathlib import Path

import click

from .errors import HpcserveError


class _Group(click.Group):
    """Turns hpcserve's own errors into one line on stderr and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # `hpcserve status | head`: the reader is gone; leave quietly, as other tools do
            # (and keep Python from complaining when it flushes stdout at exit).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except HpcserveError as e:
            click.echo(f"hpcserve: error: {e}", err=True)
            sys.exit(e.exit_code)
        except OSError as e:  # a path we could not write or read: one line, not a traceback
            where = f"{e.filename}: " if e.filename else ""
            click.echo(f"hpcserve: error: {where}{e.strerror or e}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hpcserve")
def main() -> None:
    """Serve the largest open LLMs on Slurm from one YAML file.

    \b
    hpcserve plan deploy.yaml      what would run where (components, nodes, ranks, ports, argv)
    hpcserve render deploy.yaml    write the self-contained job directory
    hpcserve preflight deploy.yaml the checks every node runs first, as a short job
    hpcserve schema                JSON Schemas of the deployment and site files
    hpcserve dev-cluster up        a real local Slurm cluster to try it without GPUs
    """


# A plain string: the loader checks the file itself (a directory, FIFO or device is refused in
# one line naming the file, where click would print a usage block).
_file_arg = click.argument("file", metavar="FILE")
_set_opt = click.option("--set", "sets", multiple=True, metavar="KEY.PATH=VALUE",
                        help="override any deployment value (repeatable), e.g. "
                             "--set roles.decode.nodes=8 --set site.slurm.partition=gpu")


def _plan(file: str, sets: tuple[str, ...]):
    """The plan, its warnings on stderr first: before a table, a path or JSON, where they are
    read (an engine release checked against another one's flags is one)."""
    from . import config, plan
    p = plan.build(config.load(file, sets))
    for w in p.warnings:
        click.echo(f"hpcserve: warning: {w}", err=True)
    return p


def _default_out(p, jobs_dir: str) -> Path:
    import time
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(jobs_dir).expanduser() / f"{p.name}-{stamp}"


@main.command()
@_file_arg
@_set_opt
@click.option("--out", "-o",
              help="job directory to write (default: <jobs_dir>/<name>-<timestamp>)")
def render(file: str, sets: tuple[str, ...], out: str | None) -> None:
    """Write the job directory for FILE and print its path."""
    from .render import render_files, write_job
    p = _plan(file, sets)
    target = Path(out) if out else _default_out(p, p.jobs_dir)
    target = target.resolve()
    written = write_job(render_files(p, str(target)), target)
    click.echo(str(written))


@main.command("plan")
@_file_arg
@_set_opt
@click.option("--json", "as_json", is_flag=True, help="the plan as JSON")
def plan_cmd(file: str, sets: tuple[str, ...], as_json: bool) -> None:
    """Show what FILE would run where: components, nodes, roles, ranks, ports, commands."""
    p = _plan(file, sets)
    if as_json:
        import json
        from .plan_json import job_spec
        click.echo(json.dumps(job_spec(p, "<job-dir>"), indent=1))
        return
    from .fit import fit_table
    from .table import plan_table
    click.echo(plan_table(p))
    if p.fits:
        click.echo("\n".join(fit_table(list(p.fits))))


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


def _remote_opts(f):
    for opt in reversed([
        click.option("--remote", metavar="USER@HOST[:PORT]", envvar="HPCSERVE_REMOTE",
                     help="run Slurm's commands on this login node over SSH"),
        click.option("--jump", metavar="USER@HOST[:PORT]", help="SSH jump host"),
        click.option("--identity", "-i", type=click.Path(dir_okay=False), multiple=True,
                     help="SSH private key (default: agent and ~/.ssh keys)"),
        click.option("--known-hosts", type=click.Path(dir_okay=False),
                     help="known_hosts file (default ~/.ssh/known_hosts); unknown keys are refused"),
    ]):
        f = opt(f)
    return f


def _runner(remote, jump=None, identity=(), known_hosts=None):
    from .ops import runner_for
    return runner_for(remote, jump=jump, key_filenames=list(identity) or None,
                      known_hosts=known_hosts)


@main.command()
@_file_arg
@_set_opt
@click.option("--out", "-o", help="job directory (default: <jobs_dir>/<name>-<timestamp>)")
@click.option("--dry-run", is_flag=True, help="render only; print the job directory")
@click.option("--check", is_flag=True, help="ask Slurm whether it would run (sbatch --test-only)")
@click.option("--follow", "-f", is_flag=True, help="show the phases live until serving or failure")
@click.option("--wait", "-w", is_flag=True, help="wait until serving or failure, print the end")
@_remote_opts
def submit(file, sets, out, dry_run, check, follow, wait, remote, jump, identity, known_hosts):
    """Render FILE and submit it with sbatch; print the job id and the job directory."""
    from . import ops
    runner = _runner(remote, jump, identity, known_hosts)
    res = ops.submit(file, sets, runner=runner, remote=remote, out=out, dry_run=dry_run,
                     check=check, warn=lambda w: click.echo(f"hpcserve: warning: {w}", err=True))
    if isinstance(res, str):
        click.echo(res)
        return
    click.echo(f"submitted job {res.job_id}: {res.name}")
    click.echo(f"job directory: {res.job_dir}")
    if not (follow or wait):
        from .deployments import reference
        r = f" --remote {remote}" if remote else ""
        ref = reference(res.entry)
        click.echo(f"follow it with: hpcserve status {ref}{r}   (logs: hpcserve logs {ref}{r})")
        return
    sys.exit(ops.follow(res.entry, runner, echo=click.echo, quiet=wait))


@main.command()
@_file_arg
@_set_opt
@click.option("--json", "as_json", is_flag=True, help="print state.json's preflight block")
@_remote_opts
def preflight(file, sets, as_json, remote, jump, identity, known_hosts):
    """Run FILE's preflight checks as a short job of its own, before a long one: the same
    allocation, ten minutes, no engines. Prints one row per node; exit 1 if a check failed."""
    from . import ops
    runner = _runner(remote, jump, identity, known_hosts)
    res = ops.submit(file, sets, runner=runner, remote=remote, out=None, dry_run=False,
                     check=False, preflight_only=True,
                     warn=lambda w: click.echo(f"hpcserve: warning: {w}", err=True))
    click.echo(f"submitted preflight job {res.job_id}: {res.job_dir}", err=True)
    rc = ops.follow(res.entry, runner, echo=lambda line: click.echo(line, err=True), quiet=True,
                    until_serving=False)
    result = ops.preflight_result(runner, res.job_dir)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    elif result:
        from .runtime.preflight import table_text
        click.echo("\n".join(table_text(result)))
    sys.exit(rc)


@main.command()
@click.argument("jobs", nargs=-1)
@click.option("--json", "as_json", is_flag=True)
@click.option("--probe", is_flag=True, help="also probe each serving endpoint's /health")
@click.option("--follow", "-f", is_flag=True, help="follow one job's phases live")
@_remote_opts
def status(jobs, as_json, probe, follow, remote, jump, identity, known_hosts):
    """Where deployments stand: Slurm's state (one squeue call) merged with each job's state.json."""
    import json
    from . import deployments, ops
    runners = {}

    def runner_of(r):
        if r not in runners:
            runners[r] = _runner(r or remote, jump, identity, known_hosts)
        return runners[r]

    if jobs:
        entries = [ops.resolve(j, remote, runner_of(remote)) for j in jobs]
    else:
        entries = [e for e in deployments.entries() if not remote or e.remote == remote]
    if follow:
        if len(entries) != 1:
            raise HpcserveError("--follow takes exactly one job")
        sys.exit(ops.follow(entries[0], runner_of(entries[0].remote), echo=click.echo))
    views = ops.status(entries, runner_of, probe=probe)
    if as_json:
        click.echo(json.dumps([v.as_json() for v in views], indent=1))
    elif views:
        click.echo(ops.status_table(views, instances=True))
        for v in views if jobs else []:  # the jobs asked for by name: why each one failed
            detail = ops.failure_detail(v)
            if detail:
                click.echo(detail)
    else:
        click.echo("no deployments")
    failed = [v for v in views if v.summary_phase == "failed" or v.ended]
    sys.exit(1 if failed and jobs else 0)


@main.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option("--all", "show_all", is_flag=True, help="include finished deployments")
@_remote_opts
def list_cmd(as_json, show_all, remote, jump, identity, known_hosts):
    """This user's deployments with their phase and endpoint."""
    import json
    from . import deployments, ops
    from .runtime.contract import TERMINAL_PHASES
    entries = [e for e in deployments.entries() if not remote or e.remote == remote]
    views = ops.status(entries, lambda r: _runner(r or remote, jump, identity, known_hosts))
    if not show_all:
        views = [v for v in views if v.summary_phase not in TERMINAL_PHASES and not v.ended]
    if as_json:
        click.echo(json.dumps([v.as_json() for v in views], indent=1))
    else:
        click.echo(ops.status_table(views) if views else "no deployments")


@main.command()
@click.argument("job")
@click.option("--role", type=click.Choice(["prefill", "decode", "worker", "router", "batch",
                                           "hpcserve-job", "discover"]))
@click.option("--instance", type=int)
@click.option("--node", help="node rank or host name")
@click.option("--attempt", type=click.IntRange(0),
              help="one start of the instances: 0 the first, N its Nth restart "
                   "(default: every attempt, oldest first)")
@click.option("--follow", "-f", is_flag=True, help="keep printing what is appended")
@click.option("--lines", "-n", type=int, default=50, show_default=True)
@_remote_opts
def logs(job, role, instance, node, attempt, follow, lines, remote, jump, identity, known_hosts):
    """Show a deployment's logs (logs/<role>-<instance>.node<rank>.<host>.log and others; a
    restarted instance's attempt N: <role>-<instance>.attemptN.node<rank>.<host>.log)."""
    import time
    from . import ops
    e = ops.resolve(job, remote, _runner(remote, jump, identity, known_hosts))
    runner = _runner(e.remote, jump, identity, known_hosts)  # where the job was submitted
    files = ops.log_files(runner, e, role, instance, node, attempt)
    if not files:
        which = _attempts_there(runner, e, role, instance, node, attempt)
        raise HpcserveError(f"no log of job {e.job_id} matches{which} "
                            f"(logs are in {e.job_dir}/logs)")
    seen, last = {}, None
    for f in files:
        text = runner.read_text(f) or ""
        if len(files) > 1:
            click.echo(f"==> {f} <==")
        click.echo("\n".join(text.splitlines()[-lines:]))
        seen[f], last = len(text), f
    while follow:
        time.sleep(0.5)
        # listed again each time: a restart's new attempt is followed as soon as it writes
        for f in ops.log_files(runner, e, role, instance, node, attempt):
            text = runner.read_text(f) or ""
            if len(text) > seen.get(f, 0):
                if f != last:
                    click.echo(f"\n==> {f} <==")  # as tail -f: say whose lines follow
                click.echo(text[seen.get(f, 0):], nl=False)
                seen[f], last = len(text), f


def _attempts_there(runner, e, role, instance, node, attempt) -> str:
    """Where --attempt matched nothing: the attempts that have logs, so the next try hits."""
    from . import ops
    if attempt is None:
        return ""
    have = sorted({ops.LogName.of(posixpath.basename(f)).attempt
                   for f in ops.log_files(runner, e, role, instance, node)})
    return f" attempt {attempt} (attempts with logs: {', '.join(map(str, have)) or 'none'})"


def _ints(ctx, param, value):
    return _numbers(value, int, param)


def _floats(ctx, param, value):
    return _numbers(value, float, param)


def _numbers(value, kind, param):
    if value is None:
        return ()
    try:
        out = tuple(kind(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: a comma-separated list of numbers") from None
    if not out or any(v <= 0 for v in out):
        raise click.BadParameter(f"{value!r}: numbers above 0")
    return out


@main.command()
@click.argument("job")
@click.option("--concurrency", "-c", callback=_ints, metavar="N,N,...",
              help="the sweep (default: the deployment's benchmark:, else 1,16)")
@click.option("--rate", callback=_floats, metavar="R,R,...", help="requests/s at each point")
@click.option("--prompts", type=click.IntRange(1), help="requests per point (default 4 x N)")
@click.option("--input-tokens", type=click.IntRange(1))
@click.option("--output-tokens", type=click.IntRange(1))
@click.option("--warmup", type=click.IntRange(0))
@click.option("--client", help="whose benchmark client (default: the engine's own)")
@click.option("--python", help="the python on the node that has the client")
@click.option("--tokenizer", help="tokenizer directory (default: the model path)")
@click.option("--in-allocation", is_flag=True,
              help="run as a step in the deployment's own allocation (no spare node needed; "
                   "the only way over SSH) instead of a one-node job of its own")
@click.option("--json", "as_json", is_flag=True, help="the gate's verdict as JSON")
@_remote_opts
def bench(job, concurrency, rate, prompts, input_tokens, output_tokens, warmup, client, python,
          tokenizer, in_allocation, as_json, remote, jump, identity, known_hosts):
    """Benchmark a deployment that serves, with the engine's own client; the same gate as a
    deployment's benchmark: step. Exit 1 if a point fails it."""
    import time
    from . import bench_ops, ops
    from .runtime.bench import one_line
    e = ops.resolve(job, remote, _runner(remote, jump, identity, known_hosts))
    runner = _runner(e.remote, jump, identity, known_hosts)
    if e.remote and not in_allocation:
        raise HpcserveError("over SSH the benchmark runs as a step of the deployment's own "
                            "allocation: add --in-allocation (submitit submits from this "
                            "machine)")
    ask = bench_ops.Sweep(concurrency, rate, prompts, input_tokens, output_tokens, warmup,
                          client, python, tokenizer)
    prep = bench_ops.prepare(e, runner, ask, time.strftime("%Y%m%d-%H%M%S"))
    click.echo(f"benchmark of job {e.job_id}: {len(prep.spec['points'])} point(s), results in "
               f"{prep.bench_dir}", err=True)
    limit = prep.spec["point_timeout_s"] * len(prep.spec["points"]) + 120
    if in_allocation:
        result = bench_ops.in_allocation(prep, e, runner, limit)
    else:
        result = bench_ops.as_job(prep, bench_ops.partition_of(runner, e), limit // 60 + 1,
                                  e.name)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        for p in result["points"]:
            click.echo(one_line(p))
        click.echo("benchmark passed" if result["passed"] else
                   f"benchmark FAILED at {result['failed']['point']}: "
                   f"{result['failed']['reason']}")
    sys.exit(0 if result["passed"] else 1)


@main.command()
@click.argument("jobs", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="the rows as JSON (no files written)")
@click.option("--out", "-o", help="where the plots and report.html go (default: the job "
                                  "directory's report/ for one local job, else ./hpcserve-report)")
@_remote_opts
def report(jobs, as_json, out, remote, jump, identity, known_hosts):
    """A benchmark's table and plots (PNG and one self-contained HTML page); several jobs side
    by side. Exit 1 if a job's benchmark failed its gate."""
    from . import ops
    from . import report as rep
    entries = [ops.resolve(j, remote, _runner(remote, jump, identity, known_hosts))
               for j in jobs]
    loaded = [rep.load(e, _runner(e.remote, jump, identity, known_hosts)) for e in entries]
    if as_json:
        click.echo(json.dumps(rep.as_json(loaded), indent=1))
    else:
        click.echo(rep.table_text(loaded))
        one_local = len(entries) == 1 and not entries[0].remote
        dest = Path(out) if out else (Path(entries[0].job_dir) / "report" if one_local
                                      else Path("hpcserve-report"))
        click.echo(f"report: {rep.write(loaded, dest)}")
    sys.exit(0 if all(j.bench["passed"] for j in loaded) else 1)


@main.command()
@click.argument("job")
@click.option("--wait", "-w", is_flag=True, help="wait until the teardown is complete")
@_remote_opts
def cancel(job, wait, remote, jump, identity, known_hosts):
    """Stop a deployment through its own graceful path (router first, then engines)."""
    from . import ops
    e = ops.resolve(job, remote, _runner(remote, jump, identity, known_hosts))
    runner = _runner(e.remote, jump, identity, known_hosts)  # where the job was submitted
    sys.exit(ops.cancel(e, runner, wait=wait, echo=click.echo))


def _register_dev_cluster() -> None:
    try:
        from .devcluster.cli import dev_cluster
    except ImportError:  # pragma: no cover - package incomplete
        return
    main.add_command(dev_cluster)


_register_dev_cluster()
