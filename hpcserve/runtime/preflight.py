"""hpcserve's preflight checks, run on every node by the discovery step (stdlib only).

Stdlib only (mpi4py where the discovery step runs under `srun --mpi=pmix` and has it). Two halves:

- node_report(), on every node at once, in the discovery step and before any engine starts: what
  this node has (its Python, the tools the job runs, the image, the model's files, GPUs, its
  NVLink fabric where the site declares one, IB ports and GIDs, peer memory, /dev/shm, the memlock limit, the ports the plan binds here, its clock),
  written to the job directory as run/preflight/c<component>-n<node>.json.
- evaluate(), on the batch host over every node's report: each check's verdict per node, with
  what only a comparison shows (a model file list that differs from the other nodes', a node
  in another NVLink fabric than its instance's leader, a clock off the batch host's), and the checks the deployment waives.

A check is "ok", "fail", "n/a" (it does not apply here, with the reason) or "waived" (it failed,
and the deployment said to go on anyway).

The checks themselves, one node's each, are preflight_checks.py; this module runs them and judges
their reports.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter

from .preflight_checks import FAIL, NA, OK, WAIVED, check_fabric, check_gpus, check_ib, \
    check_image, check_memlock, check_model, check_peer_memory, check_ports, check_shm, \
    check_tools
from .spec import Preflight, Spec

CHECKS = ("python", "tools", "image", "model", "gpus", "fabric", "ib", "peer_memory", "shm", "memlock",
          "ports", "clock")


# ------------------------------------------------------------------------------------ node side

def node_report(plan: Spec, component: int, nodeid: int, node: str) -> dict:
    """This node's checks against plan.json's `preflight` block (one entry per check)."""
    pf = plan.preflight
    insts = node_instances(plan, component, nodeid)
    ib = plan.network.ib_devices
    rdma = bool(ib)
    gpus_why = pf.gpus.why
    files: list = []
    fabric: dict = {}
    checks = {
        "python": [OK, f"Python {sys.version.split()[0]} ({sys.executable})"],
        "tools": check_tools(pf.tools),
        "image": check_image(pf.image),
        "model": check_model(plan.model_path, pf.model_optional, files),
        "gpus": (check_gpus(sum(i.gpus_per_node for i in insts), pf.min_gpu_free_fraction)
                 if not gpus_why else [NA, gpus_why]),
        "ib": check_ib(ib, pf.gid_index),
        **({"fabric": check_fabric(fabric)} if pf.fabric is not None else {}),
        "peer_memory": (check_peer_memory() if rdma and not gpus_why else
                        [NA, "no RDMA transfers between GPUs here (" +
                         ("no IB devices configured)" if not rdma else gpus_why + ")")]),
        "shm": check_shm("/dev/shm", pf.min_shm_bytes),
        "memlock": check_memlock(rdma),
        "ports": check_ports(node_ports(plan, component, nodeid)),
    }
    report = {"node": node, "component": component, "nodeid": nodeid,
              "instances": [i.name for i in insts], "checks": checks, "model_files": files,
              "mode": "srun", **({"fabric": fabric} if fabric else {})}
    _mpi_clock(report)
    report["time"] = time.time()
    return report


def node_instances(plan: Spec, component: int, nodeid: int) -> list:
    return [i for i in plan.instances if i.component == component
            and i.node_offset <= nodeid < i.node_offset + i.nodes]


def node_ports(plan: Spec, component: int, nodeid: int) -> list:
    """(port, what binds it) for every port the plan binds on this node."""
    out = {}
    for i in node_instances(plan, component, nodeid):
        for kind, port in [("http", i.port), *sorted(i.ports.items())]:
            out.setdefault(port, f"{i.name} {kind}")
    r = plan.router
    if r is not None and r.component == component and r.node_offset == nodeid:
        out.setdefault(r.port, "router")
        out.setdefault(r.prometheus_port, "router metrics")
    return sorted(out.items())


def _mpi_clock(report: dict) -> None:
    """Under srun --mpi=pmix with mpi4py: every rank's clock offset from rank 0's, measured
    by a ping-pong (half the round trip), and a barrier so that all nodes report together."""
    if "PMIX_RANK" not in os.environ:
        return
    try:
        from mpi4py import MPI
    except ImportError:
        return
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank == 0:
        for _ in range(size - 1):
            src = comm.recv(source=MPI.ANY_SOURCE, tag=7)
            comm.send(time.time(), dest=src, tag=8)
        report["clock_offset"] = 0.0
    else:
        t0 = time.time()
        comm.send(rank, dest=0, tag=7)
        t_root = comm.recv(source=0, tag=8)
        report["clock_offset"] = round((t0 + time.time()) / 2 - t_root, 6)
    comm.Barrier()
    report["mode"] = "mpi"


# ------------------------------------------------------------------------------ batch-host side

def evaluate(reports: list, window: tuple, pf: Preflight, batch_host: str) -> dict:
    """Every node's verdicts: its own checks, the model file comparison, the clock against the
    batch host's (its report's time must fall inside the step's run on the batch host's clock,
    give or take the allowed skew), the waivers. Returns the table state.json holds."""
    reports = sorted(reports, key=lambda r: (r["component"], r["nodeid"]))  # srun's order varies
    nodes = {r["node"]: {c: list(v) for c, v in r["checks"].items()} for r in reports}
    _compare_models(reports, nodes)
    _compare_fabrics(reports, nodes)
    for r in reports:
        if "time" in r:
            nodes[r["node"]]["clock"] = _clock(r, window, pf.max_clock_skew_s, batch_host)
    for checks in nodes.values():
        for c, v in checks.items():
            if v[0] == FAIL and c in pf.waive:
                v[0] = WAIVED
    failed = [[r["node"], c, nodes[r["node"]][c][1]] for r in reports for c in CHECKS
              if nodes[r["node"]].get(c, [OK])[0] == FAIL]
    shown = [c for c in CHECKS if c != "fabric" or any("fabric" in v for v in nodes.values())]
    return {"passed": not failed, "checks": shown, "waived": list(pf.waive),
            "mode": "mpi" if any(r.get("mode") == "mpi" for r in reports) else "srun",
            "nodes": nodes, "failed": failed}


def _compare_models(reports: list, nodes: dict) -> None:
    """The file list and sizes most nodes see is the model; a node that sees another fails
    with the first difference."""
    seen = [r for r in reports if r["checks"].get("model", [NA])[0] == OK]
    if len(seen) < 2:
        return
    lists = {r["node"]: {f: s for f, s in r["model_files"]} for r in seen}
    counts = Counter(json.dumps(sorted(v.items())) for v in lists.values())
    ref_key, ref_n = counts.most_common(1)[0]
    ref = dict(json.loads(ref_key))
    for node, files in lists.items():
        if json.dumps(sorted(files.items())) == ref_key:
            continue
        missing = sorted(set(ref) - set(files))
        extra = sorted(set(files) - set(ref))
        sized = sorted(f for f in set(ref) & set(files) if ref[f] != files[f])
        if missing:
            what = f"missing {missing[0]}"
        elif sized:
            what = f"{sized[0]} is {files[sized[0]]:,} bytes, not {ref[sized[0]]:,}"
        else:
            what = f"has {extra[0]}, which the others lack"
        more = len(missing) + len(extra) + len(sized) - 1
        nodes[node]["model"] = [FAIL, f"{what}{f' (and {more} more differences)' if more else ''}"
                                      f" from the file list {ref_n} other node(s) see"]


def _compare_fabrics(reports: list, nodes: dict) -> None:
    """Every node of an instance in its leader's NVLink fabric (node rank 0: the first node of
    the instance in the component's order); a node in another fails naming both."""
    members: dict = {}
    for r in reports:  # sorted by component and node: an instance's leader comes first
        if r.get("fabric"):
            for name in r.get("instances", []):
                members.setdefault(name, []).append(r)
    for name, rs in members.items():
        lead = rs[0]
        want = (lead["fabric"]["cluster_uuid"], lead["fabric"]["clique_id"])
        for r in rs[1:]:
            got = (r["fabric"]["cluster_uuid"], r["fabric"]["clique_id"])
            if got != want:
                nodes[r["node"]]["fabric"] = [
                    FAIL, f"{name} spans two NVLink domains: {r['node']} is in ClusterUUID "
                          f"{got[0]} CliqueId {got[1]}, its leader {lead['node']} in ClusterUUID "
                          f"{want[0]} CliqueId {want[1]}"]


