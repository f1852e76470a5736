"""The `hpcserve` command. Imports stay inside the commands so `hpcserve --help` starts fast."""

from __future__ import annotations

import json
import os
import posixpath
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from .errors import HpcserveError

# `hpcserve --help` lists the commands under these headings, in this order; a command missing
# here is listed under "other" (tests/unit/test_cli_help.py refuses that).
SECTIONS = (
    ("author a deployment", ("plan", "render", "schema", "profiles")),
    ("run and operate", ("preflight", "stage", "submit", "status", "list", "logs", "scale",
                         "upgrade", "cancel")),
    ("measure", ("bench", "report")),
    ("local test cluster", ("dev-cluster",)),
)


_SSH_OPTIONS = ("--remote", "--jump", "-i", "--identity", "--known-hosts")

class _Group(click.Group):
    """Turns hpcserve's own errors into one line on stderr and exit code 2, never a traceback.
    `dev-cluster` is loaded only when it is run or listed, so other commands skip its ~3 ms."""

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), "dev-cluster"})

    def get_command(self, ctx, name):
        if name == "dev-cluster" and name not in self.commands:
            from .devcluster.cli import dev_cluster
            self.add_command(dev_cluster)
        return super().get_command(ctx, name)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except click.NoSuchOption as e:
            if e.option_name not in _SSH_OPTIONS:
                raise
            # The SSH options moved before the command: say where, not "did you mean --probe".
            e.message = (f"{e.option_name} is an option of hpcserve itself: put it before the "
                         f"command (hpcserve {e.option_name} ... {ctx.invoked_subcommand} ...)")
            e.possibilities = []
            raise
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

    def format_commands(self, ctx, formatter):
        """Every command with its one-line summary, under the heading of what it is for."""
        cmds = {n: c for n in self.list_commands(ctx)
                if (c := self.get_command(ctx, n)) is not None and not c.hidden}
        listed = {n for _, names in SECTIONS for n in names}
        sections = [*SECTIONS, ("other", tuple(n for n in cmds if n not in listed))]
        width = max(map(len, cmds), default=0)  # one column for every section
        for title, names in sections:
            rows = [(n.ljust(width), cmds[n].get_short_help_str(limit=200))
                    for n in names if n in cmds]
            if rows:
                with formatter.section(title[0].upper() + title[1:]):
                    formatter.write_dl(rows)


@dataclass(frozen=True)
class Ssh:
    """The group's SSH options (or their HPCSERVE_* variables), read by every command that
    talks to Slurm: where it runs and how it gets there."""

    remote: str | None = None
    jump: str | None = None
    identity: tuple[str, ...] = ()
    known_hosts: str | None = None

    def runner(self, remote: str | None):
        """Slurm's commands here (remote None) or over SSH on `remote`, with these options."""
        from .operate.ops import runner_for
        return runner_for(remote, jump=self.jump,
                          key_filenames=list(self.identity) or None,
                          known_hosts=self.known_hosts)

    def runners(self):
        """runner_of(remote): one runner per login host (None: this one's, --remote), however
        many jobs it serves."""
        made = {}

        def runner_of(r: str | None):
            if r not in made:
                made[r] = self.runner(r or self.remote)
            return made[r]
        return runner_of


def _ssh() -> Ssh:
    return click.get_current_context().find_object(Ssh) or Ssh()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"],
                                           "max_content_width": 100})
@click.version_option(package_name="hpcserve")
@click.option("--remote", metavar="USER@HOST[:PORT]", envvar="HPCSERVE_REMOTE",
              help="run Slurm's commands on this login node over SSH [env: HPCSERVE_REMOTE]")
@click.option("--jump", metavar="USER@HOST[:PORT]", envvar="HPCSERVE_JUMP",
              help="SSH jump host on the way to --remote [env: HPCSERVE_JUMP]")
@click.option("--identity", "-i", type=click.Path(dir_okay=False), multiple=True,
              envvar="HPCSERVE_IDENTITY",
              help="SSH private key, repeatable (default: agent and ~/.ssh keys) "
                   "[env: HPCSERVE_IDENTITY, several separated by ':']")
@click.option("--known-hosts", type=click.Path(dir_okay=False), envvar="HPCSERVE_KNOWN_HOSTS",
              help="known_hosts file (default ~/.ssh/known_hosts); unknown host keys are "
                   "refused [env: HPCSERVE_KNOWN_HOSTS]")
