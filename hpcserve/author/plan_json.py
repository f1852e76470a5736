"""plan.json: its writer (a Plan -> the job's spec) and its JSON schema.

plan.json is the versioned contract between the renderer and the in-job runtime: hpcserve_job.py
(runtime/job.py, copied into the job directory) reads only plan.json, never hpcserve itself, and
refuses a spec version it does not know before it starts anything. The spec's name and version
come from runtime/contract.py, the one declaration the renderer, the runtime and the operator
commands share. Every key the runtime reads is listed in SCHEMA (tests validate every rendered
plan.json against it); keys marked "for people" (argv, env, parallel sizes) describe the plan and
are not read by the runtime. This module is render-side: it is not shipped into job directories.

A word (argv, env values) is a string, or a list of parts: strings and {"var": NAME}, a variable
known only in the task (the node's address, its rank), as the launch scripts expand it.

The spec versions and what each added: runtime/contract.py.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from .. import __version__
from .containers import apptainer_image, enroot_image, image_import
from ..runtime.contract import (API_KEY_FILE, API_KEY_VAR, AUTOSCALE_SIGNALS, SPEC, SPEC_VERSION,
                                WORKERS_APIS)
from .words import Var, Word


def dumps(spec: dict) -> str:
    """plan.json's text: one top-level key per line, one list item (an instance) per line. Each
    piece goes through json's C encoder, which `indent=` would bypass: for a 1,024-node plan
    that was most of a render's time."""
    lines = []
    for k, v in spec.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            items = ",\n".join("  " + json.dumps(x) for x in v)
            lines.append(f" {json.dumps(k)}: [\n{items}\n ]")
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def word(w: Word) -> Any:
    if isinstance(w, str):
        return w
    return [{"var": p.name} if isinstance(p, Var) else p for p in w]


def words(ws) -> list:
    return [word(w) for w in ws]


def api_key(plan, job_dir: str) -> dict | None:
    """plan.json's api_key: the variable of the deployment's key and the file job.sbatch reads
    it from, the front's own (an instance job's: its front's); no file where the deployment
    names its own variable (router.args.api-key), which sbatch exports from the submitting
    environment. None where nothing of the deployment takes a key."""
    if not plan.api_key_env:
        return None
    front = plan.attach["front_job_dir"] if plan.attach else job_dir
    return {"env": plan.api_key_env,
            "file": posixpath.join(front, API_KEY_FILE) if plan.api_key_env == API_KEY_VAR
            else None}


def job_spec(plan, job_dir: str) -> dict:
    """plan.json of a plan rendered for `job_dir`."""
    return {
        "spec": SPEC, "spec_version": SPEC_VERSION, "hpcserve_version": __version__,
        "name": plan.name, "job_dir": job_dir,
        "engine": {"name": plan.engine, "title": plan.engine_title, "version": plan.version,
                   "simulate": plan.simulate},
        "profile": plan.profile, "model_path": plan.model_path, "served_name": plan.served_name,
        "time_limit": plan.time_limit, "signal_grace": plan.signal_grace,
        "requeue": plan.requeue, "jobs_dir": plan.jobs_dir,
        "recovery": plan.recovery,
        "readiness": {k: getattr(plan.readiness, k) for k in
                      ("engine_timeout", "router_timeout", "poll_interval", "smoke_tokens")},
        "liveness": {k: getattr(plan.liveness, k) for k in
                     ("interval", "timeout", "failures", "node_interval")},
        "container": {"runtime": plan.container.runtime, "image": plan.image,
                      "import": image_import(plan, job_dir)},
        # the engines' private temporary directories, to be removed from every node at the end
        "scratch": plan.scratch,
        "network": {"interface": plan.interface, "ib_devices": plan.ib_devices},
        "preflight": {**plan.preflight, "image": _preflight_image(plan, job_dir)},
        # model.stage: the shared model directory copied to every node before the engines start
        "stage": plan.stage,
        "benchmark": plan.benchmark and {**plan.benchmark.spec,
                                         "python": plan.benchmark.python,
                                         "tokenizer": plan.benchmark.tokenizer,
                                         "component": plan.benchmark.component,
                                         "node_offset": plan.benchmark.node_offset},
        "components": [{"index": c.index, "name": c.name, "nodes": c.nodes,
                        "directives": [list(d) for d in c.directives]}
                       for c in plan.components],
        "instances": [_instance(plan, i) for i in plan.instances],
        "router": _router(plan),
        # an instance job (`hpcserve scale`): the front's running router it registers its
        # instances with; null for a deployment's front job
        "attach": plan.attach,
        # roles.<role>.autoscale: what the orchestrator reads and its slots' job directories
        # (runtime/autoscale.py); null where no role autoscales
        "autoscale": _autoscale(plan, job_dir),
        # a renewing instance job (runtime/renew.py): its twin's directory and the margin
        "renew": plan.renew,
        # the site's Prometheus file-SD directory (runtime/file_sd.py), or None
        "file_sd_dir": plan.file_sd_dir,
        # the compile caches kept between jobs (compile_caches.py), or None
        "caches": plan.caches and {"dir": plan.cache_dir, "storage": plan.cache_storage,
                                   "caches": [{"name": c.name, "var": c.var, "path": c.path,
                                               "probe": c.probe} for c in plan.caches]} or None,
        "secret_env": list(plan.secret_env),
        "api_key": api_key(plan, job_dir),
        # steps of an allocation the user holds (runtime/allocation.py), not a het job's
        "in_allocation": plan.in_allocation,
        "warnings": list(plan.warnings), "notes": list(plan.notes),
    }