def _clock(r: dict, window: tuple, max_skew: float, batch_host: str) -> list:
    start, end = window
    t = r["time"]
    skew = t - end if t > end else start - t if t < start else 0.0
    if skew > max_skew:
        side = "ahead of" if t > end else "behind"
        return [FAIL, f"clock at least {skew:.1f} s {side} {batch_host}'s (allowed "
                      f"{max_skew:g} s)"]
    off = r.get("clock_offset")
    if off is not None and abs(off) > max_skew:
        return [FAIL, f"clock {off:+.3f} s from rank 0's of its component (allowed "
                      f"{max_skew:g} s)"]
    detail = f"within {max_skew:g} s of {batch_host}"
    return [OK, detail + (f"; {off:+.4f} s from rank 0" if off is not None else "")]


def table_text(result: dict) -> list:
    """The table for the job's log: one row per node, one column per check."""
    cols = result["checks"]
    word = {OK: "ok", FAIL: "FAIL", NA: "n/a", WAIVED: "waived"}
    rows = [["node", *cols]]
    for node, checks in result["nodes"].items():
        rows.append([node, *(word[checks[c][0]] if c in checks else "-" for c in cols)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols) + 1)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    for node, checks in result["nodes"].items():
        for c in cols:
            if c in checks and checks[c][0] in (FAIL, WAIVED):
                lines.append(f"{node} {c} ({word[checks[c][0]]}): {checks[c][1]}")
    return lines


REPORTS = os.path.join("run", "preflight")  # in the job directory: c<component>-n<node>.json


def write_report(job_dir: str, report: dict) -> None:
    """The report as a file of its own, not a line on srun's stdout: srun interleaves the
    output of several tasks in chunks, and a long line (a model's file list) came back spliced
    with another node's."""
    d = os.path.join(job_dir, REPORTS)
    path = os.path.join(d, f"c{report['component']}-n{report['nodeid']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, separators=(",", ":"))
    os.replace(path + ".tmp", path)


def read_reports(job_dir: str) -> list:
    d = os.path.join(job_dir, REPORTS)
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.endswith(".json"):
            try:
                with open(os.path.join(d, name)) as f:
                    out.append(json.load(f))
            except (OSError, ValueError):
                continue
    return out
