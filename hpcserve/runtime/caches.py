"""Whether each compile cache was warm when an instance's engine started (plan.json "caches").

Every node of an instance writes run/caches/<instance><attempt tag>.<node> from its launch script
before the engine starts: one line `NAME warm|cold DIR` per cache (the rule: the directory the
cache's variable names, or its probe part, held a file). Once the instance is healthy the runtime
reads them into state.json and says them in the job log: the deployment's first start under
"caches", a restarted instance's in its attempt's record.
"""

from __future__ import annotations

import os

REPORTS = os.path.join("run", "caches")  # compile_caches.CACHE_REPORTS, the renderer's side


def read(job_dir: str, name: str, tag: str = "") -> dict[str, dict[str, str]]:
    """{node: {cache: "warm" | "cold"}} of one instance attempt, from the nodes that wrote."""
    d = os.path.join(job_dir, REPORTS)
    prefix = f"{name}{tag}."
    out: dict[str, dict[str, str]] = {}
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    for f in names:
        node = f[len(prefix):] if f.startswith(prefix) else ""
        # "worker-0." also begins "worker-0.attempt1.<node>": only this attempt's own files
        if not node or node.startswith("attempt") and not tag:
            continue
        try:
            with open(os.path.join(d, f)) as fh:
                rows = [ln.split(None, 2) for ln in fh if ln.strip()]
        except OSError:
            continue
        out[node] = {r[0]: r[1] for r in rows if len(r) >= 2 and r[1] in ("warm", "cold")}
    return out


def words(found: dict[str, dict[str, str]]) -> str:
    """"node1: vllm warm, triton cold; node2: ..." for the job log."""
    return "; ".join(f"{node}: " + ", ".join(f"{c} {s}" for c, s in caches.items())
                     for node, caches in found.items()) or "no node reported"


def record_start(job) -> None:
    """The first start of every instance: state.json "caches" and one log line each."""
    spec = job.plan.caches
    if spec is None:
        return
    found = {}
    for inst in job.plan.instances:
        found[inst.name] = read(job.dir, inst.name)
        job.log(f"{inst.name} compile caches ({spec.storage} {spec.dir}): "
                f"{words(found[inst.name])}")
    job.state.update(caches={"dir": spec.dir, "storage": spec.storage,
                             "instances": found})


def for_attempt(job, name: str, attempt: int) -> dict[str, dict[str, str]] | None:
    """A restarted instance's caches as it started (None: the plan keeps no caches)."""
    if job.plan.caches is None:
        return None
    found = read(job.dir, name, f".attempt{attempt}" if attempt else "")
    job.log(f"{name} attempt {attempt} compile caches: {words(found)}")
    return found
