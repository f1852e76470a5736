"""Serving that heals, on the real test cluster with the real sglang-router: one failed, hung or
node-lost instance is taken out of the router, replaced and put back while the others serve;
the deployment fails only once a role it needs has spent its restarts."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request

import pytest

from jobkit import (Load, chat, deployment, find_pid, fire_fault, requests_in, scrape, until,
                    wait_no_job_processes)

pytestmark = pytest.mark.slurm

FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1, "hung_after": 1}


def _rounds(job, n: int, timeout: float) -> None:
    """Until the job has written its state n more times: once a liveness round while it
    serves and nothing else changes."""
    seen = {job.state()["updated_at"]}
    until(f"{n} liveness rounds",
           lambda: seen.add(job.state()["updated_at"]) or len(seen) > n, timeout)


def _serving(job) -> dict:
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    return st


def test_a_killed_decode_engine_is_replaced_while_the_other_decode_serves(submit, dev_cluster):
    dep = deployment(1, 1, name="t-heal-pd", liveness=FAST,
                     engine={"name": "sglang", "version": "0.5.23", "simulate": True,
                             "sim_decode_s_per_token": 0.01})
    dep["roles"]["decode"].update(instances=2, recovery={"backoff_s": 1})
    job = submit(dep)
    st = _serving(job)
    victim = job.node_rows("decode-1")[0]
    new_log = job.dir / "logs" / f"decode-1.attempt1.node0.{victim[1]}.log"
    with Load(st["endpoint"], key=job.key) as load:
        until("requests served by both decodes", lambda: load.ok_between(0, time.time()) >= 6,
               30)
        t_kill = time.time()
        os.kill(find_pid(dev_cluster, victim[1], r"hpcserve_sim\.py"), signal.SIGKILL)
        st = job.wait_until(lambda s: s.get("phase") in ("degraded", "failed"), 20)
        assert st["phase"] == "degraded", st
        out = st["instances"]["decode-1"]
        assert out["status"] in ("out", "restarting") and "exited" in out["attempts"][0]["end"], out
        assert st["instances"]["decode-0"]["status"] == "serving"
        st = job.wait_until(lambda s: s["instances"]["decode-1"]["status"] == "serving"
                            and s["instances"]["decode-1"]["attempt"] == 1, 60)
        t_back = time.time()
        assert st["phase"] == "serving", st
        # later requests, with decode-1 back in the router
        until("request on the restarted decode-1", lambda: requests_in(new_log) > 0, 30)
    back = st["instances"]["decode-1"]
    assert back["restarts"] == 1 and back["recover_s"] > 0, back
    assert [a["attempt"] for a in back["attempts"]] == [0, 1], back
    # Only requests in flight on the dead engine, or sent before the router had it out, fail:
    # none after it was out, and the other decode served all the while.
    out_at = st["instances"]["decode-1"]["attempts"][0]["ended_at"]
    late = [f for f in load.failures() if f[0] > out_at + 1.0]
    assert not late, (f"{len(load.failures())} failed, {len(late)} after decode-1 was out",
                      late[:3])
    assert load.ok_between(t_kill, t_back) > 0, "no request succeeded while decode-1 was out"
    assert requests_in(new_log) > 0, "the restarted decode-1 served no request:\n" + job.logs()


def _file_sd(sd_dir, job, pred, timeout: float) -> dict:
    """The job's Prometheus file-SD file by instance label, once pred(it) holds."""
    files = lambda: sorted(sd_dir.glob(f"hpcserve-t-heal-spare-*-{job.id}.json"))  # noqa: E731

    def read():
        for f in files():  # written by one rename: never half a file
            groups = {g["labels"]["instance"]: g for g in json.loads(f.read_text())}
            return pred(groups) and groups
    return until("file SD as expected", read, timeout,
                 why=lambda: f"{[f.read_text() for f in files()]}\n{job.logs()}")


