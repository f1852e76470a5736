"""The one contract between the renderer, the in-job runtime and the operator commands.

Declared here once, imported by all three sides: the renderer writes plan.json with SPEC and
SPEC_VERSION, the runtime refuses any other version and writes state.json with these PHASES and
keys, and `hpcserve status/list/cancel` read state.json by the same names. This module ships in the
job directory with the rest of the runtime, so it is stdlib-only and imports nothing of hpcserve.

Spec versions: 1 was hpcserve 0.1.0's undeclared dump of the plan; 2 declared it; 3 adds
container.import (pyxis: the image imported once per job before any step); 4 adds preflight (the
checks every node runs in the discovery step); 5 adds benchmark (the serving benchmark's points,
where its results are and what its gate asks); 6 adds recovery (each instance's restart policy,
the role's spare nodes, the engine's metrics and instance smoke request, the router's worker API)
and state.json's per-instance record; 7 adds in_allocation (the job runs as steps of an
allocation the user already holds: `hpcserve submit --in-allocation`), file_sd_dir (the site's
Prometheus file-SD directory), router.metrics_path (where the router serves Prometheus text,
or null) and preflight.fabric (the NVLink domain size whose fabric the preflight checks, or null);
8 adds each instance's startup_lines (the patterns of its engine's weights-loaded and ready log
lines, null where the pinned release's line is not known), stage (model.stage: the model
directory copied to every node before the engines start, or null), caches (the compile caches
kept between jobs under site.paths.cache_dir), and state.json's startup (the start-up in phases,
runtime/startup.py), stage record (each node's outcome and the bytes read from the shared path)
and caches (whether each was warm as each instance started); 9 adds attach (an instance job
that registers its instances with a running deployment's router instead of starting its own, or
null), run/control/drain-<instance>.json (a request to drain one instance: out of the router,
in-flight requests finished, its step stopped), each instance's metrics.queued (the gauges of
requests waiting in the engine, which a drain waits for too), the instance statuses draining and
removed, and state.json's attach (plan.json's, copied). Spec 10 adds autoscale (per
autoscaled role: min, max, signal {kind, metrics}, target, cool_down_s, interval_s,
drain_timeout_s and its slots, the job directories of instance jobs rendered at submit that the
front submits on load, or null), attach.router_url and attach.front_job_id null in a slot (read
from the front's state.json as the slot starts), and state.json's autoscale (per role: the value
read, the capacity, each slot's job id, the directory it runs in and status: with renew:, the
job the slot's pair runs now, in either directory), renew (a renewing instance
job: {"twin_dir": the absolute directory of its twin, "margin_s": how long before the time limit
it submits that twin}, or null) and state.json's renew (runtime/renew.py: the successor
submitted, when and why, and the job it renewed into), and state.json's router_url (the
front's router from router_ready on, which a slot joins before the front serves: a front with
`instances: 0` of a role serves only once that role's slots do). Spec 11 adds each instance's
liveness (the path probed while serving, whether its 200 proves generation, and hung_after: the
seconds without a sign of progress before failed probes name it hung) and metrics.gauges_path
(where the pending, queued and kv-usage gauges are read, one sample per scheduler, when not at
metrics.path; null: there). Spec 12 adds api_key ({"env": the variable job.sbatch exports the
deployment's key in, "file": the key file it reads, absolute, or null where the user's own
variable holds it}). Spec 13 adds container.import.owner (the user who alone writes the site's
image cache the image is in, which the helper is told with --owner; null: the user's own cache),
and later state.json's write_failures (runtime/state.py), which needs no new version: plan.json,
what the version guards, did not change, and the operator commands read the key where it is.
"""

from __future__ import annotations

import json
import os
import stat

SPEC = "hpcserve-job"
SPEC_VERSION = 13

# The job's phases, in the order a deployment goes through them.
# degraded: serving with an instance out (being replaced); recovering: a role has fewer serving
# instances than its minimum while one is replaced.
PHASES = ("pending", "starting", "engines_ready", "router_ready", "serving", "degraded",
          "recovering", "stopping", "requeued", "done", "cancelled", "failed")
