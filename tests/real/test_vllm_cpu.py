"""A real engine end to end: vLLM 0.32.0 on CPU, launched by `hpcserve submit` on the real test
cluster behind the real vllm-router. Each deployment must reach `serving` only after its smoke
request returned tokens, answer a chat with tool definitions and a streamed one, and after
`hpcserve cancel` leave no process on any node and none of vLLM's files in /tmp or /dev/shm."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import plugins_for, real_deployment, write_deployment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
from jobkit import OWNER, find_pid, owners_jobs, wait_no_job_processes  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.real_engine]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
# What vLLM and torch leave in /tmp and /dev/shm: rendezvous and ZMQ socket files, shared memory
# segments, compile caches, and hpcserve's own per-job scratch directories.
LEFTOVER = re.compile(r"^(vllm_dist_\w+|psm_\w+|torchinductor_\w+|"
                      r"hpcserve-job(\d+)(?:-[\w.-]+)?|"
                      r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$")


def leftovers(cluster) -> set[str]:
    """What vLLM, torch and hpcserve's jobs on `cluster` left in /tmp and /dev/shm. The scratch
    directories of jobs on another test session's cluster (one running beside this one: only
    this tier runs vLLM, one test at a time) have job ids outside this cluster's."""
    out = set()
    for d in ("/tmp", "/dev/shm"):
        for n in os.listdir(d):
            m = LEFTOVER.match(n)
            if m and (m.group(2) is None or cluster.gives_job_id(int(m.group(2)))):
                out.add(f"{d}/{n}")
    return out


def api_key(job_dir: Path) -> str:
    """The deployment's API key, which submit made (an instance job's: its front's)."""
    return Path(json.loads((job_dir / "plan.json").read_text())["api_key"]["file"]) \
        .read_text().strip()


