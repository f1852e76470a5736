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
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter

from . import ownport
from .model_dir import TooManyFiles, model_files

CHECKS = ("python", "tools", "image", "model", "gpus", "fabric", "ib", "peer_memory", "shm", "memlock",
          "ports", "clock")
OK, FAIL, NA, WAIVED = "ok", "fail", "n/a", "waived"
GIB = 1024 ** 3


# ------------------------------------------------------------------------------------ node side

def node_report(plan: dict, component: int, nodeid: int, node: str) -> dict:
    """This node's checks against plan.json's `preflight` block (one entry per check)."""
    pf = plan["preflight"]
    insts = node_instances(plan, component, nodeid)
    ib = (plan.get("network") or {}).get("ib_devices")
    rdma = bool(ib)
    gpus_why = pf["gpus"].get("why")
    files: list = []
    fabric: dict = {}
    checks = {
        "python": [OK, f"Python {sys.version.split()[0]} ({sys.executable})"],
        "tools": check_tools(pf["tools"]),
        "image": check_image(pf["image"]),
        "model": check_model(plan["model_path"], pf["model_optional"], files),
        "gpus": (check_gpus(sum(i["gpus_per_node"] for i in insts), pf["min_gpu_free_fraction"])
                 if not gpus_why else [NA, gpus_why]),
        "ib": check_ib(ib, pf.get("gid_index")),
        **({"fabric": check_fabric(fabric)} if pf.get("fabric") else {}),
        "peer_memory": (check_peer_memory() if rdma and not gpus_why else
                        [NA, "no RDMA transfers between GPUs here (" +
                         ("no IB devices configured)" if not rdma else gpus_why + ")")]),
        "shm": check_shm("/dev/shm", pf["min_shm_bytes"]),
        "memlock": check_memlock(rdma),
        "ports": check_ports(node_ports(plan, component, nodeid)),
    }
    report = {"node": node, "component": component, "nodeid": nodeid,
              "instances": [i["name"] for i in insts], "checks": checks, "model_files": files,
              "mode": "srun", **({"fabric": fabric} if fabric else {})}
    _mpi_clock(report)
    report["time"] = time.time()
    return report


def node_instances(plan: dict, component: int, nodeid: int) -> list:
    return [i for i in plan["instances"] if i["component"] == component
            and i["node_offset"] <= nodeid < i["node_offset"] + i["nodes"]]


def node_ports(plan: dict, component: int, nodeid: int) -> list:
    """(port, what binds it) for every port the plan binds on this node."""
    out = {}
    for i in node_instances(plan, component, nodeid):
        for kind, port in [("http", i["port"]), *sorted(i["ports"].items())]:
            out.setdefault(port, f"{i['name']} {kind}")
    r = plan.get("router")
    if r and r["component"] == component and r["node_offset"] == nodeid:
        out.setdefault(r["port"], "router")
        out.setdefault(r["prometheus_port"], "router metrics")
    return sorted(out.items())


def check_tools(tools: list) -> list:
    missing = [t for t in tools if not (os.access(t, os.X_OK) if "/" in t else shutil.which(t))]
    if missing:
        return [FAIL, f"not found on this node: {', '.join(missing)}"]
    return [OK, ", ".join(tools)]


def check_image(image: dict | None) -> list:
    if not image:
        return [NA, "no container runtime"]
    if "path" not in image:
        return [NA, image["note"]]
    p = image["path"]
    if os.path.isfile(p) and os.access(p, os.R_OK):
        return [OK, f"{p} ({os.path.getsize(p) / GIB:.1f} GiB)"]
    return [FAIL, f"image {p} is {'not readable' if os.path.exists(p) else 'not there'} on "
                  "this node"]


def check_model(path: str, optional: str | None, files: list) -> list:
    """Every file under the model path (dot-files aside) with its size, into `files`."""
    if not os.path.exists(path):
        if optional:
            return [NA, f"{path} is not there; {optional}"]
        return [FAIL, f"model path {path} is not there on this node"]
    unreadable = []
    if os.path.isfile(path):
        entries = [(os.path.basename(path), path)]
    else:
        try:
            entries = model_files(path)
        except TooManyFiles as e:
            return [FAIL, str(e)]
    for rel, full in entries:
        try:
            files.append([rel, os.path.getsize(full)])
        except OSError:
            unreadable.append(rel)
            continue
        if not os.access(full, os.R_OK):
            unreadable.append(rel)
    if unreadable:
        return [FAIL, f"{len(unreadable)} model file(s) not readable here, e.g. {unreadable[0]}"]
    if not files:
        return [FAIL, f"model path {path} holds no files on this node"]
    total = sum(s for _, s in files)
    return [OK, f"{len(files)} files, {total / 1e9:.1f} GB"]