@click.pass_context
def main(ctx, remote, jump, identity, known_hosts) -> None:
    """Serve the largest open LLMs on Slurm from one YAML file, with SGLang, vLLM, TensorRT-LLM
    or KTransformers.

    The SSH options come before the command and hold for every command that talks to Slurm.

    \b
    Example:
      hpcserve plan examples/demo.yaml
      hpcserve --remote me@login.example.org submit deploy.yaml
      export HPCSERVE_REMOTE=me@login.example.org; hpcserve status
    """
    ctx.obj = Ssh(remote, jump, tuple(identity), known_hosts)


# A plain string: the loader checks the file itself (a directory, FIFO or device is refused in
# one line naming the file, where click would print a usage block).
_file_arg = click.argument("file", metavar="FILE")
_set_opt = click.option("--set", "sets", multiple=True, metavar="KEY.PATH=VALUE",
                        help="override any deployment value (repeatable), e.g. "
                             "--set roles.decode.nodes=8 --set site.slurm.partition=gpu")


def _plan(file: str, sets: tuple[str, ...]):
    """The plan, its warnings on stderr first: before a table, a path or JSON, where they are
    read (an engine release checked against another one's flags is one)."""
    from .author import config, plan
    p = plan.build(config.load(file, sets))
    for w in p.warnings:
        click.echo(f"hpcserve: warning: {w}", err=True)
    return p


def _default_out(p, jobs_dir: str) -> Path:
    import time
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(jobs_dir).expanduser() / f"{p.name}-{stamp}"


@main.command(short_help="Write FILE's self-contained job directory and print its path.")
@_file_arg
@_set_opt
@click.option("--out", "-o",
              help="job directory to write (default: <jobs_dir>/<name>-<timestamp>)")
def render(file: str, sets: tuple[str, ...], out: str | None) -> None:
    """Write the job directory for FILE and print its path: the batch script, one launch script
    per instance, plan.json and the runtime, nothing submitted.

    \b
    Example:
      hpcserve render examples/demo.yaml --out /tmp/demo-job
    """
    from .author.render import render_files, write_job
    p = _plan(file, sets)
    target = Path(out) if out else _default_out(p, p.jobs_dir)
    # the parent resolved, never the directory itself: a link there is a path that exists
    target = target.parent.resolve() / target.name
    written = write_job(render_files(p, str(target)), target)
    click.echo(str(written))


@main.command("plan", short_help="Show what FILE would run where: nodes, ranks, ports, commands.")
@_file_arg
@_set_opt
@click.option("--json", "as_json", is_flag=True, help="the plan as JSON (plan.json's content)")
@click.option("--argv", "as_argv", is_flag=True,
              help="every node's full command line, one node per block, instead of the summary")
def plan_cmd(file: str, sets: tuple[str, ...], as_json: bool, as_argv: bool) -> None:
    """Show what FILE would run where: the components, nodes, ranks and ports, then each
    instance's command once, one option per line, with what differs per node as the launch
    script's variable ($NODE_RANK, $NODE_IP, $LEADER_IP), then whether the model fits.

    \b
    Example:
      hpcserve plan examples/kimi-k2-instruct-4p12d.yaml
      hpcserve plan examples/demo.yaml --set roles.decode.nodes=2 --argv
    """
    p = _plan(file, sets)
    if as_json:
        from .author.plan_json import job_spec
        click.echo(json.dumps(job_spec(p, "<job-dir>"), indent=1))
        return
    from .author.table import plan_argv, plan_text
    click.echo(plan_argv(p) if as_argv else plan_text(p))


@main.command(short_help="JSON Schemas of the deployment, site and profile files.")
@click.argument("which", type=click.Choice(["deployment", "site", "profile", "all"]),
                default="all")
def schema(which: str) -> None:
    """Print the JSON Schema of WHICH file kind (default: all three), for editors' YAML
    validation.

    \b
    Example:
      hpcserve schema deployment > hpcserve-deployment.schema.json
    """
    from .author.config import schemas
    s = schemas()
    click.echo(json.dumps(s if which == "all" else s[which], indent=1))


