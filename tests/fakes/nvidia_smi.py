"""A strict stand-in for nvidia-smi on the nodes of the local test cluster, which have no GPU.

It answers the two forms hpcserve's preflight runs, in the real tool's output format:
- `nvidia-smi -q` (`--query`): the NVSMI log with each GPU's section, its Fabric block as drivers
  of GB200 NVL72 systems print it (State, Status, CliqueId, ClusterUUID, then Health), the layout
  shown in NVIDIA/gpu-operator#2511 and kubernetes-sigs/dra-driver-nvidia-gpu#626;
- `nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]`.
It rejects what the real one rejects with its message and return code 2 ("A supplied argument or
flag is invalid", nvidia-smi(1) RETURN VALUE): an unknown option, -q with --query-gpu, -L with
-q, --query-gpu without --format, an unknown field. Options the real tool has and this one does
not emulate fail too, with a message starting "stricter than nvidia-smi".

Configured by $HPCSERVE_FAKE_NVIDIA_SMI, a JSON file: {"gpus": 4, "product": ..., "memory_mib":
..., "nodes": {NODE: {"cluster_uuid": ..., "clique_id": ..., "state": ..., "status": ...,
"gpu": {"INDEX": {same keys}}}}, "default": {...}}; NODE is $SLURMD_NODENAME (each node of the
test cluster has the same host name), else the host name. A node with no entry and no default has
no GPU: "No devices were found", return code 6 as the real tool. A node entry of {"fabric": false}
has GPUs without a Fabric block (drivers and GPUs without multi-node NVLink).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import zlib

INVALID = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
BUS_IDS = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0",
           "00000028:01:00.0", "00000029:01:00.0", "00000038:01:00.0", "00000039:01:00.0")
FIELDS = ("index", "name", "uuid", "pci.bus_id", "memory.total", "memory.free", "memory.used",
          "fabric.state", "fabric.status", "fabric.cliqueId", "fabric.clusterUuid")
COL = 55  # where the colons stand in -q's output (drivers 570+; older ones use a narrower column)


class Bad(Exception):
    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.message, self.code = message, code


def parse(argv: list[str]) -> dict:
    """The options: -q/--query, --query-gpu=, --format=, -L/--list-gpus."""
    opts: dict = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, value = a.partition("=")
        if a in ("-q", "--query"):
            opts["query"] = True
        elif a in ("-L", "--list-gpus"):
            opts["list"] = True
        elif name in ("--query-gpu", "--format"):
            if not eq:
                i += 1
                if i == len(argv):
                    raise Bad(INVALID)
                value = argv[i]
            opts[name[2:]] = value
        elif a in ("-d", "--display", "-i", "--id", "-f", "--filename", "-l", "--loop", "-x",
                   "--xml-format", "-u", "--unit") or name in ("--display", "--id", "--filename",
                                                                "--loop"):
            raise Bad(f"stricter than nvidia-smi: {a} is not emulated by the stand-in", 2)
        else:
            raise Bad(f"ERROR: Option {a} is not recognized. Please run 'nvidia-smi -h'.")
        i += 1
    forms = [k for k in ("query", "query-gpu", "list") if k in opts]
    if len(forms) != 1 or ("format" in opts) != ("query-gpu" in opts):
        raise Bad(INVALID)
    return opts


def gpus() -> list[dict]:
    """This node's GPUs, each with its fabric values."""
    path = os.environ.get("HPCSERVE_FAKE_NVIDIA_SMI")
    if not path:
        raise Bad("stricter than nvidia-smi: HPCSERVE_FAKE_NVIDIA_SMI (the stand-in's "
                  "configuration file) is not set", 1)
    with open(path) as f:
        conf = json.load(f)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    mine = conf.get("nodes", {}).get(node, conf.get("default"))
    if mine is None:
        raise Bad("No devices were found", 6)
    out = []
    for i in range(conf.get("gpus", 4)):
        g = {**mine, **mine.get("gpu", {}).get(str(i), {})}
        out.append({"index": i, "bus": BUS_IDS[i], "name": conf.get("product", "NVIDIA GB200"),
                    "uuid": f"GPU-{zlib.crc32(node.encode()):08x}-0000-0000-0000-{i:012x}",
                    "total": conf.get("memory_mib", 189471), "used": g.get("used_mib", 1),
                    "fabric": g.get("fabric", True), "state": g.get("state", "Completed"),
                    "status": g.get("status", "Success"), "clique": g.get("clique_id", 1),
                    "cluster": g.get("cluster_uuid", "00000000-0000-0000-0000-000000000000")})
    return out