def test_a_node_of_a_multi_node_instance_lost_is_rebuilt_on_the_spare_and_prometheus_follows(
        submit, dev_cluster, tmp_path):
    sd_dir = tmp_path / "prometheus-sd"
    sd_dir.mkdir()
    dep = deployment(1, 2, name="t-heal-spare", liveness=FAST,
                     site={"base": "local", "metrics": {"file_sd_dir": str(sd_dir)}})
    dep["roles"]["decode"].update(spares=1, recovery={"backoff_s": 0.5})
    job = submit(dep)
    st = _serving(job)
    rows = job.node_rows("decode-0")
    victim = rows[1][1]
    # while serving: every engine's leader and the router, each answering Prometheus text
    sd = _file_sd(sd_dir, job, lambda g: len(g) == 3, 30)
    assert set(sd) == {"prefill-0", "decode-0", "router"}, sd
    d0 = sd["decode-0"]
    port = {i["name"]: i["port"] for i in json.loads((job.dir / "plan.json").read_text())[
        "instances"]}["decode-0"]
    assert d0["targets"] == [f"{rows[0][2]}:{port}"], d0  # the leader, where it serves
    assert (d0["labels"]["node"], d0["labels"]["nodes"], d0["labels"]["attempt"]) == (
        rows[0][1], f"{rows[0][1]},{victim}", "0"), d0
    assert (d0["labels"]["deployment"], d0["labels"]["slurm_job_id"]) == ("t-heal-spare", job.id)
    assert sd["router"]["labels"]["node"] == st["router_node"], (sd, st)
    for name, g in sd.items():
        names = scrape(g["targets"][0], g["labels"])
        want = "smg_" if name == "router" else "sglang:generation_tokens"
        assert any(n.startswith(want) for n in names), (name, sorted(names)[:20])
    try:
        dev_cluster.crash_node(victim)
        st = job.wait_until(lambda s: s.get("phase") != "serving", 30)
        assert st["phase"] in ("recovering", "degraded"), st
        st = job.wait_until(lambda s: s["instances"]["decode-0"]["status"] == "serving"
                            and s["instances"]["decode-0"]["attempt"] == 1, 60)
    finally:
        dev_cluster.restart_node(victim)
    dec = st["instances"]["decode-0"]
    first = dec["attempts"][0]
    assert first["end"] == "node lost" and first["failure"]["node"] == victim, first
    assert first["failure"]["node_rank"] == 1, first
    new_nodes = [r[1] for r in job.node_rows("decode-0")]
    assert victim not in new_nodes and new_nodes[0] == rows[0][1], (rows, new_nodes)
    assert dec["nodes"] == new_nodes and victim in st["excluded_nodes"], st
    assert st["phase"] == "serving"
    # draining is for Slurm's administrators: the job's user may not (as on most sites), so
    # the job says so, and keeps the node out of its own placements (excluded_nodes, above)
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    assert (f"node {victim} not drained (the site does not let this user): slurm_update "
            "error: Invalid user id") in log, log
    # Prometheus is told of the rebuilt instance: its attempt and the spare in the lost node's
    # place; it answers there
    sd = _file_sd(sd_dir, job, lambda g: g.get("decode-0", {}).get("labels", {}).get(
        "attempt") == "1", 10)
    assert sd["decode-0"]["labels"]["nodes"] == ",".join(new_nodes), sd
    scrape(sd["decode-0"]["targets"][0], sd["decode-0"]["labels"])
    # left out of the file while it was out of the router
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    counts = [ln.split("Prometheus file SD: ")[1].split()[0] for ln in log.splitlines()
              if "Prometheus file SD: " in ln]
    assert counts == ["3", "2", "3"], log
    # and the file is gone once the job is cancelled
    job.scancel()
    assert job.wait({"cancelled", "failed", "done"}, 60)["phase"] == "cancelled", job.logs()
    assert not list(sd_dir.iterdir()), list(sd_dir.iterdir())


