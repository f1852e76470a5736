"""ib_devices: auto: the HCAs found on each node feed --disaggregation-ib-device, NCCL_IB_HCA and
UCX_NET_DEVICES (device:port) in that node's own launch, as the task computes them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from hpcserve.author import config, plan
from hpcserve.author.render import render_files, write_job

DEP = {"name": "ib", "site": {"base": "local", "network": {"interface": "auto", "ib_devices": "auto"}},
       "model": {"profile": "kimi-k2-instruct", "path": "/models/k2"}, "engine": {"simulate": True},
       "roles": {"prefill": {"nodes": 1}, "decode": {"nodes": 1}}}


def test_auto_hcas_reach_engine_flags_and_environment(tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(yaml.safe_dump(DEP))
    job = tmp_path / "job"
    write_job(render_files(plan.build(config.load(f)), str(job)), job)
    (job / "run" / "prefill-0.nodes").write_text("0 n1 10.0.0.1 ib0 mlx5_0,mlx5_3\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    # (the launch script's background port-owner check is a python3 call too: not the engine)
    (bindir / "python3").write_text('#!/bin/sh\ncase "$3" in *hpcserve_runtime/ownport.py) exit 0;; esac\n'
                                    'env > "$OUT.env"\nprintf "%s\\n" "$@" > "$OUT.argv"\n')
    (bindir / "python3").chmod(0o755)
    out = tmp_path / "engine"
    subprocess.run(["bash", str(job / "launch" / "prefill-0.sh")], check=True,
                   env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
                        "SLURMD_NODENAME": "n1", "OUT": str(out)})
    env = dict(ln.split("=", 1) for ln in Path(f"{out}.env").read_text().splitlines() if "=" in ln)
    argv = Path(f"{out}.argv").read_text().splitlines()
    assert argv[argv.index("--disaggregation-ib-device") + 1] == "mlx5_0,mlx5_3"
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_3"
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1,mlx5_3:1"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert "MC_FORCE_TCP" not in env  # HCAs present: Mooncake uses RDMA
