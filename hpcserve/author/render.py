"""The renderer: a Plan -> the files of a self-contained job directory.

`render_files` is pure (plan in, {relative path: (text, mode)} out) so it is tested against golden
directories byte for byte; `write_job` is the only part that touches the disk. Templates run with
StrictUndefined and receive every word already quoted for bash by the `q` filter.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
from dataclasses import replace
from pathlib import Path

from .. import __version__, engines, package_data
from .compile_caches import CACHE_REPORTS, user_root
from .containers import container_files, wrap_task
from ..engines.bench_clients import CLIENTS, BenchClient
from ..errors import HpcserveError
from .config import SOURCE_FILE, source_text
from .plan import Instance, Plan
from .plan_json import dumps as spec_dumps
from .plan_json import api_key, job_spec
from ..runtime.contract import API_KEY_FILE, SHAPE_VARS, step_prefix
from .templates import jinja
from .words import Var, Word, argv_lines, quote, show

# Every file of a job directory is its owner's alone: the scripts, plan.json and the deployment
# file say what the job runs (and hold its paths and settings), and nobody else need read them.
EXEC, PRIVATE = 0o700, 0o600

# The in-job runtime, copied whole into the job directory as a package of its own: a folder,
# not a zipapp, so that it is read (and patched, on a site that must) like the scripts beside it.
RUNTIME = package_data.path("runtime")
RUNTIME_DIR = "hpcserve_runtime"
SIM_CORE = package_data.path("sim", "hpcserve_simcore.py")  # every stand-in's
# the engines' facts, which the stand-ins move their counters and answer their health by
FACTS = package_data.path("engines", "facts.py")


def _directive(key: str, value: str | None) -> str:
    return f"--{key}" if value is None else f"--{key}={_sbatch_quote(value)}"


def _sbatch_quote(value: str) -> str:
    """Quote for sbatch's #SBATCH parser: it honours '...' and "..." like a shell, but takes a
    backslash as an escape even inside single quotes, so shlex.quote would lose backslashes."""
    if "\\" not in value:
        return shlex.quote(value)
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _folded(words, width: int) -> list[str]:
    """`words` in lines of at most `width` characters (textwrap.wrap's result for words that
    fit a line, without its import)."""
    lines = [""]
    for w in words:
        if lines[-1] and len(lines[-1]) + 1 + len(w) > width:
            lines.append("")
        lines[-1] += (" " if lines[-1] else "") + w
    return lines


def _title(plan: Plan, inst: Instance) -> str:
    par = engines.get(plan.engine).describe(inst.parallel)
    where = f"component {inst.component} nodes {inst.node_offset}" + (
        f"-{inst.node_offset + inst.nodes - 1}" if inst.nodes > 1 else "") + (
        f", GPUs {inst.gpu_ids}" if inst.gpu_ids else "")
    mode = {"prefill": "prefill", "decode": "decode", "worker": "plain"}[inst.role]
    return f"{_engine_title(plan)} {mode} instance {inst.index}, {par} ({where})"


def _stage_steps(files: dict, env, plan, jd: str) -> None:
    """model.stage: one task per node of each component copies the model to its stage cache."""
    files["launch/stage.sh"] = (env.get_template("stage.sh.j2").render(
        py=plan.site_python, job_dir=jd), EXEC)
    for c in plan.components:
        files[f"steps/stage-{c.index}.sh"] = (env.get_template("step.sh.j2").render(
            title=f"staging on every node of component {c.index} ({c.name}): one task per node "
                  f"copies {plan.stage['source']} to {plan.stage['path']}",
            needs_nodelist=plan.in_allocation,
            srun=[quote(w) for w in _srun(plan, c.index, c.nodes, "stage", nodelist=False,
                                          overlap=True)],
            command=[quote(w) for w in ["bash", f"{jd}/launch/stage.sh", str(c.index)]]),
            EXEC)


def _engine_title(plan: Plan) -> str:
    return f"{'simulated ' if plan.simulate else ''}{plan.engine_title} {plan.version}"


def topology(plan: Plan) -> list[str]:
    lines = []
    for c in plan.components:
        lines.append(f"component {c.index} ({c.name}), {c.nodes} node(s):")
        for i in plan.instances_of(c.index):
            ports = ", ".join(f"{label} {port}" for label, port in i.port_labels)
            lines.append(f"  {i.name}: {_title(plan, i)}; ports {ports}")
        if plan.router and plan.router.component == c.index:
            lines.append(f"  router: {plan.router.name} on node {plan.router.node_offset}, port "
                         f"{plan.router.port} (metrics {plan.router.prometheus_port})")
    return lines


# s srun lets the other tasks of an instance run after one of them ended (srun --wait)
INSTANCE_TASK_WAIT = 5


def _srun(plan: Plan, component: int, nodes: int | None, name: str, *, nodelist: bool,
          overlap: bool, inst: Instance | None = None) -> list[Word]:
    w: list[Word] = []
    tasks_per_node = inst.tasks_per_node if inst else 1
    if plan.in_allocation:
        # steps of the user's allocation: each names its nodes (its component's share of the
        # allocation's, hpcserve_runtime/allocation.py) where a het job names its het group
        w.append(("--jobid=", Var("SLURM_JOB_ID")))
        nodelist = True
    elif len(plan.components) > 1:
        w.append(f"--het-group={component}")
    if nodes is not None:
        w += [f"--nodes={nodes}", f"--ntasks={nodes * tasks_per_node}",
              f"--ntasks-per-node={tasks_per_node}"]
    if inst and inst.cpus_per_task:
        # Slurm 22.05-23.02 srun does not take it from the allocation: say it again.
        w.append(f"--cpus-per-task={inst.cpus_per_task}")
    if inst and inst.mpi:
        w.append(f"--mpi={inst.mpi}")
    if inst:
        w += list(inst.srun_args)
    if nodelist:
        w.append(("--nodelist=", Var("NODELIST")))
    if overlap:
        w.append("--overlap")
    if inst and (nodes or 1) * tasks_per_node > 1:
        # One task of an instance that ends, even with exit code 0 (vLLM's headless rank
        # shuts down cleanly once its worker died), leaves the others serving nothing:
        # srun ends the step this long after the first exit ("First task exited Ns ago",
        # then each task's state), where --kill-on-bad-exit acts on non-zero codes only.
        w.append(f"--wait={INSTANCE_TASK_WAIT}")
    # A restarted instance is a new attempt: hpcserve_runtime sets HPCSERVE_ATTEMPT_TAG
    # (".attempt2"; empty for the first start) so that Slurm names its step apart from the
    # attempt before it, which may still be ending on a lost node.
    # In an allocation the user holds, its steps carry the deployment's prefix (step_prefix).
    name = step_prefix(plan.name, plan.in_allocation) + name
    w.append(("--job-name=", name, Var("HPCSERVE_ATTEMPT_TAG", unset_ok=True)) if inst
             else f"--job-name={name}")
    w.append("--kill-on-bad-exit=1")
    return w


def render_files(plan: Plan, job_dir: str) -> dict[str, tuple[str, int]]:
    """Every file of the job directory as (text, mode), for a directory at `job_dir` on the cluster."""
    env = jinja()
    files: dict[str, tuple[str, int]] = {}
    check_job_dir(job_dir)
    jd = job_dir.rstrip("/") or "/"
    comps = []
    for c in plan.components:
        ds = [(k, f"{jd}/logs/batch-%j.out" if v == "@OUTPUT@" else v) for k, v in c.directives]
        comps.append({"index": c.index, "name": c.name, "nodes": c.nodes,
                      "plural": "" if c.nodes == 1 else "s",
                      "directives": [_directive(k, v) for k, v in ds]})
    files["job.sbatch"] = (env.get_template("job.sbatch.j2").render(
        components=[] if plan.in_allocation else comps, alloc_components=comps, plan=plan,
        version=__version__, topology=topology(plan), engine_title=_engine_title(plan),
        unset=" \\\n  ".join(_folded(SHAPE_VARS, 90)),
        job_dir=jd, site_python=plan.site_python, api_key=api_key(plan, jd)), EXEC)

    step = env.get_template("step.sh.j2")
    py = plan.site_python
    ib = plan.ib_devices
    ib_arg = "auto" if ib == "auto" else ",".join(ib) if ib else "none"
    pf = plan.preflight
    files["launch/discover.sh"] = (env.get_template("discover.sh.j2").render(
        py=py, job_dir=jd, iface=plan.interface, ib=ib_arg, preflight=pf["enabled"]), EXEC)
    for c in plan.components:
        what = "its preflight checks, then " if pf["enabled"] else ""
        files[f"steps/discover-{c.index}.sh"] = (step.render(
            title=f"address discovery on every node of component {c.index} ({c.name}): one task "
                  f"per node prints {what}its name, address, interface and IB devices",
            needs_nodelist=plan.in_allocation,
            srun=[quote(w) for w in _srun(plan, c.index, c.nodes, f"discover-{c.name}",
                                          nodelist=False, overlap=True)
                  + (["--mpi=pmix"] if pf["enabled"] and pf["mpi"] else [])],
            command=[quote(w) for w in ["bash", f"{jd}/launch/discover.sh", str(c.index)]]),
            EXEC)

    if plan.stage:
        _stage_steps(files, env, plan, jd)
    launch = env.get_template("launch_engine.sh.j2")
    if plan.scratch:
        files["launch/scratch-cleanup.sh"] = (env.get_template("scratch_cleanup.sh.j2").render(
            job_dir=jd), EXEC)
    for inst in plan.instances:
        srun_extra, prefix = wrap_task(plan, jd, inst.name)
        files[f"steps/{inst.name}.sh"] = (step.render(
            title=f"{inst.name}: {_title(plan, inst)}", needs_nodelist=True,
            srun=[quote(w) for w in _srun(plan, inst.component, inst.nodes, inst.name,
                                          nodelist=True, overlap=True, inst=inst)
                  + srun_extra],
            command=[quote(w) for w in prefix + ["bash", f"{jd}/launch/{inst.name}.sh"]]), EXEC)
        cmd = ([plan.engine_python, f"{jd}/hpcserve_sim.py"] if plan.simulate
               else list(plan.engine_command))
        envs = list(inst.env)
        if plan.simulate:
            envs += _sim_env(plan, inst)
        cmd, argv, secrets = secret_argv(cmd, inst.argv, f"{plan.engine} ({inst.name})")
        envs += secrets
        files[f"launch/{inst.name}.sh"] = (launch.render(
            inst=inst, title=_title(plan, inst), job_dir=jd, scratch=plan.scratch,
            in_container=plan.container.runtime != "none",
            caches=plan.caches, cache_storage=plan.cache_storage, cache_reports=CACHE_REPORTS,
            cache_root=plan.caches and user_root(plan.cache_dir, plan.user),
            env=[(k, quote(v)) for k, v in envs],
            rank_args=[" ".join(quote(w) for w in r) for r in inst.rank_argv],
            own_ports=_port_list(inst.port, *(p for _, p in inst.ports)),
            own_timeout=plan.readiness.engine_timeout + 60,
            command=argv_lines(cmd, argv)), EXEC)

    if plan.router:
        r = plan.router
        srun_extra, prefix = wrap_task(plan, jd, "router")
        files["steps/router.sh"] = (step.render(
            title=f"router: {r.name} on node {r.node_offset} of component {r.component}",
            needs_nodelist=True,
            srun=[quote(w) for w in _srun(plan, r.component, 1, "router", nodelist=True,
                                          overlap=True) + srun_extra],
            command=[quote(w) for w in prefix + ["bash", f"{jd}/launch/router.sh"]]), EXEC)
        n_p = sum(1 for i in plan.instances if i.role == "prefill")
        n_d = sum(1 for i in plan.instances if i.role == "decode")
        n_w = sum(1 for i in plan.instances if i.role == "worker")
        workers = (f"{n_p} prefill and {n_d} decode instance(s)" if r.pd
                   else f"{n_w} instance(s)")
        rcmd, rargv, secrets = secret_argv(list(r.command), r.argv, r.name)
        files["launch/router.sh"] = (env.get_template("launch_router.sh.j2").render(
            router=r.name, mode="PD" if r.pd else "plain", workers=workers, job_dir=jd,
            env=[(k, quote(v)) for k, v in [*r.env, *secrets]],
            files=[(name, [quote(w) for w in lines]) for name, lines in r.files],
            own_ports=_port_list(r.port, r.prometheus_port),
            own_timeout=plan.readiness.router_timeout + 60,
            command=argv_lines(rcmd, rargv)), EXEC)

    if plan.benchmark:
        files.update(_bench_files(plan, jd, step))
    for path, text in plan.files:
        files[path] = (text, PRIVATE)
    files.update(container_files(plan, jd))
    files["plan.json"] = (spec_dumps(job_spec(plan, jd)), PRIVATE)
    if plan.source:  # `hpcserve scale` rebuilds the deployment from it (config.SOURCE_FILE)
        files[SOURCE_FILE] = (source_text(plan.source), PRIVATE)
    files.update(runtime_files())
    if plan.simulate:
        sim = engines.get(plan.engine).sim_source()
        files["hpcserve_sim.py"] = (sim.read_text(encoding="utf-8"), EXEC)
        files[SIM_CORE.name] = (SIM_CORE.read_text(encoding="utf-8"), EXEC)
        files["hpcserve_facts.py"] = (FACTS.read_text(encoding="utf-8"), EXEC)
    files.update(_slot_files(plan, jd))
    return files


def _slot_files(plan: Plan, jd: str) -> dict[str, tuple[str, int]]:
    """Each autoscale slot's job directory (autoscale.py), and with renew: its twin's, under
    the front's: rendered now, as the job that submits it later runs no hpcserve."""
    from .autoscale import slot_dir
    from .plan import with_twin_dir
    files = {}
    for a in plan.autoscale.values():
        for name, slot in a.slots + a.twins:
            sd = slot_dir(jd, name)
            slot = with_twin_dir(slot, os.path.dirname(sd))
            sub = render_files(replace(slot, attach={**slot.attach, "front_job_dir": jd}), sd)
            files.update({os.path.relpath(sd, jd) + "/" + k: v for k, v in sub.items()})
    return files