@main.command(short_help="List the bundled model profiles.")
def profiles() -> None:
    """List the bundled model profiles, the names a deployment's model.profile takes.

    \b
    Example:
      hpcserve profiles
    """
    from .author.config import BUNDLED_PROFILES, load_profile
    for f in sorted(BUNDLED_PROFILES.glob("*.yaml")):
        prof, _ = load_profile(f.stem)
        click.echo(f"{prof.name:20} {prof.description}")


@main.command(short_help="Render FILE and submit it with sbatch; print the job id.")
@_file_arg
@_set_opt
@click.option("--out", "-o", help="job directory (default: <jobs_dir>/<name>-<timestamp>)")
@click.option("--dry-run", is_flag=True, help="render only; print the job directory")
@click.option("--check", is_flag=True,
              help="ask Slurm whether it would run (sbatch --test-only); with --in-allocation: "
                   "whether it fits the allocation, and where each role would run")
@click.option("--follow", "-f", is_flag=True, help="show the phases live until serving or failure")
@click.option("--wait", "-w", is_flag=True, help="wait until serving or failure, print the end")
@click.option("--in-allocation", is_flag=True,
              help="run as steps of the allocation this shell is in (salloc, your batch script)")
@click.option("--foreground", is_flag=True,
              help="with --in-allocation: run until the deployment ends, exit with its end "
                   "(0: cancelled or done); the last line of a batch script")
def submit(file, sets, out, dry_run, check, follow, wait, in_allocation, foreground):
    """Render FILE and submit it with sbatch; print the job id and the job directory.
    With --in-allocation, run it as steps of the allocation this shell is in instead: in the
    background, as long as that shell lives (salloc gives the allocation back when its shell
    exits; keep it open), or with --foreground until the deployment ends.

    \b
    Example:
      hpcserve submit examples/demo.yaml --follow
      hpcserve --remote me@login.example.org submit deploy.yaml --check
      salloc -N 4 --no-kill --time 2-0   # in its shell: hpcserve submit deploy.yaml --in-allocation
      # last line of your batch script:  hpcserve submit --in-allocation --foreground deploy.yaml
    """
    from .operate import ops
    if foreground and not in_allocation:
        raise click.UsageError("--foreground goes with --in-allocation (a job of its own runs "
                               "in Slurm's queue, not here)")
    ssh = _ssh()
    remote = ssh.remote
    runner = ssh.runner(remote)
    res = ops.submit(file, sets, runner=runner, remote=remote, out=out, dry_run=dry_run,
                     check=check, in_allocation=in_allocation,
                     warn=lambda w: click.echo(f"hpcserve: warning: {w}", err=True))
    if isinstance(res, str):
        click.echo(res)
        return
    click.echo(f"started {res.name} in allocation {res.job_id}" if in_allocation else
               f"submitted job {res.job_id}: {res.name}")
    click.echo(f"job directory: {res.job_dir}")
    if res.api_key_file:
        click.echo(f"API key: {res.api_key_file} (yours alone to read); clients send it as "
                   "`Authorization: Bearer <key>`")
    if foreground:
        from .operate.in_allocation import run_in_place
        sys.exit(run_in_place(res.driver, lambda: ops.follow(
            res.entry, runner, echo=click.echo, quiet=wait) if follow or wait else None))
    if res.driver is not None:
        from .operate.in_allocation import detach
        detach(res.driver)
    if not (follow or wait):
        from .operate.deployments import reference
        r = f"--remote {remote} " if remote else ""
        ref = reference(res.entry)
        click.echo(f"follow it with: hpcserve {r}status {ref}   (logs: hpcserve {r}logs {ref})")
        return
    sys.exit(ops.follow(res.entry, runner, echo=click.echo, quiet=wait))


def _short_job(file, sets, what: str, **only) -> tuple:
    """`preflight` and `stage`: FILE's allocation as a job that starts no engine, followed to
    its end. (exit code, its state.json)."""
    from .operate import ops
    ssh = _ssh()
    remote = ssh.remote
    runner = ssh.runner(remote)
    res = ops.submit(file, sets, runner=runner, remote=remote, out=None, dry_run=False,
                     check=False, warn=lambda w: click.echo(f"hpcserve: warning: {w}", err=True),
                     **only)
    if res.driver is not None:
        from .operate.in_allocation import detach
        detach(res.driver)
        click.echo(f"started {what} in allocation {res.job_id}: {res.job_dir}", err=True)
    else:
        click.echo(f"submitted {what} job {res.job_id}: {res.job_dir}", err=True)
    rc = ops.follow(res.entry, runner, echo=lambda line: click.echo(line, err=True), quiet=True,
                    until_serving=False)
    return rc, ops.job_state(runner, res.job_dir)


