"""`hpcserve bench JOB`: the serving benchmark against a deployment that already serves.

The run's points and launch script are those of a deployment's own `benchmark:` step (the sweep:
bench_sweep.py; the script: render.bench_launch_script), written into JOB_DIR/bench-runs/STAMP.
The script runs the client once per point (bench_clients: the engine's own client, or the one
named), each point's results and exit in the run's directory, which the gate (runtime/bench.py)
reads. `--in-allocation` starts it as a step of the running allocation; otherwise a small job of
its own runs it beside the deployment (submitit).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import engines
from ..author.bench_sweep import spec, sweep
from ..engines.bench_clients import CLIENTS, BenchClient
from ..errors import HpcserveError
from ..author.render import bench_launch_script
from ..runtime.contract import SHAPE_VARS, step_prefix
from ..slurm.runner import read_json
from ..author.words import Var


RUNS_DIR = "bench-runs"   # in the job directory: one folder per `hpcserve bench` run


@dataclass(frozen=True)
class Sweep:
    """What `hpcserve bench` was asked for; None: the deployment's benchmark:, else defaults."""

    concurrency: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()
    prompts: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    warmup: int | None = None
    client: str | None = None
    python: str | None = None
    tokenizer: str | None = None


@dataclass(frozen=True)
class Prepared:
    """A run's files, written into the job directory: the script and what the gate reads."""

    job_dir: str
    bench_dir: str        # absolute
    script: str           # absolute
    spec: dict
    node: str             # where --in-allocation runs it: the first instance's leader node
    het_group: int | None  # that node's het-job component (None: not a het job)
    step_name: str        # its step's name in Slurm (with the deployment's prefix in an allocation)


def prepare(entry, runner, ask: Sweep, stamp: str) -> Prepared:
    """The run's launch script and spec in JOB_DIR/bench-runs/STAMP, for a job that serves."""
    jd = entry.job_dir
    plan = read_json(runner, f"{jd}/plan.json")
    state = read_json(runner, f"{jd}/state.json") or {}
    if not plan:
        raise HpcserveError(f"{jd}/plan.json cannot be read: not an hpcserve job directory")
    if state.get("phase") != "serving":
        raise HpcserveError(f"job {entry.job_id} is not serving (phase: "
                            f"{state.get('phase', 'pending')}): nothing to benchmark")
    url = state.get("endpoint") or _instance_url(state)
    own = plan.get("benchmark") or {}   # the deployment's own benchmark:, the defaults here
    client = _client(ask.client or own.get("client") or
                     engines.get(plan["engine"]["name"]).bench_client)
    rel = f"{RUNS_DIR}/{stamp}"
    points, s = _run_spec(client, ask, own, plan, rel)
    key = plan.get("api_key") or {}
    env: list = [("PYTHONUNBUFFERED", "1")]
    if key and not key["file"]:  # a variable of the user's own: from this environment
        env.append(("OPENAI_API_KEY", (Var(key["env"]),)))
    text = bench_launch_script(client, ask.python or own.get("python") or "python3", s, points,
                               job_dir=jd, target=url, env=env, key_file=key.get("file"),
                               started_by="Started by `hpcserve bench` against a deployment "
                                          "that serves", serving_url=url)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "launch.sh").write_text(text, encoding="utf-8")
        Path(tmp, "spec.json").write_text(json.dumps(s, indent=1), encoding="utf-8")
        runner.put_tree(tmp, f"{jd}/{rel}")
    first = plan["instances"][0]
    rows = (runner.read_text(f"{jd}/run/{first['name']}.nodes") or "").split()
    return Prepared(jd, f"{jd}/{rel}", f"{jd}/{rel}/launch.sh", s,
                    rows[1] if len(rows) > 1 else "", het_group(plan, first),
                    step_prefix(plan["name"], bool(plan.get("in_allocation"))) + "bench")


def het_group(plan: dict, instance: dict) -> int | None:
    """The het-job component of `instance` where srun needs one: a deployment of several
    components in a het job of its own. One started with --in-allocation runs in the user's
    allocation, which is no het job (srun refuses --het-group there); --nodelist names the node."""
    if plan.get("in_allocation") or len(plan["components"]) < 2:
        return None
    return instance["component"]


def _client(name: str) -> BenchClient:
    if name not in CLIENTS:
        raise HpcserveError(f"--client {name!r}: one of {', '.join(sorted(CLIENTS))}")
    return CLIENTS[name]


def _run_spec(client: BenchClient, ask: Sweep, own: dict, plan: dict, rel: str) -> tuple:
    """The points and the spec of one run: what was asked, else the deployment's benchmark:,
    else the seed guides' workload."""
    inp = ask.input_tokens or own.get("input_tokens") or 2000
    out = ask.output_tokens or own.get("output_tokens") or 100
    warmup = ask.warmup if ask.warmup is not None else own.get("warmup", 2)
    conc = list(ask.concurrency) or [p["concurrency"] for p in own.get("points", [])] or [1, 16]
    points = _dedup(sweep(client, served_name=plan["served_name"],
                          tokenizer=ask.tokenizer or own.get("tokenizer") or plan["model_path"],
                          input_tokens=inp, output_tokens=out, warmup=warmup, concurrency=conc,
                          rates=list(ask.rates), prompts_per_point=ask.prompts))
    gate = own.get("gate", {})
    return points, spec(client, points, bench_dir=rel, input_tokens=inp, output_tokens=out,
                        warmup=warmup, point_timeout_s=own.get("point_timeout_s", 1800),
                        min_success=gate.get("min_success", 1.0),
                        output_tolerance=gate.get("output_tolerance", 0.25),
                        metrics_interval_s=0, then="serve")