def runtime_files() -> dict[str, tuple[str, int]]:
    """hpcserve_runtime/*.py: every module of hpcserve.runtime, as they are in the package."""
    return {f"{RUNTIME_DIR}/{f.name}": (f.read_text(encoding="utf-8"), PRIVATE)
            for f in sorted(RUNTIME.glob("*.py"))}


def _bench_files(plan: Plan, jd: str, step) -> dict[str, tuple[str, int]]:
    """steps/bench.sh and launch/bench.sh: the benchmark client, one run per point."""
    b = plan.benchmark
    srun_extra, prefix = wrap_task(plan, jd, "bench")
    target = f"{plan.router.name} (the router)" if plan.router else plan.instances[0].name
    return {
        "steps/bench.sh": (step.render(
            title=f"benchmark: {b.title} on node {b.node_offset} of component {b.component}",
            needs_nodelist=True,
            srun=[quote(w) for w in _srun(plan, b.component, 1, "bench", nodelist=True,
                                          overlap=True) + srun_extra],
            command=[quote(w) for w in prefix + ["bash", f"{jd}/launch/bench.sh"]]), EXEC),
        "launch/bench.sh": (bench_launch_script(
            CLIENTS[b.client], b.python, b.spec, list(b.points), job_dir=jd, target=target,
            env=list(b.env), started_by="Started by hpcserve_runtime once the deployment "
                                       "serves (SERVING_URL: run/endpoints.env)"), EXEC)}