# How recovery changes the running router's workers (plan.json's router.workers_api; workers.py
# speaks each): over its worker API (a queued job, or a direct call), removing only, or by a
# restart with the new set.
WORKERS_APIS = ("queued", "direct", "remove-only", "restart")
# autoscale.signal: what the orchestrator reads per serving instance from its engine's own
# Prometheus gauges (the names per engine: engines/*.py Metrics): requests waiting, requests
# running, the KV cache's share in use (the fullest scheduler's). Declared once: the
# configuration offers these, plan.json's schema admits them, the runtime reads them.
AUTOSCALE_SIGNALS = ("queued", "running", "kv_usage")
KV_USAGE = "kv_usage"   # a share, not a count: the largest over schedulers, not their sum
# Why a router's worker API cannot take a new worker while it runs (runtime/workers.py says
# which router release answers how): `hpcserve scale --add` and autoscale refuse those.
CANNOT_ADD = {"remove-only": "it takes workers out while it runs, but adds one only by a "
                             "restart",
              "restart": "it learns its workers only when it starts"}
# <front job dir>/scale/: each instance job of the deployment (`hpcserve scale`: <role>-<seq>,
# autoscale's slots: <role>-s<k>)
SCALE_DIR = "scale"
# An instance's own status while the deployment serves; draining: a drain request took it out
# of the router and its in-flight requests finish; removed: drained and stopped, for good.
INSTANCE_STATUSES = ("serving", "out", "restarting", "failed", "draining", "removed")
# The signal a renewing instance job asks Slurm for margin_s before its limit (sbatch
# --signal=B:23@margin_s): submit the successor now if not yet (runtime/renew.py). Slurm may
# send it up to 60 s early (sbatch(1)), so with a short limit as the batch script starts, before
# any handler: SIGURG's default action is to ignore it (signal(7)), where USR1/USR2's would end
# the job. Slurm 22.05 knows no name for it (sig_name2num), so sbatch gets its number, 23 on
# Linux's x86-64 and aarch64 (signal(7)).
RENEW_SIGNAL = "URG"
RENEW_SIGNAL_NUMBER = 23
# Every deployment's API key, made at submit (plan.json api_key): job.sbatch reads it from this
# file of the front's job directory (its owner's alone) into this variable, which the engines'
# and the router's --api-key name ({from_env}) and the runtime's own requests send.
API_KEY_VAR = "HPCSERVE_API_KEY"
API_KEY_FILE = "secret/api-key"
# A phase the job never leaves: state.json's last word on the deployment.
TERMINAL_PHASES = frozenset({"done", "cancelled", "failed"})
# Phases in which the deployment's endpoint answers.
SERVING_PHASES = frozenset({"serving", "degraded", "recovering"})

_NUM = {"type": "number"}
_STR_OR_NULL = {"type": ["string", "null"]}
_NUM_OR_NULL = {"type": ["number", "null"]}
_INT_OR_NULL = {"type": ["integer", "null"]}

FAILURE_SCHEMA = {
    "type": ["object", "null"],
    "properties": {
        "step": _STR_OR_NULL, "role": _STR_OR_NULL, "instance": _INT_OR_NULL,
        "node": _STR_OR_NULL, "node_rank": _INT_OR_NULL, "rank": _INT_OR_NULL,
        "reason": _STR_OR_NULL, "exit_code": _INT_OR_NULL, "log": _STR_OR_NULL,
        "log_tail": {"type": "array", "items": {"type": "string"}},
        "error": _STR_OR_NULL, "detail": _STR_OR_NULL, "probe": {"type": "string"},
        "tasks": {"type": "array", "items": {"type": "object"}},
        "slurm_state": {"type": "string"}, "port": {"type": "integer"},
        "holder": {"type": "string"}, "check": {"type": "string"},
        "instances": {"type": "array", "items": {"type": "string"}},
        "failed": {"type": "array"}, "point": {"type": ["string", "null"]},
        "file": _STR_OR_NULL,
    },
    "additionalProperties": False,
}

# One start of an instance: where, when it served, how it ended, its logs.
# node -> cache name -> warm (its directory held a file as the engine started) or cold
CACHES_BY_NODE = {"type": "object", "additionalProperties": {
    "type": "object", "additionalProperties": {"enum": ["warm", "cold"]}}}