def check_gpus(need: int, min_free: float) -> list:
    if need == 0:
        return [NA, "no engine on this node uses GPUs"]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.total,memory.free",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [FAIL, f"needs {need} GPUs; nvidia-smi did not run: {e}"]
    rows = [[x.strip() for x in ln.split(",")] for ln in out.stdout.splitlines() if ln.strip()]
    if out.returncode != 0 or not rows:
        return [FAIL, f"needs {need} GPUs; nvidia-smi: {(out.stderr or out.stdout).strip()[:200]}"]
    if len(rows) < need:
        return [FAIL, f"needs {need} GPUs, nvidia-smi shows {len(rows)}"]
    for idx, total, free in rows:
        if float(free) < min_free * float(total):
            return [FAIL, f"GPU {idx}: {float(free):,.0f} of {float(total):,.0f} MiB free (under "
                          f"{min_free:.0%}: another process holds it)"]
    return [OK, f"{len(rows)} GPUs, each at least {min_free:.0%} free"]


NO_UUID = "00000000-0000-0000-0000-000000000000"


def check_fabric(found: dict) -> list:
    """This node's NVLink fabric, from `nvidia-smi -q`'s Fabric section of every GPU: each
    registered (State Completed, Status Success) in one fabric, whose ClusterUUID and CliqueId
    go into `found` for the comparison between an instance's nodes."""
    try:
        out = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [FAIL, f"nvidia-smi -q did not run: {e}"]
    gpus = fabric_sections(out.stdout)
    if out.returncode != 0 or not gpus:
        return [FAIL, f"nvidia-smi -q: {(out.stderr or out.stdout).strip()[:200] or 'no GPU'}"]
    ids = set()
    for bus, f in gpus:
        if not f:
            return [FAIL, f"GPU {bus} reports no NVLink fabric (no Fabric section)"]
        if f.get("State") != "Completed" or f.get("Status") != "Success":
            return [FAIL, f"GPU {bus}: fabric State {f.get('State')}, Status {f.get('Status')} "
                          "(not registered with the NVLink fabric: see the fabric manager)"]
        if f.get("ClusterUUID", NO_UUID) in (NO_UUID, "N/A"):
            return [FAIL, f"GPU {bus}: no fabric ClusterUUID ({f.get('ClusterUUID')})"]
        ids.add((f["ClusterUUID"], f.get("CliqueId")))
    if len(ids) > 1:
        return [FAIL, "this node's GPUs are in " + " and ".join(
            f"ClusterUUID {u} CliqueId {c}" for u, c in sorted(ids))]
    uuid, clique = ids.pop()
    found.update(cluster_uuid=uuid, clique_id=clique)
    return [OK, f"{len(gpus)} GPUs in ClusterUUID {uuid} CliqueId {clique}"]


def fabric_sections(text: str) -> list:
    """[(GPU bus id, {State, Status, CliqueId, ClusterUUID} or {})] from `nvidia-smi -q`: a GPU
    starts at a "GPU <bus id>" line, its Fabric section is the "Fabric" line and the deeper
    indented "key : value" lines after it (its Health subsection included, not kept)."""
    gpus: list = []
    depth = None  # the Fabric line's indentation while inside it
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        words = line.strip()
        if indent == 0 and words.startswith("GPU "):
            gpus.append((words[4:], {}))
            depth = None
        elif gpus and words == "Fabric":
            depth = indent
        elif depth is not None and words and indent > depth:
            key, sep, value = words.partition(":")
            if sep and key.strip() in ("State", "Status", "CliqueId", "ClusterUUID"):
                gpus[-1][1].setdefault(key.strip(), value.strip())
        elif words:
            depth = None
    return gpus


def check_ib(devices, gid_index: int | None, root: str = "/sys/class/infiniband") -> list:
    if not devices:
        return [NA, "no IB devices configured (KV and NCCL traffic over TCP)"]
    if devices == "auto":
        found = []
        try:
            found = sorted(os.listdir(root))
        except OSError:
            pass
        devices = [d for d in found if "ACTIVE" in _port_state(root, d, "1")] or found
        if not devices:
            return [FAIL, f"ib_devices is auto and {root} lists no device"]
    bad, shown = [], []
    for spec in devices:
        dev, _, port = spec.partition(":")
        port = port or "1"
        state = _port_state(root, dev, port)
        if not state:
            bad.append(f"{dev} port {port}: no such device or port")
            continue
        if "ACTIVE" not in state:
            bad.append(f"{dev} port {port}: {state.split(':')[-1].strip()}")
            continue
        if gid_index is not None and not _gid(root, dev, port, gid_index):
            bad.append(f"{dev} port {port}: no GID at index {gid_index}")
            continue
        shown.append(f"{dev}:{port}")
    if bad:
        return [FAIL, "; ".join(bad)]
    return [OK, ", ".join(shown) + " active" +
            (f", GID index {gid_index} set" if gid_index is not None else "")]


