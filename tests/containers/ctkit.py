"""Helpers for the container tests: the stand-ins' environment and log, rendered job directories."""

from __future__ import annotations

import json
import resource
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpcserve.author import config, plan, render

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"
DEMO = ROOT / "examples" / "demo.yaml"
LOW_MEMLOCK = 64 * 1024  # bytes: a login node's usual soft limit, as Slurm would propagate it


# The runtimes as the golden files render them (paths as a cluster would have them).
GOLDEN_JOB_DIR = "/shared/hpcserve-jobs/demo-golden"
GOLDEN = {
    "pyxis": ["site.container.runtime=pyxis", "site.container.image=lmsysorg/sglang:v0.5.23",
              "site.container.mounts=[/lustre:/lustre]", "site.container.env=[NCCL_DEBUG]",
              "site.network.ib_devices=[mlx5_0,mlx5_1]"],
    "enroot": ["site.container.runtime=enroot",
               "site.container.image=/lustre/images/sglang-0.5.23.sqsh",
               "site.container.env=[NCCL_DEBUG]", "site.network.ib_devices=[mlx5_0,mlx5_1]"],
    "enroot-import": ["site.container.runtime=enroot",
                      "site.container.image=lmsysorg/sglang:v0.5.23"],
    "apptainer": ["site.container.runtime=apptainer",
                  "site.container.image=/shared/images/sglang-0.5.23.sif",
                  "site.container.mounts=[/shared:/shared]", "site.container.env=[NCCL_DEBUG]",
                  "site.network.ib_devices=auto"],
    "apptainer-build": ["site.container.runtime=apptainer",
                        "site.container.image=docker://lmsysorg/sglang:v0.5.23"],
    "none": [],
}


# The demo with one prefill node: what these tests check is per task, and three nodes keep the
# stand-ins' node tables and the goldens small.
DEMO_SETS = ["roles.prefill.nodes=1"]


USER = "alice"   # the cluster user: the per-user image cache's name in the goldens


def plan_for(sets: list[str]):
    return plan.build(replace(config.load(DEMO, [*DEMO_SETS, *sets]), user=USER))


@dataclass
class Fakes:
    root: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return Path(self.env["HPCSERVE_FAKE_LOG"])

    @property
    def data(self) -> Path:
        return Path(self.env["ENROOT_DATA_PATH"])

    def calls(self, tool: str | None = None) -> list[dict]:
        if not self.log.exists():
            return []
        out = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [c for c in out if tool is None or c["tool"] == tool]

    def image_env(self, values: dict[str, str]) -> None:
        p = self.root / "image-env.json"
        p.write_text(json.dumps(values))
        self.env["HPCSERVE_FAKE_IMAGE_ENV"] = str(p)

    def run(self, cmd: list[str], *, check: bool = False, timeout: float = 60,
            env: dict | None = None, low_memlock: bool = False, **kw
            ) -> subprocess.CompletedProcess:
        e = dict(self.env, **(env or {}))
        return subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout,
                              check=check, preexec_fn=_low_memlock if low_memlock else None, **kw)

    def popen(self, cmd: list[str], *, env: dict | None = None, low_memlock: bool = False,
              **kw) -> subprocess.Popen:
        e = dict(self.env, **(env or {}))
        return subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=_low_memlock if low_memlock else None, **kw)


def write_sif(path: Path) -> Path:
    """A whole SIF file, as the apptainer stand-in writes (and its exec accepts)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("fake_tools", FAKES / "fake_tools.py")
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    path.write_bytes(tools.sif_bytes(b"test image\n"))
    return path


def _low_memlock() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if hard == resource.RLIM_INFINITY or hard > LOW_MEMLOCK:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (LOW_MEMLOCK, hard))


def write_job(tmp_path: Path, sets: list[str]) -> Path:
    """Render the demo with `sets` into tmp_path/job (the model path a real directory there) and
    give every instance and the router its node table, as the runtime would."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    job = tmp_path / "job"
    p = plan_for([*sets, f"model.path={model}"])
    render.write_job(render.render_files(p, str(job)), job)
    for inst in p.instances:
        rows = [f"{r} {NODES[inst.name][r]} 127.0.0.{r + 1} lo -" for r in range(inst.nodes)]
        (job / "run" / f"{inst.name}.nodes").write_text("\n".join(rows) + "\n")
    (job / "run" / "endpoints.env").write_text(
        "PREFILL_0_IP=127.0.0.1\nDECODE_0_IP=127.0.0.1\nROUTER_IP=127.0.0.1\n")
    return job


# the demo: prefill-0 on one node, decode-0 on two (component 1), router on prefill's node 0
NODES = {"prefill-0": ["nodeP"], "decode-0": ["nodeA", "nodeB"], "router": ["nodeP"]}