ATTEMPT_SCHEMA = {
    "type": "object",
    "required": ["attempt", "nodes", "started_at"],
    "properties": {
        "attempt": {"type": "integer"}, "nodes": {"type": "array", "items": {"type": "string"}},
        "started_at": _NUM, "serving_at": _NUM_OR_NULL, "ended_at": _NUM_OR_NULL,
        "end": _STR_OR_NULL, "failure": FAILURE_SCHEMA,
        "log": {"type": "string"}, "srun_log": {"type": "string"},
        "caches": CACHES_BY_NODE,
    },
    "additionalProperties": False,
}

# Each instance while the deployment serves (state.json "instances"): its status, why it is out,
# its restarts, and every attempt.
INSTANCE_SCHEMA = {
    "type": "object",
    "required": ["role", "index", "status", "attempt", "restarts", "nodes", "since", "attempts"],
    "properties": {
        "role": {"type": "string"}, "index": {"type": "integer"},
        "status": {"enum": list(INSTANCE_STATUSES)}, "why": _STR_OR_NULL,
        "attempt": {"type": "integer"}, "restarts": {"type": "integer"},
        "nodes": {"type": "array", "items": {"type": "string"}},
        "since": _NUM, "recover_s": _NUM_OR_NULL, "next_try_at": _NUM_OR_NULL,
        "attempts": {"type": "array", "items": ATTEMPT_SCHEMA},
    },
    "additionalProperties": False,
}

# The start-up in phases (runtime/startup.py): seconds per phase, null where unknown (a line the
# engine's release does not print, or that never came); unknown_s is their time, so that the
# known phases and unknown_s sum to total_s.
_PHASE_SECONDS = {"type": "object", "additionalProperties": _NUM_OR_NULL}
STARTUP_SCHEMA = {
    "type": ["object", "null"],
    "required": ["total_s", "phases", "unknown_s", "instances", "slowest"],
    "properties": {
        "total_s": _NUM, "phases": _PHASE_SECONDS, "unknown_s": _NUM,
        "overlapped": {"type": "object", "additionalProperties": _NUM},
        "queue_wait_s": _NUM_OR_NULL,
        "instances": {"type": "object", "additionalProperties": {
            "type": "object", "additionalProperties": False,
            "required": ["phases", "unknown_s", "total_s", "log"],
            "properties": {
                "phases": _PHASE_SECONDS, "unknown_s": _NUM, "total_s": _NUM,
                "log": {"type": "string"},
                "lines_seen": {"type": "array", "items": {"type": "string"}},
                "lines_known": {"type": "array", "items": {"type": "string"}}}}},
        "slowest": {"type": ["object", "null"], "additionalProperties": False, "properties": {
            "instance": {"type": "string"}, "total_s": _NUM, "phase": {"type": "string"},
            "phase_s": _NUM}},
    },
    "additionalProperties": False,
}

# state.json, as the runtime writes it (tests validate every job's state.json against it).
# state.json's stage record: per node what its staging did ("copied", "warm": the node's copy
# was complete already, "waited": another job staged it meanwhile), and the bytes read from the
# shared path by the whole job.
STAGE_SCHEMA = {
    "type": "object", "required": ["nodes", "shared_bytes_read", "model_bytes", "took_s"],
    "properties": {
        "nodes": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["outcome"],
            "properties": {"outcome": {"enum": ["copied", "warm", "waited", "failed"]},
                           "read_shared": {"type": "integer"}, "took_s": _NUM,
                           "detail": {"type": "string"}}}},
        "reader": _STR_OR_NULL,
        "shared_bytes_read": {"type": "integer"}, "model_bytes": {"type": "integer"},
        "took_s": _NUM, "path": {"type": "string"},
    },
}

# plan.json's attach, copied into state.json: the running router an instance job joins (its
# front job's endpoint and worker API), null for a front job.
ATTACH_SCHEMA = {
    "type": ["object", "null"],
    "required": ["router_url", "workers_api", "api_key_env", "front_job_id", "front_job_dir",
                 "deployment"],
    "properties": {
        "router_url": _STR_OR_NULL, "workers_api": {"enum": list(WORKERS_APIS)},
        "api_key_env": _STR_OR_NULL, "front_job_id": _STR_OR_NULL,
        "front_job_dir": {"type": "string"}, "deployment": {"type": "string"},
    },
    "additionalProperties": False,
}