def test_without_a_spare_a_lost_node_leaves_its_instance_failed_and_named(submit, dev_cluster):
    dep = deployment(1, 1, name="t-heal-nospare", liveness=FAST)
    dep["roles"]["decode"].update(instances=2, recovery={"backoff_s": 0.5})
    job = submit(dep)
    _serving(job)
    victim = job.node_rows("decode-1")[0][1]
    try:
        dev_cluster.crash_node(victim)
        st = job.wait_until(lambda s: "no spare" in (s.get("instances", {}).get(
            "decode-1", {}).get("why") or ""), 40)
    finally:
        dev_cluster.restart_node(victim)
    assert st["phase"] == "degraded", st
    d1 = st["instances"]["decode-1"]
    assert d1["status"] == "failed" and f"node {victim} is lost" in d1["why"], d1
    assert d1["attempts"][0]["failure"]["node"] == victim, d1
    assert st["instances"]["decode-0"]["status"] == "serving"


def test_a_hung_engine_on_default_settings_is_named_within_30_s_and_replaced(submit,
                                                                              dev_cluster):
    dep = deployment(1, 1, name="t-heal-hung")
    dep["roles"]["decode"].update(instances=2, recovery={"backoff_s": 0.5})
    job = submit(dep)
    _serving(job)
    leader = job.node_rows("decode-0")[0]
    pid = find_pid(dev_cluster, leader[1], r"hpcserve_sim\.py")
    t0 = time.time()
    os.kill(pid, signal.SIGSTOP)
    st = job.wait_until(lambda s: s["instances"]["decode-0"]["attempts"][0]["ended_at"], 45)
    first = st["instances"]["decode-0"]["attempts"][0]
    assert first["end"] == "hung", first
    assert first["failure"]["node"] == leader[1] and first["failure"]["node_rank"] == 0
    assert first["ended_at"] - t0 < 30, f"named hung {first['ended_at'] - t0:.1f} s after"
    st = job.wait_until(lambda s: s["instances"]["decode-0"]["status"] == "serving"
                        and s["instances"]["decode-0"]["attempt"] == 1, 60)
    assert st["phase"] == "serving"


def test_one_long_answer_streaming_on_default_liveness_is_never_called_hung(submit, dev_cluster):
    # SGLang 0.5.23 moves its prompt and generation token counters only when a request
    # finishes (engines/facts.py): a decode streaming one answer for 45 s shows still token
    # counters all along, past every default threshold (3 rounds, hung_after 20 s)
    dep = deployment(1, 1, name="t-heal-long",
                     engine={"name": "sglang", "version": "0.5.23", "simulate": True,
                             "sim_decode_s_per_token": 0.15})
    job = submit(dep)
    st = _serving(job)
    t0 = time.time()
    events = chat(st["endpoint"], 300, stream=True, timeout=120, key=job.key)
    took = time.time() - t0
    assert events[-1]["usage"]["completion_tokens"] == 300, events[-1]
    assert took > 40, f"the answer streamed for {took:.1f} s only"
    st = job.state()
    d0 = st["instances"]["decode-0"]
    assert (d0["status"], d0["attempt"], d0["restarts"]) == ("serving", 0, 0), d0
    assert st["phase"] == "serving", st
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    assert "decode-0: hung" not in log and "decode-0: busy" not in log, log[-3000:]
    # the finish-only counters moved at the end, the per-step one all along
    text = urllib.request.urlopen(f"http://{job.node_rows('decode-0')[0][2]}:30000/metrics",
                                  timeout=10).read().decode()

    def value(name):
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{.*}})? (\S+)$", text,
                                                re.M))
    assert value("sglang:generation_tokens_total") >= 300
    assert value("sglang:realtime_tokens_total") >= value("sglang:generation_tokens_total")