def bench_launch_script(client: BenchClient, python: str, spec_: dict, points: list, *,
                        job_dir: str, target: str, env: list[tuple[str, Word]], started_by: str,
                        serving_url: str | None = None, key_file: str | None = None) -> str:
    """The bash script that runs every point of a benchmark in turn (launch_bench.sh.j2): a
    deployment's own launch/bench.sh, and each `hpcserve bench` run's (bench_ops.py), which
    reads the deployment's API key from `key_file` (a step from outside the job has not the
    job's environment)."""
    cmd: list[Word] = list(client.command(python))
    return jinja().get_template("launch_bench.sh.j2").render(
        title=client.title, target=target, job_dir=job_dir, bench_dir=spec_["dir"],
        started_by=started_by, serving_url=serving_url, input_tokens=spec_["input_tokens"],
        output_tokens=spec_["output_tokens"], env=[(k, quote(v)) for k, v in env],
        timeout=spec_["point_timeout_s"], key_file=key_file,
        points=[(p.label, argv_lines(cmd, argv)) for p, argv in points])


def _port_list(serving: int, *others: int | None) -> str:
    """own-port's --ports: the serving port first, then the others the process binds."""
    return ",".join(str(p) for p in dict.fromkeys([serving, *others]) if p)


def check_job_dir(job_dir: str) -> None:
    """The job directory ends up in #SBATCH --output and every script: no control characters
    (a newline would end the directive and run the rest as shell), no % or \\ (sbatch's
    filename patterns)."""
    bad = re.search(r"[\x00-\x1f\x7f%\\]", job_dir)
    if bad:
        raise HpcserveError(f"job directory {job_dir!r}: {bad.group()!r} is not allowed in it "
                            "(control characters would break the batch script; sbatch reads % "
                            "and \\ as filename patterns in --output)")