# The front's autoscaling (runtime/autoscale.py), per role: the signal per instance last read,
# the capacity counted, each slot's job and status (a renewing slot's: the job its pair runs
# now, and that job's directory), the newest decisions.
AUTOSCALE_SCHEMA = {"type": "object", "additionalProperties": {
    "type": "object", "required": ["value", "capacity", "slots", "decisions"],
    "additionalProperties": False,
    "properties": {
        "value": _NUM_OR_NULL, "capacity": {"type": "integer"},
        "slots": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["dir", "job_id", "status"],
            "additionalProperties": False,
            "properties": {"dir": {"type": "string"}, "job_id": _STR_OR_NULL,
                           "status": {"enum": ["free", "submitting", "pending", "starting",
                                               "serving", "draining"]}}}},
        "decisions": {"type": "array", "items": {
            "type": "object", "additionalProperties": False,
            "required": ["at", "action", "slot", "job_id", "why", "value", "capacity"],
            "properties": {"at": _NUM, "action": {"enum": ["add", "remove"]},
                           "slot": {"type": "string"}, "job_id": _STR_OR_NULL,
                           "why": {"type": "string"}, "value": _NUM_OR_NULL,
                           "capacity": {"type": "integer"}}}}}}}

STATE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": f"hpcserve job state (state.json, spec {SPEC_VERSION})",
    "type": "object",
    "required": ["phase", "history", "updated_at"],
    "properties": {
        "phase": {"enum": list(PHASES)},
        "history": {"type": "array", "items": {
            "type": "object", "required": ["phase", "at"], "additionalProperties": False,
            "properties": {"phase": {"enum": list(PHASES)}, "at": _NUM}}},
        "job_id": _STR_OR_NULL,
        "updated_at": _NUM,
        "started_at": _NUM, "runtime_at": _NUM, "finished_at": _NUM_OR_NULL,
        "batch_host": {"type": "string"},
        "restarts": {"type": "integer"},
        "reason": _STR_OR_NULL,
        "failure": FAILURE_SCHEMA,
        "endpoint": _STR_OR_NULL,
        "router_url": _STR_OR_NULL,   # the job's own router, from router_ready on
        "router_node": {"type": "string"},
        "engines_ready_count": {"type": "integer"},
        "engines_total": {"type": "integer"},
        "health_urls": {"type": "object", "additionalProperties": {"type": "string"}},
        "health": {"type": "object", "additionalProperties": {"type": "string"}},
        "smoke_tokens": _INT_OR_NULL,
        "serving_after_s": _NUM_OR_NULL,
        "preflight": {"type": "object"},
        "stage": STAGE_SCHEMA,
        "benchmark": {"type": "object"},
        "slurm_unreachable": {"type": ["object", "null"]},
        # writes of this file that failed while the deployment served (runtime/state.py): it
        # served on; the count, the first and last failure and the last error
        "write_failures": {"type": "object", "required": ["count", "first_at", "last_at", "error"],
                           "additionalProperties": False,
                           "properties": {"count": {"type": "integer"}, "first_at": _NUM,
                                          "last_at": _NUM, "error": {"type": "string"}}},
        "instances": {"type": "object", "additionalProperties": INSTANCE_SCHEMA},
        "excluded_nodes": {"type": "array", "items": {"type": "string"}},
        "startup": STARTUP_SCHEMA,
        "attach": ATTACH_SCHEMA,
        "autoscale": AUTOSCALE_SCHEMA,
        # a renewing instance job (runtime/renew.py): its successor and how it was submitted
        "renew": {"type": ["object", "null"], "additionalProperties": False, "properties": {
            "twin_dir": {"type": "string"}, "end_at": _NUM_OR_NULL,
            "successor_job_id": _STR_OR_NULL, "submitted_at": _NUM_OR_NULL,
            "trigger": _STR_OR_NULL, "renewed_at": _NUM_OR_NULL,
            # every try spent, why: the instances end at the job's time limit
            "lapsed": _STR_OR_NULL}},
        # the compile caches kept between jobs, as each instance's first start found them
        "caches": {"type": "object", "required": ["dir", "storage", "instances"],
                   "additionalProperties": False,
                   "properties": {"dir": {"type": "string"},
                                  "storage": {"enum": ["node-local", "shared"]},
                                  "instances": {"type": "object",
                                                "additionalProperties": CACHES_BY_NODE}}},
    },
    "additionalProperties": False,
}


