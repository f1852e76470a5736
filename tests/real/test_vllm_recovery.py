"""Serving that heals, with the real engine: vLLM 0.32.0 on CPU, two instances behind the real
vllm-router (plain mode, whose worker API adds and removes workers while it runs). One instance
is killed under load; the other serves throughout; the killed one restarts and serves again.
Then `hpcserve scale --add 1` joins a third vLLM, an instance job of its own, to the same router,
and `--remove 1` drains it under load (one front for both: a real vLLM start costs CI a minute)."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from conftest import real_deployment, write_deployment
from test_vllm_cpu import (_job_id, _post, _status, api_key, leftovers, read_state,
                           wait_state)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jobs"))
import jobkit  # noqa: E402
from jobkit import OWNER, find_pid, owners_jobs, until, wait_no_job_processes  # noqa: E402

from hpcserve.runtime.contract import SCALED_IN  # noqa: E402
from hpcserve.runtime.workers import RouterWorkers  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.real_engine]

# The job's own bounds: a real vLLM on a shared 2-core machine starts in one to three minutes.
RESTART_S = 900      # worker-1 out, restarted, checked and back (engine_timeout 600 + margin)
CHAT = "POST /v1/chat/completions"  # uvicorn's access line for each chat vLLM answers
LONG_TOKENS = 400  # a chat in flight on the drained engine (the tiny llama holds 512 positions)


class Load(jobkit.Load):
    """Short chat requests to the real vLLM through the router from `clients` threads, a short
    pause between two of a thread (so that a starting vLLM gets some of the 2 cores)."""

    JOIN_S = 120  # one() waits up to 60 s for the real engine

    def __init__(self, url: str, key: str, clients: int = 2, pause: float = 0.25):
        super().__init__(url, clients, pause=pause, key=key)

    def one(self) -> str | None:
        body = {"model": "tiny", "max_tokens": 8,
                "messages": [{"role": "user", "content": "Say hello to the cluster"}]}
        got = json.loads(_post(self.url, body, timeout=60, key=self.key))["usage"][
            "completion_tokens"]
        return None if got > 0 else f"{got} tokens"


def _chats(log: Path) -> int:
    return log.read_text(errors="replace").count(CHAT) if log.exists() else 0


def _rows(job_dir: Path, inst: str) -> list[list[str]]:
    """run/<inst>.nodes: [rank, node, address, interface, ib] per node."""
    return [ln.split() for ln in (job_dir / "run" / f"{inst}.nodes").read_text().splitlines()]


def _engine_cores(cluster, node: str) -> set[int]:
    """PIDs of vLLM engine cores on `node` (VLLM::EngineCore, its process title)."""
    from jobkit import cmdline, node_processes
    return {p for p in node_processes(cluster)[node] if cmdline(p).startswith("VLLM::EngineCore")}


def test_a_killed_vllm_instance_is_replaced_and_an_added_one_serves_then_drains(
        hs, dev_cluster, tiny_models, tmp_path):
    jobs = str(owners_jobs(dev_cluster))
    cache = str(Path(dev_cluster.state_dir).parent / "inductor-cache")
    before = leftovers(dev_cluster)
    # torch.compile on (no --enforce-eager), its caches kept in a cache_dir every node shares:
    # both instances start cold and compile; the restarted worker-1 finds what they compiled.
    dep = real_deployment("real-heal", tiny_models["llama"], "tiny-llama", jobs,
                          {"instances": 2, "nodes": 1, "recovery": {"backoff_s": 1},
                           "enforce_eager": False}, cache)
    compile_cache = tmp_path / "compile-cache"
    dep["site"]["paths"] = {"cache_dir": str(compile_cache), "cache_storage": "shared"}
    # Probes every 2 s, each allowed 10 s on a busy machine. vLLM moves its progress counters
    # once per engine step, and a step may stand for seconds on a shared 2-core machine (the
    # first requests of an instance warm it up): 5 rounds without progress (10 s and more)
    # while it holds a request count as hung, so a busy engine is not taken for a hung one.
    dep["liveness"] = {"interval": 2, "timeout": 10, "failures": 5, "node_interval": 5}
    out = hs("submit", str(write_deployment(tmp_path, dep)), "--wait").stdout
    job = _job_id(out)
    st = _status(hs, job)
    job_dir, url = Path(st["job_dir"]), st["endpoint"]
    assert st["phase"] == "serving", (out, st)
    job_log = job_dir / "logs" / "hpcserve-job.log"

    def why() -> str:
        return (f"state: {json.dumps(read_state(job_dir), indent=1)[-4000:]}\n"
                f"job log: {job_log.read_text()[-4000:]}")

    (w0,), (w1,) = _rows(job_dir, "worker-0"), _rows(job_dir, "worker-1")
    assert w0[1] != w1[1], (w0, w1)
    router = RouterWorkers("direct", url)
    assert len(router.listed()) == 2, router.listed()

    def worker1_listed() -> bool:
        return any(f"//{w1[2]}:" in u for u in router.listed())

    with Load(url, api_key(job_dir)) as load:
        # steady load served by both first
        until("requests through the router", lambda: load.ok_between(0, time.time()) >= 6,
               120, why=why)
        # worker-1's leader: its API server (`vllm serve`, the step's task on that node), as
        # an OOM kill would end it. Its engine core and worker are its children: where Slurm
        # tracks processes by parentage (the test cluster's proctrack/linuxproc) they outlive
        # it, until the launch script's watch over its process group ends them.
        victim = find_pid(dev_cluster, w1[1], r"vllm\.entrypoints\.cli\.main serve")
        orphans_before = _engine_cores(dev_cluster, w1[1])
        assert orphans_before, "no VLLM::EngineCore on worker-1's node"
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        st = wait_state(job_dir, lambda s: s.get("phase") in ("degraded", "failed", "cancelled"),
                        120)
        assert st["phase"] == "degraded", why()
        assert st["instances"]["worker-0"]["status"] == "serving", why()
        # the router stops listing it (the runtime's DELETE /workers/<url>): from here on no
        # request may reach it
        until("worker-1 out of the router", lambda: not worker1_listed(), 60, poll=0.05,
               why=why)
        t_out = time.time()
        st = wait_state(job_dir, lambda s: s["instances"]["worker-1"]["status"] == "serving"
                        and s["instances"]["worker-1"]["attempt"] == 1
                        or s.get("phase") in ("failed", "cancelled"), RESTART_S)
        t_back = time.time()
        assert st["phase"] == "serving" and worker1_listed(), why()
        # the killed attempt's engine core is gone: only the new attempt's runs there
        now_cores = _engine_cores(dev_cluster, w1[1])
        assert len(now_cores) == 1 and not now_cores & orphans_before, (orphans_before,
                                                                         now_cores)
        back = st["instances"]["worker-1"]
        new_log = job_dir / back["attempts"][1]["log"]
        assert ".attempt1." in new_log.name and new_log.exists(), back
        # Later requests reach the new worker-1 through the router: its log shows chats beyond
        # the runtime's one smoke request to it.
        seen = until("chats through the router on the restarted worker-1",
                      lambda: (n := _chats(new_log)) >= 3 and n, 120, why=why)
        # and the router answers requests sent after worker-1 is back
        until("requests answered after worker-1 came back",
               lambda: load.ok_between(t_back, time.time()) >= 4, 120, why=why)
        t_end = time.time()
    first = back["attempts"][0]
    assert back["restarts"] == 1 and back["recover_s"] > 0, back
    _check_caches(job_dir, st, w1[1], compile_cache, new_log)
    assert [a["attempt"] for a in back["attempts"]] == [0, 1], back
    assert first["ended_at"] and first["end"], first
    assert st["instances"]["worker-0"]["status"] == "serving" and \
        st["instances"]["worker-0"]["attempt"] == 0, st["instances"]
    # Only requests in flight on the killed instance, or sent before the router had it out,
    # may fail: none sent once the test saw the router without it (the runtime took it out at
    # the attempt's ended_at, at the latest moments later), none after it came back.
    fails = load.failures()
    late = [f for f in fails if f[0] > min(t_out, first["ended_at"] + 5.0)]
    summary = (f"{len(load.results)} requests, {len(fails)} failed; killed at {t_kill:.2f}, "
               f"attempt 0 ended at {first['ended_at']:.2f}, out of the router seen at "
               f"{t_out:.2f}, back at {t_back:.2f}")
    print(summary, f"worker-1 attempt 1 answered {seen} chats; {first['end']}")
    assert not late, (summary, late[:5])
    # the other instance served all the while
    assert load.ok_between(t_kill, t_back) > 0, summary
    assert load.ok_between(t_back, t_end) > 0, summary
    front_log = job_dir / st["instances"]["worker-0"]["attempts"][0]["log"]
    _scale_add_then_drain(hs, job, job_dir, url, front_log)
    hs("cancel", job, "--wait")
    assert _status(hs, job)["phase"] == "cancelled"
    wait_no_job_processes(dev_cluster, 60)
    assert leftovers(dev_cluster) - before == set()


def _check_caches(job_dir: Path, st: dict, node: str, cache: Path, new_log: Path) -> None:
    """vLLM's compile cache: cold at the deployment's start (both instances), warm at worker-1's
    restart on `node`, in state.json and in the engine's log; vLLM itself wrote it there, in
    the job's user's own part of the cache directory (0700)."""
    mine = cache / OWNER
    assert mine.stat().st_mode & 0o777 == 0o700
    assert mine.stat().st_uid == pwd.getpwnam(OWNER).pw_uid
    root = next(mine.glob("tiny-llama/vllm-0.32.0/*/vllm"))
    assert st["caches"]["storage"] == "shared" and st["caches"]["dir"] == str(cache), st
    for name in ("worker-0", "worker-1"):
        (first,) = st["caches"]["instances"][name].values()
        assert first["vllm"] == "cold", st["caches"]
        assert st["instances"][name]["attempts"][0]["caches"] == st["caches"]["instances"][name]
    assert st["instances"]["worker-1"]["attempts"][1]["caches"][node]["vllm"] == "warm", st
    log = new_log.read_text(errors="replace")
    assert f"hpcserve: cache vllm (VLLM_CACHE_ROOT={root}) warm" in log, log[:3000]
    # where vLLM 0.32.0 saves its compiled graph (vllm/compilation/decorators.py), at the first
    # start of one instance or both
    firsts = [(job_dir / st["instances"][n]["attempts"][0]["log"]).read_text(errors="replace")
              for n in ("worker-0", "worker-1")]
    assert any(f"saved AOT compiled function to {root}/torch_compile_cache/" in t
               for t in firsts), firsts[0][-3000:]
    job_log = (job_dir / "logs" / "hpcserve-job.log").read_text()
    assert f"worker-1 attempt 1 compile caches: {node}: vllm warm" in job_log, job_log[-3000:]


def _scale_add_then_drain(hs, job: str, job_dir: Path, url: str, front_log: Path) -> None:
    """`hpcserve scale --add 1`, then chats through the router reach both the front's worker-0
    and the new engine (each one's own log). `--remove 1 --wait` under load takes it out and
    stops it without a failed request, a long chat sent to it straight finishing first; the
    instance job ends done."""
    inst, inst_dir, mine = _scale_add(hs, job, job_dir, url)
    router = RouterWorkers("direct", url)
    ist = read_state(inst_dir)
    new_log = inst_dir / ist["instances"]["worker-0"]["attempts"][0]["log"]
    inst_log = inst_dir / "logs" / "hpcserve-job.log"
    why = lambda: _why(inst_dir)  # noqa: E731
    # the drain waits on these gauges: vLLM must export them (a name it lacks would read 0)
    metrics = json.loads((inst_dir / "plan.json").read_text())["instances"][0]["metrics"]
    exported = _get(mine + metrics["path"])
    assert all(re.search(rf"^{re.escape(n)}[{{ ]", exported, re.M) for n in metrics["pending"]), \
        (metrics["pending"], exported[:3000])
    with Load(url, api_key(job_dir)) as load:
        front0, new0 = _chats(front_log), _chats(new_log)  # new0: its smoke request
        until("chats through the router on the front's worker-0 and the new engine",
              lambda: _chats(front_log) >= front0 + 3 and _chats(new_log) >= new0 + 3, 180,
              why=why)
        long = _LongChat(mine, LONG_TOKENS, api_key(job_dir))
        out = hs("scale", job, "--role", "worker", "--remove", "1", "--drain-timeout", "120",
                 "--wait").stdout
        t_drained = time.time()
        assert f"draining worker-0 of job {inst}" in out, out
        ist = wait_state(inst_dir, {"done", "failed", "cancelled"}, 60)
        assert mine not in router.listed(), router.listed()
        served = load.ok_between(0, time.time())
        until("requests after the drain", lambda: load.ok_between(0, time.time()) >= served + 4,
              120, why=why)
    # the engine stopped only once the long chat (in flight as the drain began, or done) was
    long.join()
    assert long.got == {"tokens": LONG_TOKENS}, (long.got, why())
    assert (ist["phase"], ist["reason"]) == ("done", SCALED_IN), why()
    assert _status(hs, inst)["phase"] == "done", _status(hs, inst)  # Slurm's view merged
    assert ist["instances"]["worker-0"]["status"] == "removed", ist["instances"]
    assert not load.failures(), load.failures()[:3]
    log = inst_log.read_text()
    left = log.index("worker-0 removed from the router")
    settled = re.search(r"worker-0: no request in flight ([\d.]+) s after it left the router",
                        log)
    assert settled and left < settled.start(), log[-3000:]
    print(f"instance job {inst}: {len(load.results)} requests during the add and drain, "
          f"{_chats(new_log) - new0} chats on its engine; the long chat ended "
          f"{long.ended - long.started:.1f} s after it began, {t_drained - long.ended:.1f} s "
          f"before --remove returned; {settled.group(0)}")


def _scale_add(hs, job: str, job_dir: Path, url: str) -> tuple[str, Path, str]:
    """`hpcserve scale --add 1`: an instance job (a Slurm job of its own under the front's
    scale/) whose vLLM the front's vllm-router lists only once its job log says it answered its
    smoke request. Its job id, directory and engine URL, once it serves."""
    out = hs("scale", job, "--role", "worker", "--add", "1").stdout
    inst = _job_id(out)
    assert inst != job, out
    inst_dir = Path(re.search(r"job directory: (\S+)", out).group(1))
    assert inst_dir.parent == job_dir / "scale", out  # <front job dir>/scale/worker-<seq>
    inst_log = inst_dir / "logs" / "hpcserve-job.log"
    router = RouterWorkers("direct", url)

    def listed_after_smoke() -> str | None:
        if read_state(inst_dir).get("phase") in ("failed", "cancelled", "done"):
            raise AssertionError(_why(inst_dir))
        if not (inst_dir / "run" / "worker-0.nodes").exists():
            return None
        port = json.loads((inst_dir / "plan.json").read_text())["instances"][0]["port"]
        mine = f"http://{_rows(inst_dir, 'worker-0')[0][2]}:{port}"
        if mine not in router.listed():
            return None
        assert "worker-0 answered its smoke request" in inst_log.read_text(), \
            ("listed before its smoke request", _why(inst_dir))
        return mine

    mine = until("the instance job's vLLM in the front's router", listed_after_smoke,
                 RESTART_S, poll=0.1, why=lambda: _why(inst_dir))
    ist = wait_state(inst_dir, {"serving", "failed", "cancelled"}, 60)
    assert ist["phase"] == "serving" and ist["endpoint"] == url, _why(inst_dir)
    assert ist["attach"]["front_job_id"] == job, ist["attach"]
    assert len(router.listed()) == 3, router.listed()
    return inst, inst_dir, mine


def _why(job_dir: Path) -> str:
    log = job_dir / "logs" / "hpcserve-job.log"
    return (f"{job_dir.name} state: {json.dumps(read_state(job_dir), indent=1)[-3000:]}\n"
            f"its log: {log.read_text()[-3000:] if log.exists() else ''}")


def _get(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as r:
        return r.read().decode(errors="replace")


class _LongChat(threading.Thread):
    """A chat of exactly `tokens` tokens (vLLM's ignore_eos) sent straight to one engine: what
    it got ({"tokens": n} or {"error": ...}), when it began and ended."""

    def __init__(self, engine_url: str, tokens: int, key: str):
        super().__init__(daemon=True)
        self.url, self.tokens, self.key = engine_url, tokens, key
        self.got: dict = {}
        self.started = self.ended = time.time()
        self.start()

    def run(self) -> None:
        body = {"model": "tiny", "max_tokens": self.tokens, "ignore_eos": True,
                "messages": [{"role": "user", "content": "Tell the cluster a long story"}]}
        try:
            self.got = {"tokens": json.loads(_post(self.url, body, timeout=300,
                                                   key=self.key))["usage"][
                "completion_tokens"]}
        except Exception as e:  # a stopped engine's reset connection, whatever it is
            self.got = {"error": repr(e)}
        self.ended = time.time()