def _sim_env(plan: Plan, inst: Instance) -> list[tuple[str, Word]]:
    s = plan.sim
    out: list[tuple[str, Word]] = [
        ("HPCSERVE_SIM_STARTUP_DELAY", repr(float(s["startup_delay"]))),
        ("HPCSERVE_SIM_PREFILL_S_PER_TOKEN", repr(float(s["prefill_s_per_token"]))),
        ("HPCSERVE_SIM_DECODE_S_PER_TOKEN", repr(float(s["decode_s_per_token"]))),
        ("HPCSERVE_SIM_INIT_TIMEOUT", str(min(60, plan.readiness.engine_timeout))),
        ("HPCSERVE_SIM_VERSION", plan.version)]  # what it reports: a rolling upgrade's proof
    f = inst.fault
    if f is not None:
        after = "SIGUSR1" if f.on_signal else f"{f.after:g}"
        spec = {"exit": f"exit:{f.exit_code}:{after}", "hang": f"hang:{after}",
                "slow": f"slow:{f.delay:g}:{after}",
                "unhealthy": "unhealthy", "empty": f"empty:{f.after_requests}",
                "kv_lost": f"kv-lost:{f.after_requests}"}[f.kind]
        out.append(("HPCSERVE_SIM_FAULT", spec))
        if f.ranks is not None:
            out.append(("HPCSERVE_SIM_FAULT_RANKS", ",".join(map(str, f.ranks))))
        if f.attempts is not None:  # the sim reads the attempt from HPCSERVE_ATTEMPT
            out.append(("HPCSERVE_SIM_FAULT_ATTEMPTS", ",".join(map(str, f.attempts))))
    return out