# Requests to a running job from the operator commands: files its orchestrator looks for once a
# liveness round. run/control/drain-<instance>.json ({"timeout_s": number, "requested_at": unix
# time, "job_id": the Slurm job it is for}, written atomically: a temp file, then a rename) drains
# that instance; the orchestrator renames it to drain-<instance>.taken once it acted on it,
# .refused where it did not (a request for another job, or naming none and older than the job,
# is refused: a directory runs a new job after a renewal or a slot's end).
CONTROL_DIR = os.path.join("run", "control")
DRAIN_PREFIX, DRAIN_SUFFIX = "drain-", ".json"
# The reason of an instance job whose every instance was drained (its phase is "done").
SCALED_IN = "scaled in: every instance drained"


def drain_request_path(job_dir: str, instance: str) -> str:
    return os.path.join(job_dir, CONTROL_DIR, f"{DRAIN_PREFIX}{instance}{DRAIN_SUFFIX}")


class SpecError(Exception):
    """plan.json is not a spec this runtime understands: nothing may start."""


def check_private(path: str) -> None:
    """Refused (SpecError) unless `path` is this user's own and nobody else can write it, and
    is no link: whoever else could write the job directory or its plan.json could make the
    job run what they like, as this user."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror or e}") from None
    link = stat.S_ISLNK(st.st_mode)
    if link or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise SpecError(f"{path} is not this user's alone ({'a link, ' if link else ''}uid "
                        f"{st.st_uid}, mode {st.st_mode & 0o7777:o}; this job runs as uid "
                        f"{os.getuid()}): whoever else can write it could choose what the job "
                        "runs; refusing it")


def load_spec(job_dir: str) -> dict:
    """plan.json of `job_dir`, refused unless it is the SPEC_VERSION this runtime understands
    and the directory and plan.json are this user's alone."""
    path = os.path.join(job_dir, "plan.json")
    check_private(job_dir.rstrip("/") or "/")
    check_private(path)
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read {path}: {e}") from None
    got = (plan.get("spec"), plan.get("spec_version")) if isinstance(plan, dict) else (None, None)
    if got != (SPEC, SPEC_VERSION):
        made_by = plan.get("hpcserve_version", "an older hpcserve") if isinstance(plan, dict) \
            else "?"
        raise SpecError(f"{path} is run-time spec {got[1]!r} (rendered by hpcserve {made_by}); "
                        f"this hpcserve_runtime understands spec {SPEC_VERSION} only: render the "
                        "job directory again with one hpcserve version")
    return plan


# What the renderer and the runtime both spell: the steps' names in an allocation the user holds
# and the variables job.sbatch unsets there.
def step_prefix(name: str, in_allocation: bool) -> str:
    """The prefix of the step names in Slurm of the deployment `name`: in an allocation the user
    holds, "hpcserve-<name>-", so that cancel never takes the user's own steps called router or
    prefill-0 for the deployment's; none in the deployment's own job."""
    return f"hpcserve-{name}-" if in_allocation else ""


# The variables srun reads as options (srun(1), INPUT ENVIRONMENT VARIABLES) that an salloc or
# sbatch of the user's sets from its own options (salloc(1)/sbatch(1), OUTPUT ENVIRONMENT
# VARIABLES): a step would take the user's allocation shape (its CPUs, memory, GPUs and tasks)
# for the deployment's. The job.sbatch of an in-allocation job unsets them, as the het job never
# has them: each step spells its shape itself.
SHAPE_VARS = (
    "SLURM_CPUS_PER_TASK", "SLURM_CPUS_PER_GPU", "SLURM_TRES_PER_TASK", "SLURM_MEM_PER_CPU",
    "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_GPU", "SLURM_GPUS", "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_TASK", "SLURM_GPUS_PER_SOCKET", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS_PER_CORE", "SLURM_NTASKS_PER_SOCKET",
    "SLURM_NTASKS_PER_GPU", "SLURM_DISTRIBUTION", "SLURM_CPU_BIND", "SLURM_MEM_BIND",
    "SLURM_GPU_BIND", "SLURM_HINT", "SLURM_THREADS_PER_CORE", "SLURM_EXACT",
    "SLURM_OVERCOMMIT", "SLURM_CONSTRAINT", "SLURM_GRES",
)