def test_an_instance_that_spends_its_restarts_fails_the_deployment_with_every_attempt(
        submit, dev_cluster):
    dep = deployment(1, 1, name="t-heal-budget", liveness=FAST)
    dep["roles"]["decode"].update(recovery={"max_restarts": 2, "backoff_s": 0.2},
                                  sim_fault={"kind": "exit", "on_signal": True, "exit_code": 42})
    job = submit(dep)
    st = job.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", job.logs()
    for attempt in range(3):  # each attempt crashes once it serves: the first, then 2 restarts
        until(f"decode-0 serving in attempt {attempt}",
              lambda: (job.state()["instances"]["decode-0"]["status"],
                       job.state()["instances"]["decode-0"]["attempt"]) == ("serving", attempt),
              60, why=lambda: json.dumps(job.state()["instances"]["decode-0"]))
        fire_fault(dev_cluster, job.node_rows("decode-0")[0][1], attempt)
    st = job.wait({"failed", "cancelled", "done"}, 60)
    d0 = st["instances"]["decode-0"]
    assert st["phase"] == "failed" and d0["status"] == "failed", st
    assert [a["attempt"] for a in d0["attempts"]] == [0, 1, 2], d0
    assert all(a["end"] == "exited with code 42" for a in d0["attempts"]), d0
    assert "restart(s) are spent" in d0["why"] and "decode has 0 serving" in st["reason"], st
    assert (st["failure"]["role"], st["failure"]["instance"]) == ("decode", 0)
    for a in d0["attempts"][1:]:
        assert (job.dir / a["log"]).exists() and ".attempt" in a["log"], a
    wait_no_job_processes(dev_cluster, 30)


def _rank_pid(cluster, node: str, rank: int) -> int:
    """The PID of MPI rank `rank` of the simulated engine on `node` (its SLURM_PROCID)."""
    from jobkit import cmdline, environ, node_processes
    for pid in node_processes(cluster)[node]:
        if "hpcserve_sim.py" in cmdline(pid) and environ(pid).get("SLURM_PROCID") == str(rank):
            return pid
    raise AssertionError(f"no engine rank {rank} on {node}")


def test_a_dead_rank_restarts_its_whole_mpi_world(submit, dev_cluster):
    from test_trtllm_jobs import trtllm
    dep = trtllm({"worker": {"nodes": 2, "recovery": {"backoff_s": 0.2}}},
                 router={"enabled": False}, name="t-heal-mpi", liveness=FAST)
    job = submit(dep)
    st = job.wait({"serving", "failed", "cancelled"}, 90)
    assert st["phase"] == "serving", job.logs()
    rows = job.node_rows("worker-0")
    os.kill(_rank_pid(dev_cluster, rows[1][1], 3), signal.SIGKILL)
    st = job.wait_until(lambda s: s["instances"]["worker-0"]["attempt"] == 1
                        and s["instances"]["worker-0"]["status"] == "serving", 90)
    first = st["instances"]["worker-0"]["attempts"][0]
    # the rank that died is named, with its node; the whole world started again as one
    assert (first["failure"]["rank"], first["failure"]["node"]) == (3, rows[1][1]), first
    assert first["end"] == "exited with code 137", first
    assert st["phase"] == "serving" and "recovering" in [h["phase"] for h in st["history"]]
    for node_rank, task, rank in ((0, 0, 0), (0, 1, 1), (1, 0, 2), (1, 1, 3)):
        node = rows[node_rank][1]
        log = job.dir / "logs" / f"worker-0.attempt1.node{node_rank}.{node}.task{task}.log"
        assert f"rank {rank} of 4" in log.read_text(), log
    job.scancel()
    assert job.wait({"cancelled", "failed", "done"}, 60)["phase"] == "cancelled", job.logs()
    wait_no_job_processes(dev_cluster, 30)


def test_an_engine_slow_under_load_with_progress_is_never_replaced(submit, dev_cluster):
    # default liveness: its health answers after 8 s, past the 5 s probe timeout, from once it
    # serves on, while its counters move under load
    dep = deployment(1, 1, name="t-heal-busy",
                     engine={"name": "sglang", "version": "0.5.23", "simulate": True,
                             "sim_decode_s_per_token": 0.02})
    dep["roles"]["decode"]["sim_fault"] = {"kind": "slow", "delay": 8, "on_signal": True}
    job = submit(dep)
    st = _serving(job)
    fire_fault(dev_cluster, job.node_rows("decode-0")[0][1])
    log_path = job.dir / "logs" / "hpcserve-job.log"
    with Load(st["endpoint"], clients=2, tokens=40, key=job.key) as load:
        # the slow fault in force, its first probe timed out, then five more rounds of 3 s +
        # 5 s: hung would be named after three
        until("busy round", lambda: "decode-0: busy, not hung" in log_path.read_text(), 60)
        _rounds(job, 5, 90)
    st = job.state()
    d0 = st["instances"]["decode-0"]
    assert (d0["status"], d0["attempt"], d0["restarts"]) == ("serving", 0, 0), d0
    assert st["phase"] == "serving", st
    log = log_path.read_text()
    assert "decode-0: busy, not hung: hung (no answer within 5 s)" in log, log[-3000:]
    assert not load.failures(), load.failures()[:3]


