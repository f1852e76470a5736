#!/usr/bin/env python3
"""Staging a model directory to 4 nodes (model.stage), on the local Slurm cluster (needs root;
starts and stops its own cluster):

    .venv/bin/python bench/bench_stage.py [runs] [MiB] [--shared-mibps B]

Three ways, alternately in each of `runs` rounds (default 5) inside one 4-node allocation, each
timed as the whole srun step (process start to exit), the model's pages dropped from the page
cache before each (posix_fadvise DONTNEED on every file: the shared path is read cold):
  own:   each node copies the directory from the shared path on its own (`cp -r`), at once;
  chain: hpcserve's stage step (hpcserve_runtime/stage.py): one node reads, the others get it
         node to node over TCP, each hashing what it writes against the manifest;
  mpi:   an MPI broadcast (mpi4py, srun --mpi=pmix): rank 0 reads 4 MiB chunks, comm.Bcast to
         every rank, each writes and hashes.
Reported: median seconds of each, its ratio to `own` measured in the same run, and the bytes read
from the shared path. The model: 4 files of MiB/4 (default 512 MiB in all), random bytes. Each
node's stage directory is its own (its slurmd in a private mount namespace, bind-mounted).

--shared-mibps B emulates a parallel file system whose bandwidth, B MiB/s, all readers share:
the model lives on an ext4 image on a loop device whose reads the kernel throttles to B MiB/s
(cgroup v1 blkio.throttle.read_bps_device), and each node mounts it read-only through a loop
device of its own (direct I/O onto the throttled one), so each node has its own page cache, as
separate machines do, while every byte any node reads from the shared path passes the one
throttle. Without it the shared path is this host's disk, read through one page cache.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hpcserve.runtime.stage_link import new_key  # noqa: E402

BASE = Path("/tmp/hpcserve-bench-stage")
NODES = ("node1", "node2", "node3", "node4")

MPI_BCAST = r"""
import hashlib, os, sys, time
from mpi4py import MPI
src, dst = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
names = sorted(os.listdir(src)) if comm.rank == 0 else None
names = comm.bcast(names, root=0)
read = 0
for n in names:
    size = comm.bcast(os.path.getsize(os.path.join(src, n)) if comm.rank == 0 else None, root=0)
    h = hashlib.sha256()
    f = open(os.path.join(src, n), "rb") if comm.rank == 0 else None
    os.makedirs(dst, exist_ok=True)
    with open(os.path.join(dst, n), "wb") as w:
        left = size
        while left:
            k = min(left, 1 << 22)
            buf = bytearray(f.read(k)) if comm.rank == 0 else bytearray(k)
            read += len(buf) if comm.rank == 0 else 0
            comm.Bcast(buf, root=0)
            h.update(buf)
            w.write(buf)
            left -= k
    digests = comm.gather(h.hexdigest(), root=0)
    if comm.rank == 0 and len(set(digests)) != 1:
        sys.exit("digests differ")
if comm.rank == 0:
    print("READ", read)