def secret_argv(cmd: list[Word], argv: tuple[Word, ...],
                what: str) -> tuple[list[Word], tuple[Word, ...], list[tuple[str, Word]]]:
    """(command, argv, environment) with every secret argument (a flag whose value is a
    {from_env} variable) off the command line, which every user of the node sees in `ps`: the
    Python program runs under hpcserve_runtime/secret_argv.py, which reads the values from the
    variables named in HPCSERVE_SECRET_ARGS and hands them to it in sys.argv. A program that
    is no Python's (`trtllm-serve`) cannot take them so: refused."""
    kept, named = secret_words(argv, what)
    if not named:
        return cmd, argv, []
    python_program = len(cmd) >= 2 and (cmd[1] == "-m" or show(cmd[1]).endswith(".py"))
    if not python_program:
        raise HpcserveError(
            f"{what}: {show(cmd[0])} takes its arguments only on its command line, where "
            f"{named[0]} {{from_env: {named[1]}}} would be visible to every user of the node "
            "(ps); set it another way")
    wrapped = [cmd[0], (Var("JOB_DIR"), f"/{RUNTIME_DIR}/secret_argv.py"), *cmd[1:]]
    return wrapped, kept, [("HPCSERVE_SECRET_ARGS", " ".join(named))]


def secret_words(argv: tuple[Word, ...], what: str) -> tuple[tuple[Word, ...], list[str]]:
    """`argv` without its secret arguments (a flag whose value is a {from_env} variable), and
    those as [flag, variable, ...]."""
    kept: list[Word] = []
    named: list[str] = []
    for w in argv:
        if isinstance(w, tuple) and any(isinstance(p, Var) and p.secret for p in w):
            if len(w) != 1 or not kept or not isinstance(kept[-1], str):
                raise HpcserveError(f"{what}: a secret is only ever a flag's whole value")
            named += [kept.pop(), w[0].name]
        else:
            kept.append(w)
    return tuple(kept), named


