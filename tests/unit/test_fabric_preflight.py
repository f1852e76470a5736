"""The preflight's NVLink fabric check: each node's `nvidia-smi -q` Fabric blocks (read from the
strict stand-in, tests/fakes/nvidia_smi.py, configured per node), and the batch host's verdict
that every node of an instance is in its leader's fabric."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpcserve.runtime import preflight as pf
from hpcserve.runtime import preflight_checks as pc
from hpcserve.runtime.spec import Preflight
from unitkit import ROOT

FAKES = ROOT / "tests" / "fakes" / "bin"
UUID_A = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
UUID_B = "dc6e40c4-d722-4357-9ba6-5291dd461278"
PF = Preflight({"max_clock_skew_s": 2.0, "waive": []})


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """Configure the stand-in (node -> its GPUs' fabric) and put it first on PATH."""
    conf = tmp_path / "nvidia-smi.json"
    monkeypatch.setenv("PATH", f"{FAKES}:{Path('/usr/bin')}:{Path('/bin')}")
    monkeypatch.setenv("HPCSERVE_FAKE_NVIDIA_SMI", str(conf))

    def configure(node: str, nodes: dict) -> None:
        conf.write_text(json.dumps({"gpus": 4, "nodes": nodes}))
        monkeypatch.setenv("SLURMD_NODENAME", node)
    return configure


def test_a_node_whose_gpus_share_one_registered_fabric_passes_and_reports_it(smi):
    smi("n1", {"n1": {"cluster_uuid": UUID_A, "clique_id": 4026}})
    found: dict = {}
    assert pc.check_fabric(found) == [pc.OK, f"4 GPUs in ClusterUUID {UUID_A} CliqueId 4026"]
    assert found == {"cluster_uuid": UUID_A, "clique_id": "4026"}


@pytest.mark.parametrize("node, want", [
    ({"state": "In Progress"}, "GPU 00000008:01:00.0: fabric State In Progress, Status N/A"),
    ({"cluster_uuid": UUID_A, "status": "Insufficient Resources"},
     "fabric State Completed, Status Insufficient Resources"),
    ({}, "GPU 00000008:01:00.0: no fabric ClusterUUID (00000000-0000-0000-0000-000000000000)"),
    ({"fabric": False}, "GPU 00000008:01:00.0 reports no NVLink fabric (no Fabric section)"),
    ({"cluster_uuid": UUID_A, "gpu": {"3": {"cluster_uuid": UUID_B}}},
     f"this node's GPUs are in ClusterUUID {UUID_A} CliqueId 1 and ClusterUUID {UUID_B}"),
], ids=["in-progress", "status", "zero-uuid", "no-fabric", "gpus-differ"])
def test_a_node_off_its_fabric_fails_saying_how(smi, node, want):
    smi("n1", {"n1": node})
    found: dict = {}
    verdict, detail = pc.check_fabric(found)
    assert verdict == pc.FAIL and want in detail, detail
    assert found == {}


def test_a_node_without_gpus_fails_with_nvidia_smis_words(smi):
    smi("n9", {"n1": {"cluster_uuid": UUID_A}})
    assert pc.check_fabric({}) == [pc.FAIL, "nvidia-smi -q: No devices were found"]


def test_the_fabric_block_is_read_at_any_column_width():
    """Drivers before 570 put the colons at column 42, and an H100 prints N/A throughout."""
    older = ("GPU 00000000:1B:00.0\n    Product Name                      : NVIDIA GB200\n"
             "    Fabric\n        State                             : Completed\n"
             "        Status                            : Success\n"
             "        CliqueId                          : 2\n"
             f"        ClusterUUID                       : {UUID_B}\n        Health\n"
             "            Summary                       : Unhealthy\n"
             "    Conf Compute Protected Memory Usage\n        Total : 0 MiB\n"
             "GPU 00000000:1C:00.0\n    Fabric\n        State : N/A\n        Status : N/A\n")
    assert pc.fabric_sections(older) == [
        ("00000000:1B:00.0", {"State": "Completed", "Status": "Success", "CliqueId": "2",
                              "ClusterUUID": UUID_B}),
        ("00000000:1C:00.0", {"State": "N/A", "Status": "N/A"})]


def _report(node: str, nodeid: int, inst: list, fabric: tuple | None) -> dict:
    r = {"node": node, "component": 0, "nodeid": nodeid, "instances": inst, "model_files": [],
         "checks": {"fabric": [pc.OK, "x"] if fabric else [pc.FAIL, "no fabric"]},
         "time": 100.5}
    if fabric:
        r["fabric"] = {"cluster_uuid": fabric[0], "clique_id": fabric[1]}
    return r


def test_an_instance_spanning_two_domains_fails_naming_the_node_and_both_fabrics():
    reps = [_report("n1", 0, ["decode-0"], (UUID_A, "1")),
            _report("n2", 1, ["decode-0"], (UUID_A, "1")),
            _report("n3", 2, ["decode-1"], (UUID_A, "1")),
            _report("n4", 3, ["decode-1"], (UUID_B, "1"))]
    res = pf.evaluate(list(reversed(reps)), (100.0, 101.0), PF, "n1")
    assert not res["passed"] and [(n, c) for n, c, _ in res["failed"]] == [("n4", "fabric")]
    assert res["nodes"]["n4"]["fabric"][1] == (
        f"decode-1 spans two NVLink domains: n4 is in ClusterUUID {UUID_B} CliqueId 1, its "
        f"leader n3 in ClusterUUID {UUID_A} CliqueId 1")
    assert [res["nodes"][n]["fabric"][0] for n in ("n1", "n2", "n3")] == [pc.OK] * 3
    assert "fabric" in res["checks"]
    reps[3]["fabric"]["cluster_uuid"] = UUID_A  # one clique of another cluster: still apart
    reps[3]["fabric"]["clique_id"] = "2"
    res = pf.evaluate(reps, (100.0, 101.0), PF, "n1")
    assert "n4 is in ClusterUUID " + UUID_A + " CliqueId 2" in res["nodes"]["n4"]["fabric"][1]


def test_the_fabric_column_is_shown_only_where_a_node_checked_it():
    rep = _report("n1", 0, ["worker-0"], None)
    del rep["checks"]["fabric"]
    assert "fabric" not in pf.evaluate([rep], (100.0, 101.0), PF, "n1")["checks"]


@pytest.mark.parametrize("argv, code, out", [
    (["--bogus"], 2, "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h'."),
    (["-q", "-L"], 2, "Invalid combination of input arguments"),
    (["-q", "--query-gpu=index", "--format=csv"], 2, "Invalid combination"),
    (["--query-gpu=index"], 2, "Invalid combination"),
    (["--query-gpu=index,bogus", "--format=csv"], 2,
     'Field "bogus" is not a valid field to query.'),
    (["-q", "-d", "FABRIC"], 2, "stricter than nvidia-smi: -d is not emulated"),
])
def test_the_stand_in_refuses_what_nvidia_smi_refuses(smi, argv, code, out):
    smi("n1", {"n1": {"cluster_uuid": UUID_A}})
    p = subprocess.run([str(FAKES / "nvidia-smi"), *argv], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == code and out in p.stdout, (p.returncode, p.stdout, p.stderr)


def test_the_stand_in_answers_the_gpu_checks_query_too(smi):
    smi("n1", {"n1": {"cluster_uuid": UUID_A, "used_mib": 100000}})
    verdict, detail = pc.check_gpus(4, 0.9)
    assert verdict == pc.FAIL and "GPU 0: 89,471 of 189,471 MiB free" in detail