def _post(url: str, body: dict, timeout: float = 120, key: str | None = None):
    """A chat request, bearing the deployment's API key `key` (None: none)."""
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  **({"Authorization": f"Bearer {key}"} if key else {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as r:
        return r.read().decode()


def _serves_real_tokens(endpoint: str, key: str) -> None:
    ask = {"model": "tiny", "max_tokens": 8,
           "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    resp = json.loads(_post(endpoint, {**ask, "tools": TOOLS, "tool_choice": "auto"}, key=key))
    assert resp["usage"]["completion_tokens"] > 0, resp
    raw = _post(endpoint, {**ask, "stream": True, "stream_options": {"include_usage": True}},
                key=key)
    events = [json.loads(ln[6:]) for ln in raw.splitlines()
              if ln.startswith("data: ") and ln != "data: [DONE]"]
    assert raw.rstrip().endswith("data: [DONE]")
    assert [e["usage"]["completion_tokens"] for e in events if e.get("usage")][-1] > 0


def _status(hs, job: str) -> dict:
    """JOB's entry in `hpcserve status JOB --json` (a front's instance jobs follow it there)."""
    (st,) = [v for v in json.loads(hs("status", job, "--json", check=False).stdout)
             if v["job_id"] == job]
    return st


def _job_id(submit_out: str) -> str:
    return re.search(r"submitted job (\d+)", submit_out).group(1)


DEPLOYMENTS = {
    # (a) TP=2 across two nodes: mp executor, node rank 1 --headless
    "tp2-2nodes": ("llama", "tiny-llama", {"nodes": 2, "tp": 2}),
    # (b) DP=2 over two nodes, dense model: head + --headless --data-parallel-start-rank 1
    "dp2-2nodes": ("llama", "tiny-llama", {"nodes": 2, "dp": 2}),
    # (c) the DeepSeek-V3 shape (MoE + MLA) with TP=2 across two nodes
    "dsv3-tp2": ("deepseek_v3", "tiny-deepseek-v3", {"nodes": 2, "tp": 2}),
}


@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_real_vllm_serves_through_hpcserve_and_cancel_leaves_nothing(
        hs, dev_cluster, tiny_models, tmp_path, name):
    shape, profile, worker = DEPLOYMENTS[name]
    jobs = str(owners_jobs(dev_cluster))
    cache = str(Path(dev_cluster.state_dir).parent / "inductor-cache")
    before = leftovers(dev_cluster)
    f = write_deployment(tmp_path, real_deployment(f"real-{name}", tiny_models[shape], profile,
                                                   jobs, worker, cache))
    out = hs("submit", str(f), "--wait").stdout
    job = _job_id(out)
    st = _status(hs, job)
    state = json.loads((Path(st["job_dir"]) / "state.json").read_text())
    assert st["phase"] == "serving" and state["smoke_tokens"] > 0, (out, st)
    _serves_real_tokens(st["endpoint"], api_key(Path(st["job_dir"])))
    # vLLM's own API server on node rank 0, and a headless vLLM on node rank 1
    rows = _nodes(Path(st["job_dir"]))
    log = [(Path(st["job_dir"]) / "logs" / f"worker-0.node{r}.{rows[r][1]}.log").read_text(
        errors="replace") for r in (0, 1)]
    assert f"Starting vLLM server on http://{rows[0][2]}:" in log[0]
    assert "headless" in log[1] and "Starting vLLM server" not in log[1]
    hs("cancel", job, "--wait")
    assert _status(hs, job)["phase"] == "cancelled"
    wait_no_job_processes(dev_cluster, 30)
    assert leftovers(dev_cluster) - before == set()


# vLLM 0.32.0's CPU fused MoE needs local expert ids under expert parallelism: see the plugin.
def test_the_deepseek_v3_shape_with_expert_parallelism(hs, dev_cluster, tiny_models, tmp_path):
    """(c) with EP: the DeepSeek-V3 shape (MLA, 8 routed experts, top-2, a shared expert) with TP
    2 and --enable-expert-parallel across two nodes, each rank holding 4 of the 8 experts.

    What decides whether this serves is not a dimension of the model nor the CPU: vLLM 0.32.0
    has one unquantized MoE kernel on CPUs (csrc/cpu/cpu_fused_moe.cpp, `amx` or `vec`
    micro-GEMM alike), and `CPUUnquantizedExperts.apply`
    (vllm/model_executor/layers/fused_moe/experts/cpu_moe.py) hands it the router's global
    expert ids without the layer's `expert_map`. On a rank that holds experts 0-3 of 8 the
    kernel then indexes past its buffers, and whether that segfaults depends on the
    scratchpad's leftovers: a CI run crashed on the smoke request, another on a later one,
    others never. The dummy weights are the same on every run (vLLM's dummy loader seeds every
    tensor with 1234: model_loader/weight_utils.py), so the routing is too. The deployment
    loads the tests' vLLM plugin (tests/real/vllm_plugins), which maps the ids through
    `expert_map` as vLLM's GPU kernels do; it must then serve every time."""
    jobs = str(owners_jobs(dev_cluster))
    cache = str(Path(dev_cluster.state_dir).parent / "inductor-cache")
    before = leftovers(dev_cluster)
    dep = real_deployment("real-dsv3-ep", tiny_models["deepseek_v3"], "tiny-deepseek-v3", jobs,
                          {"nodes": 2, "tp": 2, "expert_parallel": True}, cache)
    dep["env"].update({"PYTHONPATH": plugins_for(tmp_path),
                       "VLLM_PLUGINS": "hpcserve_test_moe_ep"})
    out = hs("submit", str(write_deployment(tmp_path, dep)), "--wait").stdout
    job = _job_id(out)
    st = _status(hs, job)
    job_dir = Path(st["job_dir"])
    assert st["phase"] == "serving", (out, st)
    _serves_real_tokens(st["endpoint"], api_key(job_dir))
    # each node's rank held its own half of the experts, and the kernel got local ids there
    rows = _nodes(job_dir)
    for rank, experts in ((0, "0->0, 1->1, 2->2, 3->3"), (1, "0->4, 1->5, 2->6, 3->7")):
        log = (job_dir / "logs" / f"worker-0.node{rank}.{rows[rank][1]}.log").read_text(
            errors="replace")
        assert f"[EP Rank {rank}/2] Expert parallelism is enabled" in log, log[-3000:]
        assert "Local/global number of experts: 4/8" in log and experts in log, log[-3000:]
        assert "expert ids mapped to this rank's 4 local experts of 8" in log, log[-3000:]
    hs("cancel", job, "--wait")
    assert _status(hs, job)["phase"] == "cancelled"
    wait_no_job_processes(dev_cluster, 60)
    assert leftovers(dev_cluster) - before == set()


def test_a_crashed_engine_worker_is_recorded_with_its_node_and_its_last_words(
        hs, dev_cluster, tiny_models, tmp_path):
    """What hpcserve does when a real engine crashes while it serves, provoked on purpose: the
    vLLM worker process on node rank 1 of a TP 2 deployment gets SIGSEGV (as a segfault in a
    kernel would end it). The job must end `failed`, naming the role, the instance and a node
    of the instance, with vLLM's own words about its dead worker in the log tail, and leave
    nothing behind."""
    jobs = str(owners_jobs(dev_cluster))
    cache = str(Path(dev_cluster.state_dir).parent / "inductor-cache")
    before = leftovers(dev_cluster)
    # restart: false: the crash is what this test looks at, not its recovery (recovery would
    # start the instance again: tests/real/test_vllm_recovery.py)
    dep = real_deployment("real-crash", tiny_models["llama"], "tiny-llama", jobs,
                          {"nodes": 2, "tp": 2, "recovery": {"restart": False}}, cache)
    out = hs("submit", str(write_deployment(tmp_path, dep)), "--wait").stdout
    st = _status(hs, _job_id(out))
    job_dir = Path(st["job_dir"])
    assert st["phase"] == "serving", (out, st)
    rows = _nodes(job_dir)
    # vLLM titles its worker processes VLLM::Worker_TP<rank> (vllm/utils/system_utils.py)
    victim = find_pid(dev_cluster, rows[1][1], r"^VLLM::Worker_TP1")
    os.kill(victim, signal.SIGSEGV)
    state = wait_state(job_dir, {"failed", "cancelled", "done"}, 120)
    f = state["failure"]
    assert state["phase"] == "failed", state
    # node rank 1's vLLM shut down cleanly (exit code 0) once its worker died: srun's --wait
    # ends the step, and the runtime names that rank and its last error line
    assert (f["role"], f["instance"], f["node"], f["node_rank"]) == ("worker", 0, rows[1][1], 1), f
    assert "Worker proc VllmWorker-1 died unexpectedly" in f["error"], f
    assert f["error"] in f["log_tail"][-1] or any(f["error"] in ln for ln in f["log_tail"]), f
    assert "serving" in [h["phase"] for h in state["history"]]
    wait_no_job_processes(dev_cluster, 60)
    assert leftovers(dev_cluster) - before == set()


def read_state(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / "state.json").read_text())
    except (OSError, ValueError):
        return {}  # not written yet (pending), or being replaced


def wait_state(job_dir: Path, until, timeout: float) -> dict:
    """state.json once `until` (a set of phases, or a test of the state) holds, polled until
    the deadline."""
    ok = until if callable(until) else (lambda st: st.get("phase") in until)
    end = time.time() + timeout
    st: dict = {}
    while time.time() < end:
        st = read_state(job_dir) or st
        if ok(st):
            return st
        time.sleep(0.5)
    log = job_dir / "logs" / "hpcserve-job.log"
    raise AssertionError(f"{job_dir}: still {st.get('phase')} after {timeout} s: "
                         f"{log.read_text()[-3000:] if log.exists() else ''}")


def _render_edit_sbatch(hs, dev_cluster, f: Path, rel: str, old: str, new: str):
    job_dir = Path(hs("submit", str(f), "--dry-run").stdout.strip().splitlines()[-1])
    p = job_dir / rel
    text = p.read_text()
    assert old in text, (old, rel)
    p.write_text(text.replace(old, new))
    out = subprocess.run(["runuser", "-u", OWNER, "--", "sbatch", "--parsable",
                          str(job_dir / "job.sbatch")], env=hs.env, cwd=job_dir,
                         capture_output=True, text=True, check=True).stdout
    return job_dir, out.strip().split(";")[0]


def _wait_terminal(job_dir: Path, timeout: float) -> dict:
    return wait_state(job_dir, {"failed", "cancelled", "done", "serving"}, timeout)


def _nodes(job_dir: Path) -> list[list[str]]:
    return [ln.split() for ln in (job_dir / "run" / "worker-0.nodes").read_text().splitlines()]


def test_a_wrong_start_rank_makes_the_real_engine_fail_on_that_node(
        hs, dev_cluster, tiny_models, tmp_path):
    jobs = str(owners_jobs(dev_cluster))
    dep = real_deployment("real-bad-rank", tiny_models["llama"], "tiny-llama", jobs,
                          {"nodes": 2, "dp": 2}, str(tmp_path / "cache"))
    f = write_deployment(tmp_path, dep)
    t0 = time.time()
    job_dir, job = _render_edit_sbatch(hs, dev_cluster, f, "launch/worker-0.sh",
                                       "--data-parallel-start-rank 1",
                                       "--data-parallel-start-rank 2")
    st = _wait_terminal(job_dir, 600)
    assert st["phase"] == "failed", st
    assert time.time() - t0 < dep["readiness"]["engine_timeout"]
    f_ = st["failure"]
    rows = _nodes(job_dir)
    assert (f_["role"], f_["instance"], f_["node"], f_["node_rank"]) == ("worker", 0, rows[1][1], 1)
    assert any("data_parallel_rank (2) must be in the range [0, 2)" in ln
               for ln in f_["log_tail"]), f_["log_tail"]
    wait_no_job_processes(dev_cluster, 60)


def test_a_wrong_master_addr_makes_the_real_engine_fail_within_the_deadline(
        hs, dev_cluster, tiny_models, tmp_path):
    # Node rank 1 is told the master is itself: torch's store client there finds nobody and
    # gives up after --distributed-timeout-seconds.
    jobs = str(owners_jobs(dev_cluster))
    dep = real_deployment("real-bad-master", tiny_models["llama"], "tiny-llama", jobs,
                          {"nodes": 2, "tp": 2, "args": {"distributed-timeout-seconds": 30}},
                          str(tmp_path / "cache"))
    f = write_deployment(tmp_path, dep)
    t0 = time.time()
    job_dir, job = _render_edit_sbatch(hs, dev_cluster, f, "launch/worker-0.sh",
                                       '--master-addr "${LEADER_IP}"',
                                       '--master-addr "${NODE_IP}"')
    st = _wait_terminal(job_dir, 600)
    assert st["phase"] == "failed", st
    assert time.time() - t0 < dep["readiness"]["engine_timeout"]
    f_ = st["failure"]
    rows = _nodes(job_dir)
    assert (f_["role"], f_["instance"]) == ("worker", 0)
    assert f_["node"] in (rows[0][1], rows[1][1]) and f_["exit_code"] != 0
    # the reason: rank 1 looked for the store at its own address, where nobody listens
    rank1 = (job_dir / "logs" / f"worker-0.node1.{rows[1][1]}.log").read_text(errors="replace")
    assert f"({rows[1][2]}, 29501)" in rank1 or f"{rows[1][2]}:29501" in rank1, rank1[-3000:]
    wait_no_job_processes(dev_cluster, 60)