def write_job(files: dict[str, tuple[str, int]], out_dir: str | Path) -> Path:
    """Write the files into a directory made here, new (never one that was there: whoever made
    it could change the scripts before the job runs them), readable by this user alone."""
    out = Path(out_dir)
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.mkdir(out, 0o700)
    except FileExistsError:
        raise HpcserveError(f"{out} exists ({_owned(out)}): a job directory is made new, never "
                            "one that was there; choose another --out") from None
    os.chmod(out, 0o700)  # whatever the umask left of it
    # logs/ (sbatch's --output) and run/ of the job, and of each job directory under it (an
    # autoscale slot's); inside a directory only this user can write, so makedirs is safe
    tops = {os.path.dirname(rel) for rel in files if os.path.basename(rel) == "job.sbatch"}
    for d in sorted({os.path.dirname(rel) for rel in files} |
                    {os.path.join(t, d) for t in tops | {""} for d in ("logs", "run")}):
        os.makedirs(out / d, mode=0o700, exist_ok=True)
    for rel, (text, mode) in sorted(files.items()):
        fd = os.open(out / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), mode)
    _new_api_key(out, files)
    return out


def _new_api_key(out: Path, files: dict[str, tuple[str, int]]) -> None:
    """The deployment's API key where its plan.json names a file for it (a front's; an instance
    job reads its front's): 32 random bytes from the system's CSPRNG (secrets), made here as the
    directory is, new and its owner's alone, and never printed. In hex: a urlsafe key may start
    with "-", which the engines' argument parsers take for an option (run 21)."""
    spec = json.loads(files["plan.json"][0]) if "plan.json" in files else {}
    if spec.get("attach") or not (spec.get("api_key") or {}).get("file"):
        return
    os.mkdir(out / os.path.dirname(API_KEY_FILE), 0o700)
    fd = os.open(out / API_KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(secrets.token_hex(32) + "\n")


def _owned(path: Path) -> str:
    import pwd
    try:
        uid = path.lstat().st_uid
    except OSError as e:
        return e.strerror or str(e)
    try:
        return f"owner {pwd.getpwuid(uid).pw_name}"
    except KeyError:
        return f"owner uid {uid}"