def _short_job_options(record: str):
    """FILE, --set, --json and --in-allocation: the options of a command that runs FILE as a
    short job of its own (preflight, stage)."""
    def wrap(f):
        for option in reversed((
                _file_arg, _set_opt,
                click.option("--json", "as_json", is_flag=True,
                             help=f"print state.json's {record}"),
                click.option("--in-allocation", is_flag=True,
                             help="run as steps of the allocation this shell is in (salloc, "
                                  "your batch script)"))):
            f = option(f)
        return f
    return wrap


@main.command(short_help="Run FILE's node checks as a short job before a long one.")
@_short_job_options("preflight block")
def preflight(file, sets, as_json, in_allocation):
    """Run FILE's preflight checks as a short job of its own, before a long one: the same
    allocation, ten minutes, no engines. Prints one row per node; exit 1 if a check failed.

    \b
    Example:
      hpcserve preflight examples/kimi-k2-instruct-4p12d.yaml
    """
    rc, result = _short_job(file, sets, "preflight", preflight_only=True,
                            in_allocation=in_allocation)
    result = result.get("preflight")
    if as_json:
        click.echo(json.dumps(result, indent=1))
    elif result:
        from .runtime.preflight import table_text
        click.echo("\n".join(table_text(result)))
    sys.exit(rc)


@main.command(short_help="Copy FILE's model to its nodes' stage cache as a job of its own.")
@_short_job_options("stage record")
def stage(file, sets, as_json, in_allocation):
    """Stage FILE's model on its nodes ahead of time (model.stage, as a job of its own: the same
    allocation, no engines): each node's stage cache (site.paths.stage_dir) gets a copy checked
    against the model's manifest, the shared path read once. Prints one row per node; exit 1 if
    a node failed.

    \b
    Example:
      hpcserve stage examples/kimi-k2-instruct-4p12d.yaml
    """
    rc, result = _short_job(file, sets, "stage", stage_only=True, in_allocation=in_allocation)
    result = result.get("stage")
    if as_json:
        click.echo(json.dumps(result, indent=1))
    elif result:
        from .author.table import columns
        rows = [("node", "outcome", "bytes read from the shared path", "took s", "detail")]
        rows += [(node, r["outcome"], f"{r.get('read_shared', 0):,}", str(r.get("took_s", "-")),
                  r.get("detail") or "") for node, r in result["nodes"].items()]
        click.echo("\n".join(columns(rows)))
    sys.exit(rc)


@main.command(short_help="Where deployments stand: Slurm's state and each job's phase.")
@click.argument("jobs", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="one object per deployment, as JSON")
@click.option("--probe", is_flag=True, help="also probe each serving endpoint's /health")
@click.option("--follow", "-f", is_flag=True, help="follow one job's phases live")
def status(jobs, as_json, probe, follow):
    """Where deployments stand (JOBS: job ids or names; default: this user's deployments):
    Slurm's state (one squeue call) merged with each job's state.json. Exit 1 if a job named
    has failed or ended.

    \b
    Example:
      hpcserve status 12345 --probe
      hpcserve --remote me@login.example.org status
    """
    from .operate import deployment_jobs, deployments, ops
    ssh = _ssh()
    remote = ssh.remote
    runner_of = ssh.runners()
    index = deployments.entries()
    if jobs:
        entries = [ops.resolve(j, remote, runner_of(remote)) for j in jobs]
    else:
        entries = [e for e in index if not remote or e.remote == remote]
    # each front with its instance jobs, slot jobs and successors
    found = deployment_jobs.of_entries(entries, runner_of, index)
    if follow:
        if len(found) != 1:
            raise HpcserveError("--follow takes exactly one job")
        sys.exit(ops.follow(found[0].entry, runner_of(found[0].entry.remote), echo=click.echo))
    views = deployment_jobs.views(found, runner_of, probe=probe)
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
    # an instance job listed under its front decides the exit code only where it was named
    failed = [v for v in views if (v.summary_phase == "failed" or v.ended)
              and (not v.front or v.job_id in jobs)]
    sys.exit(1 if failed and jobs else 0)


