"""Where every node is: its address on the site's interface and its InfiniBand devices, found on
the node itself (one srun per het component, every node at once) with its preflight report
beside it; and, on pyxis sites, the container image imported once for every node meanwhile.

Node side: `python3 -m hpcserve_runtime discover` (cmd_discover) prints one tagged line per node.
Batch side: Discovery runs those steps and reads the lines back by node rank.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import time

from . import preflight as checks
from .contract import SpecError
from .failures import Stop
from .logs import read_from, tail
from .spec import Component, ImageImport, read as read_spec
from .state import now


# ------------------------------------------------------------------------------ on each node

def _ip_json(args: list[str]) -> list:
    try:
        out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=10)
        return json.loads(out.stdout or "[]") if out.returncode == 0 else []
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return []


def interface_address(iface: str) -> tuple[str, str]:
    """(interface, IPv4 address); `auto` is the default route's interface, else the first
    up interface that is neither loopback nor a container bridge."""
    addrs = _ip_json(["-4", "addr", "show"])
    by_name = {a.get("ifname"): a for a in addrs}
    if iface == "auto":
        routes = _ip_json(["-4", "route", "show", "default"])
        cands = [r.get("dev") for r in routes if r.get("dev")]
        cands += [a.get("ifname") for a in addrs
                  if a.get("ifname") != "lo" and "LOOPBACK" not in a.get("flags", [])
                  and not re.match(r"(docker|br-|veth|virbr|cni|flannel|cali)", a.get("ifname", ""))]
        for c in cands:
            if c in by_name and _first_v4(by_name[c]):
                return c, _first_v4(by_name[c])
        raise SystemExit("hpcserve discover: no interface with an IPv4 address found "
                         "(set site.network.interface)")
    if iface not in by_name or not _first_v4(by_name[iface]):
        known = ", ".join(sorted(n for n in by_name if n))
        raise SystemExit(f"hpcserve discover: interface {iface!r} has no IPv4 address on this "
                         f"node (interfaces with one: {known})")
    return iface, _first_v4(by_name[iface])


def _first_v4(entry: dict) -> str | None:
    for a in entry.get("addr_info", []):
        if a.get("family") == "inet" and a.get("local"):
            return a["local"]
    return None


def active_ib_devices(root: str = "/sys/class/infiniband") -> list[str]:
    out = []
    try:
        devs = sorted(os.listdir(root))
    except OSError:
        return []
    for dev in devs:
        ports = os.path.join(root, dev, "ports")
        try:
            for port in sorted(os.listdir(ports)):
                with open(os.path.join(ports, port, "state")) as f:
                    if "ACTIVE" in f.read():
                        out.append(dev)
                        break
        except OSError:
            continue
    return out


def discover_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--iface", default="auto")
    ap.add_argument("--ib", default="none")
    ap.add_argument("--component", type=int, default=0, help="this step's het-job component")
    ap.add_argument("--preflight", metavar="JOB_DIR",
                    help="also run the preflight checks of JOB_DIR/plan.json on this node")


def main(argv: list[str]) -> int:
    """`python3 -m hpcserve_runtime discover ...` without the orchestrator's modules: every
    node's discovery step runs it, on the way to `serving`, and imports (compiles, when the
    job directory holds no bytecode yet) only what it needs."""
    ap = argparse.ArgumentParser(prog="python3 -m hpcserve_runtime discover")
    discover_args(ap)
    return cmd_discover(ap.parse_args(argv))


def cmd_discover(args) -> int:
    name = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    nodeid = os.environ.get("SLURM_NODEID", "0")
    if args.preflight:
        # First, so that a node whose address cannot be found still reports its checks.
        try:
            plan = read_spec(args.preflight)
        except SpecError as e:
            raise SystemExit(f"hpcserve discover: {e}") from None
        checks.write_report(args.preflight,
                            checks.node_report(plan, args.component, int(nodeid), name))
    iface, ip = interface_address(args.iface)
    if args.ib == "auto":
        ib = active_ib_devices()
        if not ib:
            raise SystemExit("hpcserve discover: ib_devices is auto but no active InfiniBand "
                             "port was found in /sys/class/infiniband")
        ibs = ",".join(ib)
    elif args.ib == "none":
        ibs = "-"
    else:
        ibs = args.ib
    # One tagged line: stderr noise such as "srun: Step created" can never be taken for it.
    print(f"HPCSERVE-NODE {nodeid} {name} {ip} {iface} {ibs}", flush=True)
    return 0


# ------------------------------------------------------------------------- on the batch host

class Discovery:
    TIMEOUT = 120.0  # s, for all components together

    def __init__(self, job):
        self.job = job
        self.procs: dict[int, subprocess.Popen] = {}
        self.image_import: subprocess.Popen | None = None   # pyxis: the once-per-job import

    def discover(self) -> dict[int, list[list[str]]]:
        """Every node's address (and its preflight report), one srun per component at once:
        component -> [[name, ip, iface, ib]] by node rank."""
        job = self.job
        comps = job.plan.components
        outs = {}
        reports = os.path.join(job.dir, "run", "preflight")
        shutil.rmtree(reports, ignore_errors=True)  # an earlier try's reports say nothing now
        os.makedirs(reports)
        t_start = now()
        for c in comps:
            i = c.index
            # A file, not a pipe: nobody reads a pipe until srun exits, and srun blocks once the
            # pipe's 64 KiB are full (some 700 nodes' lines).
            outs[i] = os.path.join(job.dir, "run", f"discover-{i}.out")
            with open(outs[i], "wb") as out, \
                    open(os.path.join(job.dir, "logs", f"discover-{i}.log"), "ab") as err:
                self.procs[i] = subprocess.Popen(
                    ["bash", os.path.join(job.dir, "steps", f"discover-{i}.sh")],
                    stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                    env={**os.environ, **job.allocation.env(i)})
        try:
            self._wait(comps, t_start)
        finally:
            self.stop()
        self.preflight((t_start, now()))
        return {c.index: self._rows(c, outs[c.index]) for c in comps}

    def _wait(self, comps: list, t_start: float) -> None:
        deadline = now() + self.TIMEOUT
        while True:
            # a component that failed ends discovery at once, whatever the others do
            bad = [c for c in comps if self.procs[c.index].poll() not in (None, 0)]
            if bad:
                self.preflight((t_start, now()))  # a failed check explains it best
                raise self._failed(bad[0], 0)
            running = [i for i, p in self.procs.items() if p.poll() is None]
            if not running:
                return
            if now() > deadline:
                raise Stop("failed", "address discovery on component(s) "
                                     f"{', '.join(map(str, running))} timed out after "
                                     f"{self.TIMEOUT:g} s")
            self.job.check()
            time.sleep(0.02)  # a poll() per component: cheap, and the engines wait on it

    def _rows(self, c: Component, out: str) -> list[list[str]]:
        rows = [ln.split()[1:] for ln in read_from(out).splitlines()
                if ln.startswith("HPCSERVE-NODE ") and len(ln.split()) == 6]
        if self.procs[c.index].returncode != 0 or len(rows) != c.nodes:
            raise self._failed(c, len(rows))
        rows.sort(key=lambda r: int(r[0]))
        found = [r[1:] for r in rows]  # name, ip, iface, ib
        self.job.log(f"component {c.index} ({c.name}): " +
                     ", ".join(f"{r[0]}={r[1]}" for r in found))
        return found

    def preflight(self, window: tuple) -> None:
        """The nodes' preflight reports judged together: a table in state.json and the log, and
        a Stop naming node and check for a failed one, before any engine starts."""
        job = self.job
        reports = checks.read_reports(job.dir)
        if not reports:
            return
        here = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
        result = checks.evaluate(reports, window, job.plan.preflight, here)
        result["took_s"] = round(window[1] - window[0], 3)
        job.state.update(preflight=result)
        job.log(f"preflight on {len(reports)} node(s) in {result['took_s']:.2f} s "
                f"({result['mode']}):")
        for line in checks.table_text(result):
            job.log("  " + line)
        if result["failed"]:
            raise self._preflight_failed(result, reports)

    def _preflight_failed(self, result: dict, reports: list) -> Stop:
        plan = self.job.plan
        node, check, detail = result["failed"][0]
        rep = next(r for r in reports if r["node"] == node)
        insts = checks.node_instances(plan, rep["component"], rep["nodeid"])
        comp = plan.components[rep["component"]]
        more = len(result["failed"]) - 1
        return Stop("failed", f"preflight: {check} failed on {node}: {detail}" +
                    (f" (and {more} more failed check(s): see state.json's preflight)"
                     if more else ""),
                    {"step": f"discover-{comp.index}", "reason": "preflight failed",
                     "check": check, "node": node,
                     "role": insts[0].role if insts else comp.name,
                     "instance": insts[0].index if insts else None,
                     "instances": [i.name for i in insts], "detail": detail,
                     "log": "logs/hpcserve-job.log", "failed": result["failed"]})

    def _failed(self, c: Component, nrows: int) -> Stop:
        p = self.procs[c.index]
        return Stop("failed", f"address discovery on component {c.index} ({c.name}) "
                              f"failed (exit {p.returncode}, {nrows}/{c.nodes} "
                              f"nodes); see logs/discover-{c.index}.log",
                    {"step": f"discover-{c.index}", "role": c.name,
                     "exit_code": p.returncode,
                     "log_tail": tail(os.path.join(self.job.dir, "logs",
                                                   f"discover-{c.index}.log"))})

    def stop(self) -> None:
        """TERM every discovery srun still running (srun then ends its step), KILL after 3 s."""
        live = [p for p in self.procs.values() if p.poll() is None]
        if not live:
            return
        for p in live:
            try:
                p.terminate()
            except OSError:
                pass
        end = now() + 3
        while now() < end and any(p.poll() is None for p in live):
            time.sleep(0.05)
        for p in live:
            if p.poll() is None:
                try:
                    p.kill()
                    p.wait(timeout=2)
                except (OSError, subprocess.TimeoutExpired):
                    pass

    # -- the image, imported or built once (pyxis, apptainer)
    def start_image_import(self) -> subprocess.Popen | None:
        """A registry image: import it (pyxis: the squashfs every step's --container-image names)
        or build it (apptainer: the SIF every task execs) once, here on the batch node, into the
        shared image cache, beside address discovery (the helper locks, checks and renames, so
        other jobs wanting the same image wait for it and then reuse it)."""
        imp = self.job.plan.container.import_
        if imp is None:
            return None
        self.job.log(f"importing {imp.uri} into {_target(imp)} once for every node")
        self.import_started = now()
        with open(os.path.join(self.job.dir, "logs", "import-image.log"), "ab") as log:
            self.image_import = subprocess.Popen(
                ["bash", imp.helper, *(["--owner", imp.owner] if imp.owner else []),
                 imp.uri, _target(imp)], stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True)
        return self.image_import

    def wait_image_import(self, p: subprocess.Popen | None) -> None:
        if p is None:
            return
        imp = self.job.plan.container.import_
        while p.poll() is None:
            self.job.check()
            time.sleep(0.2)
        # its own time, at most this much: it may have ended during discovery
        self.job.startup.overlap("image_import", now() - self.import_started)
        self.job.startup.mark("image_import")
        if p.returncode != 0:
            log = os.path.join(self.job.dir, "logs", "import-image.log")
            raise Stop("failed", f"importing {imp.uri} into {_target(imp)} failed (exit "
                                 f"{p.returncode}); see logs/import-image.log",
                       {"step": "import-image", "role": None, "instance": None,
                        "node": os.uname().nodename, "reason": "image import failed",
                        "exit_code": p.returncode, "log": "logs/import-image.log",
                        "log_tail": tail(log, 5)})
        self.job.log(f"image ready: {_target(imp)}")

    def stop_image_import(self) -> None:
        """An import still running when the deployment ends: TERM its process group (the
        helper and enroot under it), KILL after 3 s. Its temporary file is never the target."""
        p = self.image_import
        if p is None or p.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(p.pid, sig)
            except OSError:
                return
            try:
                p.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _target(imp: ImageImport) -> str:
    """The file an image import makes: pyxis's squashfs or apptainer's SIF."""
    return imp.sqsh or imp.sif