def _port_state(root: str, dev: str, port: str) -> str:
    try:
        with open(os.path.join(root, dev, "ports", port, "state")) as f:
            return f.read().strip()
    except OSError:
        return ""


def _gid(root: str, dev: str, port: str, index: int) -> bool:
    try:
        with open(os.path.join(root, dev, "ports", port, "gids", str(index))) as f:
            return f.read().strip().replace("0", "").replace(":", "") != ""
    except OSError:
        return False


def check_peer_memory(sysmod: str = "/sys/module") -> list:
    """GPUDirect RDMA: the NIC reads GPU memory through nvidia_peermem (nv_peer_mem before it)
    or DMA-BUF (Linux 5.12+ with NVIDIA's open kernel modules)."""
    for mod in ("nvidia_peermem", "nv_peer_mem"):
        if os.path.isdir(os.path.join(sysmod, mod)):
            return [OK, f"{mod} loaded"]
    kernel = os.uname().release
    try:
        major, minor = (int(x) for x in kernel.split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    try:
        with open("/proc/driver/nvidia/version") as f:
            open_module = "Open Kernel Module" in f.read()
    except OSError:
        open_module = False
    if (major, minor) >= (5, 12) and open_module:
        return [OK, f"DMA-BUF (Linux {kernel}, NVIDIA open kernel module)"]
    return [FAIL, "neither nvidia_peermem is loaded nor DMA-BUF usable (Linux 5.12+ and NVIDIA's "
                  "open kernel module): RDMA cannot reach GPU memory and KV transfer fails"]


def check_shm(path: str, min_bytes: int) -> list:
    try:
        st = os.statvfs(path)
    except OSError as e:
        return [FAIL, f"{path}: {e.strerror}"]
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    if size < min_bytes:
        return [FAIL, f"{path} is {size / GIB:.2f} GiB, under the {min_bytes / GIB:g} GiB NCCL "
                      "and the engines need"]
    return [OK, f"{path} {size / GIB:.1f} GiB ({free / GIB:.1f} GiB free)"]


def check_memlock(rdma: bool) -> list:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    text = "unlimited" if soft == inf else f"{soft // 1024} KiB"
    if not rdma:
        return [NA, f"no RDMA here (limit {text})"]
    if hard == inf:
        return [OK, f"soft {text}, hard unlimited (tasks raise it)"]
    return [FAIL, f"locked-memory limit is {text} (hard {hard // 1024} KiB): RDMA registers "
                  "GPU and host buffers and needs it unlimited (Slurm PropagateResourceLimits, "
                  "/etc/security/limits.conf)"]


def _holder(port: int) -> str:
    """' by process PID (comm) of Slurm job J' where /proc shows who listens on the port: on a
    shared node that is most often another deployment, and its job id is what a user acts on."""
    inodes = ownport.listening_inodes(port)
    return f" by {ownport.owner_of(inodes)}" if inodes else ""


def check_ports(ports: list) -> list:
    taken = []
    for port, what in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # as the engines bind (uvicorn and the routers set SO_REUSEADDR): only a listener or a
        # live connection on the port makes it taken, not a TIME_WAIT left by an earlier run
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            taken.append(f"{port} ({what}): {e.strerror}{_holder(port)}")
        finally:
            s.close()
    if taken:
        return [FAIL, "in use on this node: " + "; ".join(taken)]
    if not ports:
        return [NA, "the plan binds no port here"]
    return [OK, "free: " + ", ".join(str(p) for p, _ in ports)]


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

def evaluate(reports: list, window: tuple, pf: dict, batch_host: str) -> dict:
    """Every node's verdicts: its own checks, the model file comparison, the clock against the
    batch host's (its report's time must fall inside the step's run on the batch host's clock,
    give or take the allowed skew), the waivers. Returns the table state.json holds."""
    reports = sorted(reports, key=lambda r: (r["component"], r["nodeid"]))  # srun's order varies
    nodes = {r["node"]: {c: list(v) for c, v in r["checks"].items()} for r in reports}
    _compare_models(reports, nodes)
    _compare_fabrics(reports, nodes)
    for r in reports:
        if "time" in r:
            nodes[r["node"]]["clock"] = _clock(r, window, pf["max_clock_skew_s"], batch_host)
    for checks in nodes.values():
        for c, v in checks.items():
            if v[0] == FAIL and c in pf["waive"]:
                v[0] = WAIVED
    failed = [[r["node"], c, nodes[r["node"]][c][1]] for r in reports for c in CHECKS
              if nodes[r["node"]].get(c, [OK])[0] == FAIL]
    shown = [c for c in CHECKS if c != "fabric" or any("fabric" in v for v in nodes.values())]
    return {"passed": not failed, "checks": shown, "waived": list(pf["waive"]),
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
