"""The deployment's metrics endpoints for the site's Prometheus, as a file-based service discovery
file (Prometheus configuration, <file_sd_config>: a JSON list of {"targets": ["host:port"],
"labels": {...}}, re-read by Prometheus whenever a file in the directory changes).

Where the site names a directory (plan.json "file_sd_dir"), the job keeps one file there while
it serves: each instance that is in the router (its leader, where the engine serves its
metrics) and the router's metrics port. An instance taken out of the router is left out of the
file until its replacement serves, then listed again with its new node and attempt; the file
is removed first thing at the end, whatever ended the job. Each write is a temporary dot-file
in the same directory renamed over the file, so Prometheus never reads half a file.
"""

from __future__ import annotations

import json
import os

from . import owned
from .spec import Spec
from .table import SERVING

DEFAULT_PATH = "/metrics"   # Prometheus's metrics_path default: not repeated as a label


def file_name(deployment: str, cluster: str | None, job_id: str | None) -> str:
    """hpcserve-<deployment>-<cluster>-<job id>.json: two deployments (or the same one on two
    clusters) never write the same file."""
    return "-".join(["hpcserve", deployment] + [p for p in (cluster, job_id) if p]) + ".json"


def target_groups(plan: Spec, serving: dict, router: dict | None, ids: dict) -> list[dict]:
    """The file's content. `serving`: instance name -> {"address", "nodes", "attempt"} of each
    instance in the router now; `router`: {"node", "address"} once it runs, else None; `ids`:
    extra labels (the Slurm job id and cluster), left out where empty."""
    common = {"deployment": plan.name, "engine": plan.engine.name}
    common.update((k, str(v)) for k, v in ids.items() if v)
    groups = []
    for inst in plan.instances:
        where, metrics = serving.get(inst.name), inst.metrics
        if where is None or metrics is None:
            continue  # out of the router, or an engine without Prometheus text (TensorRT-LLM)
        groups.append(_group(where["address"], inst.port, metrics.path, dict(
            common, role=inst.role, instance=inst.name, node=where["nodes"][0],
            nodes=",".join(where["nodes"]), attempt=str(where["attempt"]))))
    r = plan.router
    if router and r is not None and r.metrics_path:
        groups.append(_group(router["address"], r.prometheus_port, r.metrics_path, dict(
            common, role="router", instance="router", node=router["node"])))
    return groups


def _group(address: str, port: int, path: str, labels: dict) -> dict:
    if path != DEFAULT_PATH:
        labels["__metrics_path__"] = path  # a target's own label wins over the scrape config's
    host = f"[{address}]" if ":" in address else address  # an IPv6 address
    return {"targets": [f"{host}:{port}"], "labels": labels}


def write_atomic(path: str, text: str) -> None:
    """`text` as `path` in one rename, readable by the Prometheus server's user, never through
    a name another user of the directory could have planted a link at (owned.write_atomic)."""
    owned.write_atomic(path, text, mode=0o644)


class FileSD:
    def __init__(self, job):
        self.job = job
        d = job.plan.file_sd_dir
        self.ids = {"slurm_job_id": job.job_id,
                    "slurm_cluster": os.environ.get("SLURM_CLUSTER_NAME", "")}
        self.path = d and os.path.join(os.path.expanduser(d), file_name(
            job.plan.name, self.ids["slurm_cluster"], job.job_id))
        self._text: str | None = None   # what the file holds now
        self._error: str | None = None  # the last write error, logged once

    def groups(self) -> list[dict]:
        """The targets now, from the instance table and the router's place."""
        inst = self.job.instances
        serving = {name: {"address": inst.heads[name], "nodes": rec.nodes,
                          "attempt": rec.attempt}
                   for name, rec in self.job.table.recs.items() if rec.status == SERVING}
        router = inst.router_addr and {"node": inst.router_node, "address": inst.router_addr}
        return target_groups(self.job.plan, serving, router, self.ids)

    def update(self) -> None:
        """Write the file if its targets changed. A failure is logged, never raised: the
        deployment serves whether or not Prometheus can see it."""
        if not self.path:
            return
        groups = self.groups()
        text = json.dumps(groups, indent=1) + "\n"
        if text == self._text:
            return
        try:
            write_atomic(self.path, text)
        except OSError as e:
            # said of the file, not of its temporary name (a new one each try)
            why = f"{e.strerror or e}: {self.path}"
            if why != self._error:
                self.job.log(f"Prometheus file SD not written: {why}")
            self._error = why
            return
        self._text, self._error = text, None
        self.job.log(f"Prometheus file SD: {len(groups)} target(s) in {self.path}")

    def remove(self) -> None:
        """The file gone (also one a killed earlier try of this job left): its targets are
        about to stop answering."""
        if not self.path:
            return
        try:
            os.unlink(self.path)
            self.job.log(f"Prometheus file SD removed: {self.path}")
        except FileNotFoundError:
            pass
        except OSError as e:
            self.job.log(f"Prometheus file SD not removed: {e}")
        self._text = None