def _dedup(points: list) -> list:
    seen, out = set(), []
    for p, argv in points:
        if p.label not in seen:
            seen.add(p.label)
            out.append((p, argv))
    return out


def _instance_url(state: dict) -> str:
    urls = list((state.get("health_urls") or {}).values())
    if len(urls) != 1:
        raise HpcserveError("the job serves no single endpoint to benchmark")
    return urls[0].split("/", 3)[0] + "//" + urls[0].split("/", 3)[2]


def in_allocation(prep: Prepared, entry, runner, timeout: float) -> dict:
    """The run as a step of the deployment's own allocation (no spare node needed), on the
    node of its first instance's leader; the gate's verdict on its results."""
    res = runner.run(step_argv(prep, entry.job_id), check=False, timeout=timeout)
    result = verdict(prep, runner)
    f = result["failed"]
    if f and res.rc != 0 and "did not run" in f["reason"]:
        why = " | ".join((res.err or res.out).strip().splitlines()[-2:])
        f["reason"] += f": srun exited with code {res.rc}: {why}"
    return result


def step_argv(prep: Prepared, job_id: str) -> list[str]:
    """srun of the run's step, on its node, in the shape it spells itself: not the one of a
    shell inside an salloc (env -u: srun reads its options from those variables)."""
    het = [] if prep.het_group is None else [f"--het-group={prep.het_group}"]
    unset = [a for v in SHAPE_VARS for a in ("-u", v)]
    return ["env", *unset, "srun", f"--jobid={job_id.split('+')[0]}", *het, "--overlap",
            "--nodes=1", "--ntasks=1", f"--nodelist={prep.node}", f"--job-name={prep.step_name}",
            "bash", prep.script]


def verdict(prep: Prepared, runner) -> dict:
    """The gate on the run's files, read through the runner (the job directory may be remote)."""
    from ..runtime import bench
    from ..runtime.spec import Benchmark
    with tempfile.TemporaryDirectory() as tmp:
        for p in prep.spec["points"]:
            for name in (p["file"], f"{p['label']}.run.json"):
                text = runner.read_text(f"{prep.bench_dir}/{name}")
                if text is not None:
                    Path(tmp, name).write_text(text, encoding="utf-8")
        return bench.evaluate(tmp, Benchmark(prep.spec))


def run_script(script: str, bench_dir: str, spec_: dict) -> dict:
    """What the small job runs on its node (submitit calls it there): the launch script, then
    the gate on its results; submitit brings the returned verdict back to the command."""
    import subprocess
    from ..runtime import bench
    from ..runtime.spec import Benchmark
    subprocess.run(["bash", script], check=False)
    return bench.evaluate(bench_dir, Benchmark(spec_))


# The site's Slurm options (site.slurm, in every component's #SBATCH lines) that the benchmark's
# own job takes too, as submitit's SlurmExecutor parameters; a reservation has none of its own.
# The GPU, memory and exclusivity requests are the engines', not the one-node client's.
SITE_OPTIONS = {"partition": "partition", "account": "account", "qos": "qos",
                "constraint": "constraint", "reservation": None}


def as_job(prep: Prepared, site: dict[str, str], minutes: int, name: str) -> dict:
    """The run as a one-node Slurm job of its own beside the deployment, with the deployment's
    partition, account, QOS, constraint and reservation (`site`: slurm_options_of): submitit
    writes the batch script, submits it, waits for it and unpickles the function's result here.
    Its job runs this Python (sys.executable), which imports submitit and hpcserve there."""
    import logging

    import submitit
    # It logs to stdout, and warns on every poll where sacct has no accounting to ask (a site
    # without slurmdbd): the result file it waits for arrives all the same.
    logging.getLogger("submitit").setLevel(logging.ERROR)
    ex = submitit.SlurmExecutor(folder=f"{prep.bench_dir}/submitit")
    ex.update_parameters(**job_parameters(site, minutes, name))
    job = ex.submit(run_script, prep.script, prep.bench_dir, prep.spec)
    return job.result()


def job_parameters(site: dict[str, str], minutes: int, name: str) -> dict:
    """submitit's parameters for the benchmark's job: one task on one node, the site's options."""
    params: dict = {"nodes": 1, "ntasks_per_node": 1, "time": minutes, "job_name": f"{name}-bench"}
    extra = {}
    for key, value in site.items():
        if SITE_OPTIONS[key]:
            params[SITE_OPTIONS[key]] = value
        else:
            extra[key] = value
    if extra:
        params["additional_parameters"] = extra
    return params


def slurm_options_of(runner, entry) -> dict[str, str]:
    """The site options the deployment was submitted with (its first component's #SBATCH
    lines in plan.json): the benchmark's job goes where the deployment may go."""
    plan = read_json(runner, f"{entry.job_dir}/plan.json") or {}
    comps = plan.get("components") or [{}]
    return {k: v for k, v in comps[0].get("directives", []) if k in SITE_OPTIONS and v}