@main.command("list", short_help="This user's deployments with their phase and endpoint.")
@click.option("--json", "as_json", is_flag=True, help="one object per deployment, as JSON")
@click.option("--all", "show_all", is_flag=True, help="include finished deployments")
def list_cmd(as_json, show_all):
    """This user's deployments with their phase and endpoint (those still running; --all for
    every one hpcserve submitted), each front's instance jobs and autoscale slot jobs indented
    under it.

    \b
    Example:
      hpcserve list --all
    """
    from .operate import deployment_jobs, deployments, ops
    ssh = _ssh()
    remote = ssh.remote
    from .runtime.contract import TERMINAL_PHASES
    runner_of = ssh.runners()
    index = deployments.entries()
    # each front with its instance jobs, slot jobs and successors
    found = deployment_jobs.of_entries(
        [e for e in index if not remote or e.remote == remote], runner_of, index)
    views = deployment_jobs.views(found, runner_of)
    if not show_all:
        views = [v for v in views if v.summary_phase not in TERMINAL_PHASES and not v.ended]
    if as_json:
        click.echo(json.dumps([v.as_json() for v in views], indent=1))
    else:
        click.echo(ops.status_table(views) if views else "no deployments")


@main.command(short_help="Show or follow a deployment's logs (role, instance, node).")
@click.argument("job")
@click.option("--role", type=click.Choice(["prefill", "decode", "worker", "router", "batch",
                                           "hpcserve-job", "discover"]),
              help="only this role's logs (batch: the batch script's own log)")
@click.option("--instance", type=int, help="only this instance of the role (0, 1, ...)")
@click.option("--node", help="node rank or host name")
@click.option("--attempt", type=click.IntRange(0),
              help="one start of the instances: 0 the first, N its Nth restart "
                   "(default: every attempt, oldest first)")
@click.option("--follow", "-f", is_flag=True, help="keep printing what is appended")
@click.option("--lines", "-n", type=int, default=50, show_default=True,
              help="the last N lines of each log")
def logs(job, role, instance, node, attempt, follow, lines):
    """Show a deployment's logs (logs/<role>-<instance>.node<rank>.<host>.log and others; a
    restarted instance's attempt N: <role>-<instance>.attemptN.node<rank>.<host>.log). A front
    job's include those of every instance job under its scale/ (scale, renewal, autoscale).

    \b
    Example:
      hpcserve logs 12345 --role decode --node 0 -f
    """
    import time
    from .operate import ops
    ssh = _ssh()
    remote = ssh.remote
    e = ops.resolve(job, remote, ssh.runner(ssh.remote))
    runner = ssh.runner(e.remote)  # where the job was submitted
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
    from .operate import ops
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


@main.command(short_help="Benchmark a serving deployment with the engine's own client.")
@click.argument("job")
@click.option("--concurrency", "-c", callback=_ints, metavar="N,N,...",
              help="the sweep (default: the deployment's benchmark:, else 1,16)")
@click.option("--rate", callback=_floats, metavar="R,R,...", help="requests/s at each point")
@click.option("--prompts", type=click.IntRange(1), help="requests per point (default 4 x N)")
@click.option("--input-tokens", type=click.IntRange(1),
              help="prompt length (default: the deployment's benchmark:, else 2000)")
@click.option("--output-tokens", type=click.IntRange(1),
              help="tokens generated per request (default: benchmark:, else 100)")
@click.option("--warmup", type=click.IntRange(0),
              help="requests sent before each point, not counted (default 2)")
@click.option("--client", help="whose benchmark client (default: the engine's own)")
@click.option("--python", help="the python on the node that has the client")
@click.option("--tokenizer", help="tokenizer directory (default: the model path)")
@click.option("--in-allocation", is_flag=True,
              help="run as a step in the deployment's own allocation (no spare node needed; "
                   "the only way over SSH) instead of a one-node job of its own")