def line(indent: int, key: str, value) -> str:
    return f"{' ' * indent}{key:<{COL - indent}}: {value}"


def query(gs: list[dict]) -> str:
    out = ["", "==============NVSMI LOG==============", "",
           line(0, "Timestamp", time.strftime("%a %b %e %H:%M:%S %Y")),
           line(0, "Driver Version", "570.133.20"), line(0, "CUDA Version", "12.8"), "",
           line(0, "Attached GPUs", len(gs))]
    for g in gs:
        out += [f"GPU {g['bus']}", line(4, "Product Name", g["name"]),
                line(4, "Product Architecture", "Blackwell"),
                line(4, "GPU UUID", g["uuid"]), line(4, "Minor Number", g["index"])]
        if g["fabric"]:
            ok = g["state"] == "Completed"
            out += ["    Fabric", line(8, "State", g["state"]),
                    line(8, "Status", g["status"] if ok else "N/A"),
                    line(8, "CliqueId", g["clique"] if ok else "N/A"),
                    line(8, "ClusterUUID", g["cluster"] if ok else "N/A"),
                    "        Health"]
            out += [line(12, k, "N/A" if not ok else v) for k, v in (
                ("Summary", "Healthy"), ("Bandwidth", "Full"),
                ("Route Recovery in progress", "False"), ("Route Unhealthy", "False"),
                ("Access Timeout Recovery", "False"))]
        out += ["    FB Memory Usage", line(8, "Total", f"{g['total']} MiB"),
                line(8, "Used", f"{g['used']} MiB"),
                line(8, "Free", f"{g['total'] - g['used']} MiB")]
    return "\n".join(out) + "\n"


def csv(gs: list[dict], fields: str, fmt: str) -> str:
    flags = fmt.split(",")
    if flags[0] != "csv" or any(f not in ("noheader", "nounits") for f in flags[1:]):
        raise Bad(f'"{fmt}" is not a valid format. Please run \'nvidia-smi -h\' for help.')
    names = [f.strip() for f in fields.split(",")]
    for n in names:
        if n not in FIELDS:
            raise Bad(f'Field "{n}" is not a valid field to query.')
    unit = "" if "nounits" in flags else " MiB"
    value = {"index": lambda g: g["index"], "name": lambda g: g["name"],
             "uuid": lambda g: g["uuid"], "pci.bus_id": lambda g: g["bus"],
             "memory.total": lambda g: f"{g['total']}{unit}",
             "memory.free": lambda g: f"{g['total'] - g['used']}{unit}",
             "memory.used": lambda g: f"{g['used']}{unit}",
             "fabric.state": lambda g: g["state"], "fabric.status": lambda g: g["status"],
             "fabric.cliqueId": lambda g: g["clique"],
             "fabric.clusterUuid": lambda g: g["cluster"]}
    rows = [] if "noheader" in flags else [", ".join(names)]
    rows += [", ".join(str(value[n](g)) for n in names) for g in gs]
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> int:
    try:
        opts = parse(argv)
        gs = gpus()
        if "query" in opts:
            sys.stdout.write(query(gs))
        elif "list" in opts:
            sys.stdout.write("".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n"
                                     for g in gs))
        else:
            sys.stdout.write(csv(gs, opts["query-gpu"], opts["format"]))
    except Bad as e:
        print(e.message)  # the real tool writes its errors to stdout
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
