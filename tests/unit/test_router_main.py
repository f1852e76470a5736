"""hpcserve_runtime/router_main.py starts each router from its package's own launch_router
main(), without the MiniLB import that costs ~0.5 s of the router's start (sglang-router 0.3.2
and vllm-router 0.1.17, as the dev extra installs them)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from unitkit import ROOT

ROUTER_MAIN = ROOT / "hpcserve" / "runtime" / "router_main.py"
HEAVY = ("aiohttp", "fastapi", "orjson")   # what the packages' mini_lb modules import


def imported(stderr: str) -> set[str]:
    """The modules `python -X importtime` reports."""
    return {line.split("|")[-1].strip() for line in stderr.splitlines()
            if line.startswith("import time:")}


@pytest.mark.parametrize("package", ["sglang_router", "vllm_router"])
def test_the_router_parses_its_arguments_without_importing_its_mini_lb(package):
    ours = subprocess.run([sys.executable, "-X", "importtime", str(ROUTER_MAIN), package, "--help"],
                          capture_output=True, text=True, timeout=60)
    theirs = subprocess.run([sys.executable, "-X", "importtime", "-m",
                             f"{package}.launch_router", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert ours.returncode == theirs.returncode == 0, ours.stderr[-2000:]
    # The same parser (the same options; their choices' order is the Rust side's hash order)
    # under the package's name rather than the script's.
    assert ours.stdout.startswith(f"usage: {package}.launch_router ")
    options = set(re.findall(r"--[a-z0-9-]+", ours.stdout))
    assert len(options) > 50 and options == set(re.findall(r"--[a-z0-9-]+", theirs.stdout))
    assert f"{package}.router" in imported(ours.stderr)         # the Rust router's module
    assert not imported(ours.stderr) & set(HEAVY), imported(ours.stderr) & set(HEAVY)
    assert set(HEAVY) & imported(theirs.stderr)                 # what it saves


def test_a_bad_router_argument_is_refused_by_the_routers_own_parser():
    r = subprocess.run([sys.executable, str(ROUTER_MAIN), "sglang_router", "--no-such-flag"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unrecognized arguments: --no-such-flag" in r.stderr, r.stderr