@click.option("--json", "as_json", is_flag=True, help="the gate's verdict as JSON")
def bench(job, concurrency, rate, prompts, input_tokens, output_tokens, warmup, client, python,
          tokenizer, in_allocation, as_json):
    """Benchmark a deployment that serves, with the engine's own client; the same gate as a
    deployment's benchmark: step. Exit 1 if a point fails it.

    Without --in-allocation the run is a one-node job of its own (submitit), submitted with the
    deployment's partition, account, QOS, constraint and reservation; that node runs this
    hpcserve's Python (the same path) and imports hpcserve and submitit there, so the node needs
    this installation (a shared file system). --in-allocation needs neither: its step
    runs only the job directory's launch script.

    \b
    Example:
      hpcserve bench 12345 -c 1,16,64
      hpcserve --remote me@login.example.org bench 12345 --in-allocation
    """
    import time
    from .operate import bench_ops, ops
    from .runtime.bench import one_line
    ssh = _ssh()
    remote = ssh.remote
    e = ops.resolve(job, remote, ssh.runner(ssh.remote))
    runner = ssh.runner(e.remote)
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
        result = bench_ops.as_job(prep, bench_ops.slurm_options_of(runner, e),
                                  limit // 60 + 1, e.name)
    if as_json:
        click.echo(json.dumps(result, indent=1))
    else:
        for p in result["points"]:
            click.echo(one_line(p))
        click.echo("benchmark passed" if result["passed"] else
                   f"benchmark FAILED at {result['failed']['point']}: "
                   f"{result['failed']['reason']}")
    sys.exit(0 if result["passed"] else 1)


@main.command(short_help="A benchmark's table, plots and HTML page, jobs side by side.")
@click.argument("jobs", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="the rows as JSON (no files written)")
@click.option("--out", "-o", help="where the plots and report.html go (default: the job "
                                  "directory's report/ for one local job, else ./hpcserve-report)")
def report(jobs, as_json, out):
    """A benchmark's table and plots (PNG and one self-contained HTML page); several jobs side
    by side. Exit 1 if a job's benchmark failed its gate. The plots need matplotlib:
    pip install 'hpcserve[report]'.

    \b
    Example:
      hpcserve report 12345 12399 --out kimi-report
    """
    from .operate import ops
    from .operate import report as rep
    if not as_json:
        rep.need_matplotlib()
    ssh = _ssh()
    entries = [ops.resolve(j, ssh.remote, ssh.runner(ssh.remote)) for j in jobs]
    loaded = [rep.load(e, ssh.runner(e.remote)) for e in entries]
    if as_json:
        click.echo(json.dumps(rep.as_json(loaded), indent=1))
    else:
        click.echo(rep.table_text(loaded))
        one_local = len(entries) == 1 and not entries[0].remote
        dest = Path(out) if out else (Path(entries[0].job_dir) / "report" if one_local
                                      else Path("hpcserve-report"))
        click.echo(f"report: {rep.write(loaded, dest)}")
    sys.exit(0 if all(j.bench["passed"] for j in loaded) else 1)


@main.command(short_help="Add or drain instances of a serving deployment's role.")
@click.argument("job")
@click.option("--role", required=True, help="the role to scale: prefill, decode or worker")
@click.option("--add", type=int, metavar="N", help="submit an instance job of N instances")
@click.option("--remove", type=int, metavar="N", help="drain N serving instances")
@click.option("--drain-timeout", type=click.FloatRange(0, min_open=True), default=300.0,
              show_default=True, metavar="S",
              help="--remove: how long each drained instance's requests may take to finish")
@click.option("--wait", "-w", is_flag=True,
              help="--remove: wait until each instance is removed (drain timeout + 30 s)")
def scale(job, role, add, remove, drain_timeout, wait):
    """Change a serving deployment's capacity. --add N submits an instance job of N instances of
    ROLE (the deployment as submitted, under <job dir>/scale/<role>-<seq>/): each joins the
    router once it answers its smoke request. --remove N drains N serving instances, the newest
    instance job's first: out of the router, in-flight requests finished, then stopped; an
    instance job left with none ends.

    \b
    Example:
      hpcserve scale 12345 --role decode --add 2
      hpcserve --remote me@login.example.org scale 12345 --role decode --remove 1 --wait
    """
    from .operate import scale as sc
    if (add is None) == (remove is None):
        raise HpcserveError("give one of --add N or --remove N")
    if (add if add is not None else remove) < 1:
        raise HpcserveError(f"--{'add' if add is not None else 'remove'} takes a number of "
                            "instances of 1 or more")
    ssh = _ssh()
    f = sc.front(job, ssh.remote, ssh.runner(ssh.remote), role)
    runner = ssh.runner(f.entry.remote)  # where the deployment was submitted
    if add is not None:
        res = sc.add(f, runner, f.entry.remote, role, add)
        click.echo(f"submitted job {res.job_id}: {res.name}, {add} {role} instance(s) joining "
                   f"{f.view.endpoint}")
        click.echo(f"job directory: {res.job_dir}")
        return
    drains = sc.pick(f, runner, role, remove)
    sc.request(runner, drains, drain_timeout)
    for d in drains:
        click.echo(f"draining {d.instance} of job {d.entry.job_id} ({d.entry.job_dir})")
    if wait:
        sys.exit(sc.wait_removed(runner, drains, drain_timeout, click.echo))


@main.command(short_help="Move a serving deployment to another engine release, an instance "
                          "at a time.")
@click.argument("job")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="engine.version=X and/or engine.image=IMAGE: the new release")
@click.option("--drain-timeout", type=click.FloatRange(0, min_open=True), default=300.0,
              show_default=True, metavar="S",
              help="how long each old instance's requests may take to finish")
