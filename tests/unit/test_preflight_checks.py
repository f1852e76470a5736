"""The preflight's node checks against real files, sockets and limits, and the batch host's
verdicts over several nodes' reports (tests/jobs/test_preflight.py runs them in real jobs)."""

from __future__ import annotations

import resource
import socket

import pytest

from hpcserve.author import config, plan
from hpcserve.errors import ConfigError
from hpcserve.runtime import preflight as pf
from hpcserve.runtime import preflight_checks as pc
from hpcserve.runtime.spec import Preflight, PreflightImage
from unitkit import write_yaml

PF = Preflight({"max_clock_skew_s": 2.0, "waive": []})


def _report(node: str, nodeid: int = 0, **checks) -> dict:
    return {"node": node, "component": 0, "nodeid": nodeid, "checks": checks,
            "model_files": [], "time": 100.5}


def test_model_lists_are_compared_and_the_odd_node_names_its_first_difference():
    ok = [pc.OK, "x"]
    files = [["config.json", 10], ["a.safetensors", 100], ["b.safetensors", 100]]
    reps = [_report(f"n{i}", i, model=ok) for i in range(4)]
    for r in reps:
        r["model_files"] = [list(f) for f in files]
    reps[2]["model_files"][1][1] = 99          # n2: a shard of another size
    reps[3]["model_files"].append(["c.bin", 1])  # n3: a file the others lack
    res = pf.evaluate(reps, (100.0, 101.0), PF, "n0")
    assert res["nodes"]["n2"]["model"] == [
        pc.FAIL, "a.safetensors is 99 bytes, not 100 from the file list 2 other node(s) see"]
    assert res["nodes"]["n3"]["model"][1].startswith("has c.bin, which the others lack")
    assert [(n, c) for n, c, _ in res["failed"]] == [("n2", "model"), ("n3", "model")]
    assert not res["passed"]


def test_a_waived_failure_is_kept_in_the_table_and_does_not_fail():
    reps = [_report("n0", ports=[pc.FAIL, "in use on this node: 8000 (router)"])]
    res = pf.evaluate(reps, (100.0, 101.0), Preflight({**PF.as_json(), "waive": ["ports"]}),
                      "n0")
    assert res["passed"] and res["nodes"]["n0"]["ports"] == [pc.WAIVED, "in use on this node: "
                                                                         "8000 (router)"]
    assert "n0 ports (waived): in use on this node: 8000 (router)" in pf.table_text(res)


def test_a_clock_outside_the_steps_run_on_the_batch_host_fails_with_its_skew():
    reps = [_report("a"), _report("b", 1), _report("c", 2)]
    reps[0]["time"], reps[1]["time"], reps[2]["time"] = 105.0, 100.5, 91.0
    res = pf.evaluate(reps, (100.0, 101.0), PF, "a")
    assert res["nodes"]["a"]["clock"] == [pc.FAIL, "clock at least 4.0 s ahead of a's "
                                                   "(allowed 2 s)"]
    assert res["nodes"]["b"]["clock"][0] == pc.OK
    assert "9.0 s behind" in res["nodes"]["c"]["clock"][1]
    reps[1]["clock_offset"] = -3.5  # measured against rank 0 under MPI
    res = pf.evaluate(reps, (100.0, 101.0), PF, "a")
    assert res["nodes"]["b"]["clock"] == [pc.FAIL, "clock -3.500 s from rank 0's of its "
                                                   "component (allowed 2 s)"]


def test_a_taken_port_is_found_and_a_free_one_is_not(tmp_path):
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    taken = s.getsockname()[1]
    try:
        got = pc.check_ports([(taken, "prefill-0 http")])
    finally:
        s.close()
    assert got[0] == pc.FAIL and f"{taken} (prefill-0 http)" in got[1]
    assert pc.check_ports([(taken, "prefill-0 http")]) == [pc.OK, f"free: {taken}"]


def test_ib_ports_and_gids_are_read_from_sysfs(tmp_path):
    for dev, state, gid in (("mlx5_0", "4: ACTIVE", "fe80:0000:0000:0000:0000:0000:0000:0001"),
                            ("mlx5_1", "1: DOWN", "0000:0000:0000:0000:0000:0000:0000:0000")):
        port = tmp_path / dev / "ports" / "1"
        (port / "gids").mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "gids" / "3").write_text(gid + "\n")
    assert pc.check_ib(["mlx5_0"], 3, str(tmp_path)) == [
        pc.OK, "mlx5_0:1 active, GID index 3 set"]
    assert pc.check_ib(["mlx5_0", "mlx5_1", "mlx5_9"], None, str(tmp_path)) == [
        pc.FAIL, "mlx5_1 port 1: DOWN; mlx5_9 port 1: no such device or port"]
    assert pc.check_ib(["mlx5_0:1"], 4, str(tmp_path))[1] == "mlx5_0 port 1: no GID at index 4"
    assert pc.check_ib(None, None)[0] == pc.NA


def test_model_shm_image_and_memlock_checks(tmp_path):
    m = tmp_path / "m"
    (m / ".cache").mkdir(parents=True)
    (m / "config.json").write_text("{}")
    (m / ".cache" / "lock").write_text("")  # dot-files differ between nodes: not compared
    files: list = []
    assert pc.check_model(str(m), None, files) == [pc.OK, "1 files, 0.0 GB"]
    assert files == [["config.json", 2]]
    assert pc.check_model(str(tmp_path / "no"), None, [])[0] == pc.FAIL
    assert pc.check_model(str(tmp_path / "no"), "simulated", [])[0] == pc.NA
    assert pc.check_shm(str(tmp_path), 1 << 60)[0] == pc.FAIL
    assert pc.check_image(PreflightImage({"path": str(m / "config.json")}))[0] == pc.OK
    assert pc.check_image(PreflightImage({"path": str(tmp_path / "x.sif")})) == [
        pc.FAIL, f"image {tmp_path / 'x.sif'} is not there on this node"]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    want = pc.OK if hard == resource.RLIM_INFINITY else pc.FAIL
    assert pc.check_memlock(True)[0] == want and pc.check_memlock(False)[0] == pc.NA


def test_an_unknown_check_to_waive_is_refused_naming_every_valid_one(tmp_path):
    f = write_yaml(tmp_path / "d.yaml", {
        "name": "x", "site": "local", "model": {"profile": "tiny-llama", "path": "/m"},
        "engine": {"simulate": True}, "roles": {"worker": {}},
        "preflight": {"waive": ["python"]}})
    with pytest.raises(ConfigError) as e:
        config.load(f)
    assert "preflight.waive" in str(e.value) and "peer_memory" in str(e.value)


def test_hpcserve_preflight_plans_the_same_allocation_for_ten_minutes(tmp_path):
    f = write_yaml(tmp_path / "d.yaml", {
        "name": "x", "site": "local", "model": {"profile": "tiny-llama", "path": "/m"},
        "engine": {"simulate": True}, "roles": {"worker": {"nodes": 2}}, "requeue": 2,
        "preflight": {"enabled": False}})
    p = plan.build(config.load(f))
    q = plan.preflight_only(p)
    assert q.preflight["only"] and q.preflight["enabled"] and q.requeue == 0
    d = dict(q.components[0].directives)
    assert d["time"] == "00:10:00" and "no-requeue" in d and "requeue" not in d
    assert d["nodes"] == dict(p.components[0].directives)["nodes"]
