"""Address and IB discovery as the job runs it: inside the task, on each node of the real cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcserve.author.render import runtime_files
from hpcserve.runtime import discovery

pytestmark = pytest.mark.slurm


@pytest.fixture
def runtime(dev_cluster) -> list[str]:
    """The runtime as a job directory holds it, and the command that runs it there."""
    d = Path(dev_cluster.state_dir).parent / "discovery-runtime"
    for rel, (text, _mode) in runtime_files().items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    return ["--chdir", str(d), sys.executable, "-m", "hpcserve_runtime"]


@pytest.mark.parametrize("iface", ["eth0", "auto"])
def test_each_node_reports_its_own_address(dev_cluster, runtime, iface):
    # one srun over all four nodes: each task prints its own line (no srun per lookup)
    out = subprocess.run(["srun", "-N4", "--ntasks-per-node=1", *runtime,
                          "discover", "--iface", iface, "--ib", "none"],
                         env=dev_cluster.client_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = sorted(ln.split()[2:5] for ln in out.stdout.splitlines() if ln.startswith("HPCSERVE-NODE"))
    addrs = dev_cluster.node_addresses()
    assert rows == sorted([n, addrs[n], "eth0"] for n in addrs)


def test_a_missing_interface_is_an_error_naming_the_ones_there(dev_cluster, runtime):
    out = subprocess.run(["srun", "-N1", *runtime, "discover", "--iface", "ib0"],
                         env=dev_cluster.client_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "interface 'ib0' has no IPv4 address" in out.stderr and "eth0" in out.stderr


def test_active_ib_ports_are_found_in_sysfs(tmp_path):
    for dev, states in {"mlx5_0": ["4: ACTIVE"], "mlx5_1": ["1: DOWN"],
                        "mlx5_2": ["1: DOWN", "4: ACTIVE"]}.items():
        for port, st in enumerate(states, 1):
            d = tmp_path / dev / "ports" / str(port)
            d.mkdir(parents=True)
            (d / "state").write_text(st + "\n")
    assert discovery.active_ib_devices(str(tmp_path)) == ["mlx5_0", "mlx5_2"]
    assert discovery.active_ib_devices(str(tmp_path / "none")) == []