"""


def drop_cache(model: Path) -> None:
    for f in sorted(model.rglob("*")):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class SharedFS:
    """The model on a throttled loop device, mounted once per node (see the module's text)."""

    THROTTLE = "/sys/fs/cgroup/blkio/blkio.throttle.read_bps_device"

    def __init__(self, base: Path, mibps: int) -> None:
        self.base, self.mibps = base, mibps
        self.devices: list = []
        self.mounts: list = []

    def _sh(self, *argv: str) -> str:
        return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()

    def create(self, mib: int, fill) -> None:
        """An ext4 image holding the model (written by `fill(directory)`), then one read-only
        mount per node under base/shared/NODE, all reads throttled on the image's device."""
        image = self.base / "shared.img"
        self._sh("truncate", "-s", f"{mib + 64 + mib // 8}M", str(image))
        self._sh("mkfs.ext4", "-q", "-F", str(image))
        self.devices.append(self._sh("losetup", "-f", "--show", str(image)))
        writer = self.base / "shared-write"
        writer.mkdir()
        self._mount(self.devices[0], writer, "rw")
        shutil.rmtree(writer / "lost+found")  # mkfs's, not the model's
        fill(writer)
        self._umount(writer)
        majmin = self._sh("lsblk", "-dno", "MAJ:MIN", self.devices[0]).strip()
        Path(self.THROTTLE).write_text(f"{majmin} {self.mibps << 20}\n")
        self.majmin = majmin
        for n in NODES:
            dev = self._sh("losetup", "-f", "--show", "-r", "--direct-io=on", self.devices[0])
            self.devices.append(dev)
            (self.base / "shared" / n).mkdir(parents=True)
            self._mount(dev, self.base / "shared" / n, "ro,noload")

    def node_dir(self, node: str) -> Path:
        return self.base / "shared" / node

    def _mount(self, dev: str, at: Path, opts: str) -> None:
        self._sh("mount", "-o", opts, dev, str(at))
        self.mounts.append(at)

    def _umount(self, at: Path) -> None:
        self._sh("umount", str(at))
        self.mounts.remove(at)

    def remove(self) -> None:
        for at in list(self.mounts):
            subprocess.run(["umount", str(at)], check=False)
        if getattr(self, "majmin", None):
            Path(self.THROTTLE).write_text(f"{self.majmin} 0\n")
        for dev in reversed(self.devices):
            subprocess.run(["losetup", "-d", dev], check=False)


def timed(argv: list, env: dict) -> tuple:
    t = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
    return took, p.stdout


def inner(job_dir: str, model: str, stage_dir: str, runs: int, caches: list) -> None:
    """In the allocation: the three ways, `runs` rounds. `caches`: the directories whose page
    cache is the shared path's (one per node with --shared-mibps)."""
    env = dict(os.environ)
    srun = ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--overlap"]
    total = sum(f.stat().st_size for f in Path(model).rglob("*") if f.is_file())
    lines = subprocess.run(srun + ["bash", "-c", f"cd {job_dir} && python3 -m hpcserve_runtime "
                                                 "discover --iface eth0"],
                           env=env, capture_output=True, text=True, check=True).stdout
    rows = sorted(ln.split()[1:4] for ln in lines.splitlines() if ln.startswith("HPCSERVE-NODE"))
    chain = "".join(f"{r[1]} {r[2]}\n" for r in sorted(rows, key=lambda r: int(r[0])))
    mpi_py = os.path.join(job_dir, "bcast.py")
    Path(mpi_py).write_text(MPI_BCAST)
    clear = srun + ["bash", "-c", f"rm -rf {stage_dir}/* {stage_dir}/.[!.]*"]
    out = {"own": [], "chain": [], "mpi": [], "read": {}}
    for _ in range(runs):
        for way in ("own", "chain", "mpi"):
            subprocess.run(clear, env=env, check=True)
            for c in caches:
                drop_cache(Path(c))
            if way == "own":
                t, _ = timed(srun + ["cp", "-r", model, f"{stage_dir}/own"], env)
                out["read"]["own"] = 4 * total
            elif way == "chain":
                run = os.path.join(job_dir, "run", "stage")
                shutil.rmtree(run, ignore_errors=True)
                os.makedirs(run, mode=0o700)
                new_key(os.path.join(run, "key"))  # as the batch side makes it (stage_batch.py)
                Path(run, "chain").write_text(chain)
                t, _ = timed(["bash", os.path.join(job_dir, "steps", "stage-0.sh")], env)
                reps = [json.load(open(p)) for p in Path(run, "report").glob("*.json")]
                assert len(reps) == 4 and all(r["outcome"] == "copied" for r in reps), reps
                out["read"]["chain"] = sum(r["read_shared"] for r in reps)
            else:
                t, text = timed(srun + ["--mpi=pmix", sys.executable, mpi_py, model,
                                        f"{stage_dir}/mpi"], env)
                out["read"]["mpi"] = int(text.split("READ")[1].split()[0])
            out[way].append(t)
    out["model_bytes"] = total
    print("RESULT " + json.dumps(out))


def main() -> None:
    if sys.argv[1:2] == ["--inner"]:
        return inner(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]),
                     sys.argv[6].split(","))
    from hpcserve.author import config, plan
    from hpcserve.devcluster.cluster import DevCluster
    from hpcserve.author.render import render_files, write_job
    args = sys.argv[1:]
    mibps = 0
    if "--shared-mibps" in args:
        i = args.index("--shared-mibps")
        mibps = int(args[i + 1])
        del args[i:i + 2]
    # SIGTERM (timeout, kill) ends through the `finally` below: the cluster, mounts, loop
    # devices and the throttle are this run's and go with it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = int(args[0]) if args else 5
    mib = int(args[1]) if len(args) > 1 else 512
    cluster = DevCluster(str(BASE / "cluster"), nodes=4, subnet="10.253.9.0/24", prefix="hss",
                         pin_cpus=False)
    cluster.down()
    cluster.up()
    env = cluster.client_env()
    env["PATH"] = str(Path(sys.executable).parent) + ":" + env["PATH"]
    shared = SharedFS(BASE, mibps)
    try:
        model, stage_dir = BASE / "model", BASE / "stage"
        model.mkdir(parents=True, exist_ok=True)
        stage_dir.mkdir(exist_ok=True)

        def fill(directory: Path) -> None:
            for i in range(4):
                with open(directory / f"model-{i + 1:05d}-of-00004.safetensors", "wb") as f:
                    for _ in range(mib // 4):
                        f.write(os.urandom(1 << 20))
        if mibps:
            shared.create(mib, fill)
            caches = [str(shared.node_dir(n)) for n in NODES]
        else:
            fill(model)
            caches = [str(model)]
        for n in NODES:
            (BASE / "local" / n).mkdir(parents=True, exist_ok=True)
            binds = {str(stage_dir): str(BASE / "local" / n)}
            if mibps:
                binds[str(model)] = str(shared.node_dir(n))
            cluster.crash_node(n)
            cluster.restart_node(n, binds=binds)
        f = BASE / "d.yaml"
        f.write_text(json.dumps({
            "name": "bench-stage", "site": {"base": "local", "paths": {
                "stage_dir": str(stage_dir), "stage_max_gb": 100}},
            "model": {"profile": "kimi-k2-instruct", "path": str(model), "stage": True},
            "engine": {"version": "0.5.23", "simulate": True},
            "roles": {"worker": {"nodes": 2, "instances": 2}}, "time_limit": "01:00:00"}))
        job = BASE / "job"
        write_job(render_files(plan.build(config.load(f)), str(job)), job)
        p = subprocess.run(["sbatch", "--wait", "-N4", "-p", "local", "-t", "60", "-o",
                            str(BASE / "bench.out"), "--wrap",
                            f"{sys.executable} {Path(__file__).resolve()} --inner {job} {model} "
                            f"{stage_dir} {runs} {','.join(caches)}"], env=env, capture_output=True, text=True)
        text = (BASE / "bench.out").read_text()
        if p.returncode != 0 or "RESULT " not in text:
            raise SystemExit(f"the bench job failed: {p.stderr}{text[-3000:]}")
        res = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
    finally:
        for n in NODES:
            cluster.crash_node(n)
        cluster.down()
        shared.remove()
        shutil.rmtree(BASE, ignore_errors=True)
    med = statistics.median
    own = med(res["own"])
    where = (f"a shared path of {mibps} MiB/s for all readers together" if mibps
             else "the shared path on this host's disk")
    print(f"model: {res['model_bytes'] / 2**20:.0f} MiB in 4 files, 4 nodes, {runs} rounds, "
          f"{where}")
    for way in ("own", "chain", "mpi"):
        m = med(res[way])
        print(f"{way:6s} {m:6.2f} s (median; min {min(res[way]):.2f}, max {max(res[way]):.2f})"
              f"  ratio to own {m / own:.2f}  shared-path bytes "
              f"{res['read'][way] / res['model_bytes']:.2f}x the model")


if __name__ == "__main__":
    main()