def test_vllm_pd_router_takes_the_dead_decode_out_and_restarts_with_its_replacement(
        submit, dev_cluster):
    """vllm-router's PD mode removes a worker while it runs but cannot add one: the dead
    decode goes out at once, and the router starts again with the replacement's address."""
    from jobkit import chat, vllm_deployment
    dep = vllm_deployment({"prefill": {"nodes": 1},
                           "decode": {"nodes": 1, "recovery": {"backoff_s": 0.5}}},
                          name="t-heal-vpd", liveness=FAST)
    job = submit(dep)
    st = _serving(job)
    leader = job.node_rows("decode-0")[0]
    os.kill(find_pid(dev_cluster, leader[1], r"hpcserve_sim\.py"), signal.SIGKILL)
    st = job.wait_until(lambda s: s["instances"]["decode-0"]["attempt"] == 1
                        and s["instances"]["decode-0"]["status"] == "serving", 60)
    assert st["phase"] == "serving" and "recovering" in [h["phase"] for h in st["history"]]
    log = (job.dir / "logs" / "hpcserve-job.log").read_text()
    assert f"decode-0 removed from the router (http://{leader[2]}:8100)" in log, log
    assert "restarting the router with the instances' addresses now" in log, log
    assert chat(st["endpoint"], 5, key=job.key)["usage"]["completion_tokens"] == 5
    new_log = job.dir / "logs" / f"decode-0.attempt1.node0.{leader[1]}.log"
    assert requests_in(new_log) > 0, new_log.read_text()


def test_a_state_json_it_cannot_write_while_serving_is_counted_and_recovery_goes_on(
        submit, dev_cluster):
    """A full disk or a quota under the job directory: state.json's writes fail (here its
    temp file is a directory the job cannot open) while the deployment serves. The engines go on
    serving, an engine killed meanwhile is replaced, and once the file can be written again it
    says how many writes failed and with what."""
    dep = deployment(1, 1, name="t-state-writes", liveness=FAST)
    dep["roles"]["decode"]["recovery"] = {"backoff_s": 0.2}
    job = submit(dep)
    _serving(job)
    log_path = job.dir / "logs" / "hpcserve-job.log"
    blocker = job.dir / "state.json.tmp"
    blocker.mkdir()
    try:
        until("the failed write in the job's log",
              lambda: "state.json cannot be written" in log_path.read_text(), 15,
              why=lambda: log_path.read_text()[-2000:])
        victim = job.node_rows("decode-0")[0]
        os.kill(find_pid(dev_cluster, victim[1], r"hpcserve_sim\.py"), signal.SIGKILL)
        until("decode-0 started again", lambda: "decode-0: attempt 1 on " in log_path.read_text(),
              30, why=lambda: log_path.read_text()[-2000:])
        assert job.state()["phase"] == "serving"  # the file as its last good write left it
    finally:
        blocker.rmdir()
    st = job.wait_until(lambda s: s["instances"]["decode-0"]["attempt"] == 1
                        and s["instances"]["decode-0"]["status"] == "serving", 30)
    assert st["phase"] == "serving", st
    wf = st["write_failures"]
    assert wf["count"] >= 1 and "Is a directory" in wf["error"], wf
    log = log_path.read_text()
    assert "state.json written again, after" in log and "stopping" not in log, log[-3000:]
    assert chat(st["endpoint"], 4, key=job.key)["usage"]["completion_tokens"] == 4