def _autoscale(plan, job_dir: str) -> dict | None:
    from .autoscale import slot_dir
    return {role: {"min": a.min, "max": a.max,
                   "signal": {"kind": a.signal, "metrics": list(a.metrics)},
                   "target": a.target, "cool_down_s": a.cool_down_s, "interval_s": a.interval_s,
                   "drain_timeout_s": a.drain_timeout_s,
                   "slots": [slot_dir(job_dir, n) for n, _ in a.slots]}
            for role, a in plan.autoscale.items()} or None


def _preflight_image(plan, job_dir: str) -> dict | None:
    """What the image check looks for on every node: a file, or why there is none to look for
    yet (an image pulled or imported once the job runs)."""
    runtime = plan.container.runtime
    if runtime == "none":
        return None
    if runtime == "apptainer":
        uri, image = apptainer_image(plan, job_dir)
        if uri:
            return {"note": f"{uri} is built into {image} by the batch host, before any step"}
        if "://" in image:
            return {"note": f"{image} is pulled by apptainer when the engines start"}
        return {"path": image}
    uri, sqsh = enroot_image(plan, job_dir)
    if uri is None:
        return {"path": sqsh}
    who = "the batch host, before any step" if runtime == "pyxis" else "the first task to need it"
    return {"note": f"{uri} is imported into {sqsh} by {who}"}


def _instance(plan, i) -> dict:
    return {
        "name": i.name, "role": i.role, "index": i.index, "component": i.component,
        "node_offset": i.node_offset, "nodes": i.nodes, "tasks_per_node": i.tasks_per_node,
        "mpi": i.mpi, "gpus_per_node": i.gpus_per_node, "gpu_ids": i.gpu_ids,
        "port": i.port, "ports": dict(i.ports), "health_path": plan.health_path,
        "liveness": {"path": plan.probe[0], "proves_progress": plan.probe[1],
                     "hung_after": plan.hung_after[i.role]},
        "metrics": plan.metrics and {"path": plan.metrics.path,
                                     "gauges_path": plan.metrics.gauges_path,
                                     "progress": list(plan.metrics.progress),
                                     "pending": list(plan.metrics.pending),
                                     "queued": list(plan.metrics.queued)},
        "smoke": {"kind": plan.smoke[0], "path": plan.smoke[1]},
        "stop_signal": plan.stop_signal,
        "parallel": dict(i.parallel), "argv": words(i.argv),
        "rank_argv": [words(r) for r in i.rank_argv],
        "env": [[k, word(v)] for k, v in i.env],
        # the engine's start-up lines (runtime/startup.py): a regex each, or None: unknown
        "startup_lines": dict(plan.startup_lines),
    }


def _router(plan) -> dict | None:
    r = plan.router
    if r is None:
        return None
    return {
        "name": r.name, "component": r.component, "node_offset": r.node_offset, "port": r.port,
        "prometheus_port": r.prometheus_port, "metrics_path": r.metrics_path, "pd": r.pd,
        "readiness": {"path": r.readiness_path, "count": list(r.readiness_count),
                      "workers": len(plan.instances)},
        "workers_api": r.workers_api,
        "api_key_env": r.api_key_env, "stop_signal": "TERM",
        "command": words(r.command), "argv": words(r.argv),
        "env": [[k, word(v)] for k, v in r.env],
    }


