"""The preflight's checks of one node, each on its own (stdlib only): the tools the job runs,
the image, the model's files, GPUs, the NVLink fabric, IB ports and GIDs, peer memory, /dev/shm,
the memlock limit, the ports the plan binds here.

Each returns [verdict, detail]: "ok", "fail" or "n/a" (it does not apply here, with the
reason); "waived" is evaluate()'s (preflight.py), for a failure the deployment goes on after.

Apart from the driver (preflight.py: the node's report from these, and the verdicts over every
node's report on the batch host): each check reads this node alone, and is tested alone.
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess

from . import ownport
from .model_dir import TooManyFiles, model_files
from .spec import PreflightImage

OK, FAIL, NA, WAIVED = "ok", "fail", "n/a", "waived"
GIB = 1024 ** 3


def check_tools(tools: list) -> list:
    missing = [t for t in tools if not (os.access(t, os.X_OK) if "/" in t else shutil.which(t))]
    if missing:
        return [FAIL, f"not found on this node: {', '.join(missing)}"]
    return [OK, ", ".join(tools)]


def check_image(image: PreflightImage | None) -> list:
    if image is None:
        return [NA, "no container runtime"]
    if image.path is None:
        return [NA, image.note]
    p = image.path
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