@click.option("--start-timeout", type=click.FloatRange(0, min_open=True), default=1800.0,
              show_default=True, metavar="S",
              help="how long each new instance may take from sbatch to serving (queue wait "
                   "and cold start)")
def upgrade(job, sets, drain_timeout, start_timeout):
    """Move a serving deployment to another engine release without a failed request: for each
    instance (the front's own and every instance job's), one at a time, an instance job of one
    instance at the new release joins the router after its smoke request, then the old one is
    drained. A failure stops it with the deployment serving; run it again to go on. A
    prefill/decode deployment changes release only between releases whose prefill and decode
    work together; an autoscaled one not at all (its slots were rendered at its release).

    \b
    Example:
      hpcserve upgrade 12345 --set engine.version=0.5.23
      hpcserve --remote me@login.example.org upgrade 12345 --set engine.image=/images/sgl.sqsh
    """
    from .operate import scale as sc
    from .operate import upgrade as up
    up.check_sets(sets)
    ssh = _ssh()
    f = sc.front(job, ssh.remote, ssh.runner(ssh.remote), None)
    runner = ssh.runner(f.entry.remote)  # where the deployment was submitted
    new = up.target(f, runner, sets)
    todo = up.olds(f, runner, new)
    sys.exit(up.run(f, runner, f.entry.remote, new, todo, drain_timeout=drain_timeout,
                    start_timeout=start_timeout, echo=click.echo))


@main.command(short_help="Stop a deployment gracefully: router first, then engines.")
@click.argument("job")
@click.option("--wait", "-w", is_flag=True, help="wait until the teardown is complete")
def cancel(job, wait):
    """Stop a deployment through its own graceful path (router first, then engines), then
    each of its instance jobs (`hpcserve scale`) and autoscale slot jobs that still runs,
    successors of a renewing one included. An instance job named stops alone (its instances
    leave the router first).

    \b
    Example:
      hpcserve cancel 12345 --wait
    """
    from .operate import deployment_jobs, ops
    from .runtime.contract import TERMINAL_PHASES
    ssh = _ssh()
    e = ops.resolve(job, ssh.remote, ssh.runner(ssh.remote))
    runner = ssh.runner(e.remote)  # where the job was submitted
    # an instance job named: the jobs its pair runs now (a successor submitted from inside it)
    named = [j.entry for j in deployment_jobs.pair_now(e, runner)] if e.front else [e]
    if len(named) == 1:
        rc = ops.cancel(named[0], runner, wait=wait, echo=click.echo)
        # a front: then its instance jobs, slot jobs and successors
        rest = [] if e.front else [j.entry for j in deployment_jobs.jobs_of(e, runner).members]
    else:  # a renewing instance job named: whichever job of its pair runs now
        rc, rest = 0, named
    for v in ops.status(rest, lambda _r: runner) if rest else []:
        if v.summary_phase not in TERMINAL_PHASES and not v.ended:
            sub = next(x for x in rest if x.job_dir == v.job_dir)
            rc = max(rc, ops.cancel(sub, runner, wait=wait, echo=click.echo))
    sys.exit(rc)


def run() -> None:
    """The `hpcserve` command's entry point (pyproject.toml's [project.scripts])."""
    main()