_WORD = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"anyOf": [
    {"type": "string"},
    {"type": "object", "properties": {"var": {"type": "string"}}, "required": ["var"],
     "additionalProperties": False}]}}]}
_INT = {"type": "integer"}
_STR = {"type": "string"}
_OPT_STR = {"type": ["string", "null"]}
_SIGNAL = {"enum": ["TERM", "INT", "KILL"]}


def _obj(props: dict, required: list | None = None) -> dict:
    return {"type": "object", "properties": props, "required": required or list(props),
            "additionalProperties": False}


SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": f"hpcserve job spec {SPEC_VERSION} (plan.json)",
    **_obj({
        "spec": {"const": SPEC}, "spec_version": {"const": SPEC_VERSION},
        "hpcserve_version": _STR, "name": _STR, "job_dir": _STR,
        "engine": _obj({"name": _STR, "title": _STR, "version": _STR,
                        "simulate": {"type": "boolean"}}),
        "profile": _STR, "model_path": _STR, "served_name": _STR, "time_limit": _STR,
        "signal_grace": _INT, "requeue": _INT, "jobs_dir": _STR,
        "recovery": {"type": "object", "additionalProperties": _obj({
            "restart": {"type": "boolean"}, "max_restarts": _INT,
            "backoff_s": {"type": "number"}, "min_serving": _INT, "spares": _INT,
            "component": _INT, "first_spare": _INT})},
        "readiness": _obj({"engine_timeout": _INT, "router_timeout": _INT,
                           "poll_interval": {"type": "number"}, "smoke_tokens": _INT}),
        "liveness": _obj({"interval": {"type": "number"}, "timeout": {"type": "number"},
                          "failures": _INT, "node_interval": {"type": "number"}}),
        "container": _obj({"runtime": {"enum": ["pyxis", "enroot", "apptainer", "none"]},
                           "image": _OPT_STR,
                           "import": {"anyOf": [{"type": "null"}, _obj({
                               "uri": _STR, "sqsh": _STR, "helper": _STR, "owner": _OPT_STR}),
                               _obj({"uri": _STR, "sif": _STR, "helper": _STR,
                                     "owner": _OPT_STR})]}}),
        "scratch": {"type": "boolean"},
        "network": _obj({"interface": _STR, "ib_devices": {}}),
        "preflight": _obj({
            "enabled": {"type": "boolean"}, "only": {"type": "boolean"},
            "mpi": {"type": "boolean"}, "waive": {"type": "array", "items": _STR},
            "max_clock_skew_s": {"type": "number"}, "min_shm_bytes": _INT,
            "min_gpu_free_fraction": {"type": "number"},
            "gid_index": {"type": ["integer", "null"]},
            "gpus": _obj({"why": _OPT_STR}), "model_optional": _OPT_STR,
            "fabric": {"anyOf": [{"type": "null"}, _obj({"domain_nodes": _INT})]},
            "tools": {"type": "array", "items": _STR},
            "image": {"anyOf": [{"type": "null"}, _obj({"path": _STR}), _obj({"note": _STR})]}}),
        "stage": {"anyOf": [{"type": "null"}, _obj({
            "source": _STR, "dir": _STR, "name": _STR, "path": _STR, "max_bytes": _INT,
            "only": {"type": "boolean"}})]},
        "benchmark": {"anyOf": [{"type": "null"}, _obj({
            "client": _STR, "title": _STR, "dir": _STR, "input_tokens": _INT,
            "output_tokens": _INT, "warmup": _INT,
            "points": {"type": "array", "items": _obj({
                "label": _STR, "concurrency": _INT, "rate": {"type": ["number", "null"]},
                "prompts": _INT, "file": _STR})},
            "keys": _obj({"output": _STR, "failed": _OPT_STR, "json_lines": {"type": "boolean"},
                          "metrics": {"type": "object", "additionalProperties": _STR}}),
            "point_timeout_s": _INT,
            "gate": _obj({"min_success": {"type": "number"},
                          "output_tolerance": {"type": "number"}}),
            "metrics_interval_s": {"type": "number"}, "then": {"enum": ["stop", "serve"]},
            "python": _STR, "tokenizer": _STR, "component": _INT, "node_offset": _INT})]},
        "components": {"type": "array", "items": _obj({
            "index": _INT, "name": _STR, "nodes": _INT,
            "directives": {"type": "array", "items": {"type": "array"}}})},
        "instances": {"type": "array", "items": _obj({
            "name": _STR, "role": {"enum": ["prefill", "decode", "worker"]}, "index": _INT,
            "component": _INT, "node_offset": _INT, "nodes": _INT, "tasks_per_node": _INT,
            "mpi": _OPT_STR, "gpus_per_node": _INT, "gpu_ids": _OPT_STR,
            "port": _INT, "ports": {"type": "object", "additionalProperties": _INT},
            "health_path": _STR, "stop_signal": _SIGNAL,
            "liveness": _obj({"path": _STR, "proves_progress": {"type": "boolean"},
                              "hung_after": {"type": "number"}}),
            "metrics": {"anyOf": [{"type": "null"}, _obj({
                "path": _STR, "gauges_path": _OPT_STR,
                "progress": {"type": "array", "items": _STR},
                "pending": {"type": "array", "items": _STR},
                "queued": {"type": "array", "items": _STR}})]},
            "smoke": _obj({"kind": {"enum": ["chat", "get"]}, "path": _STR}),
            "parallel": {"type": "object", "additionalProperties": _INT},
            "argv": {"type": "array", "items": _WORD},
            "rank_argv": {"type": "array", "items": {"type": "array", "items": _WORD}},
            "env": {"type": "array", "items": {"type": "array", "prefixItems": [_STR, _WORD]}},
            "startup_lines": _obj({"weights_loaded": _OPT_STR, "ready": _OPT_STR})})},
        "router": {"anyOf": [{"type": "null"}, _obj({
            "name": _STR, "component": _INT, "node_offset": _INT, "port": _INT,
            "prometheus_port": _INT, "metrics_path": _OPT_STR, "pd": {"type": "boolean"},
            "readiness": _obj({"path": _STR, "count": {"type": "array", "items": _STR},
                               "workers": _INT}),
            "workers_api": {"enum": list(WORKERS_APIS)},
            "api_key_env": _OPT_STR, "stop_signal": _SIGNAL,
            "command": {"type": "array", "items": _WORD},
            "argv": {"type": "array", "items": _WORD},
            "env": {"type": "array", "items": {"type": "array", "prefixItems": [_STR, _WORD]}}})]},
        "attach": {"anyOf": [{"type": "null"}, _obj({
            # null in an autoscale slot: read from the front's state.json as it starts
            "router_url": _OPT_STR, "workers_api": {"enum": ["queued", "direct"]},
            "api_key_env": _OPT_STR, "front_job_id": _OPT_STR, "front_job_dir": _STR,
            "deployment": _STR})]},
        "autoscale": {"anyOf": [{"type": "null"}, {"type": "object", "additionalProperties": _obj({
            "min": _INT, "max": _INT,
            "signal": _obj({"kind": {"enum": list(AUTOSCALE_SIGNALS)},
                            "metrics": {"type": "array", "items": _STR}}),
            "target": {"type": "number"}, "cool_down_s": {"type": "number"},
            "interval_s": {"type": "number"}, "drain_timeout_s": {"type": "number"},
            "slots": {"type": "array", "items": _STR}})}]},
        "renew": {"anyOf": [{"type": "null"}, _obj({"twin_dir": _STR,
                                                    "margin_s": {"type": "number"}})]},
        "file_sd_dir": _OPT_STR,
        "caches": {"anyOf": [{"type": "null"}, _obj({
            "dir": _STR, "storage": {"enum": ["node-local", "shared"]},
            "caches": {"type": "array", "items": _obj({
                "name": _STR, "var": _STR, "path": _STR, "probe": _STR})}})]},
        "secret_env": {"type": "array", "items": _STR},
        "api_key": {"anyOf": [{"type": "null"}, _obj({"env": _STR, "file": _OPT_STR})]},
        "in_allocation": {"type": "boolean"},
        "warnings": {"type": "array", "items": _STR},
        "notes": {"type": "array", "items": _STR},
    }),
}
