"""Autoscale and renew together, on the real test cluster with the real sglang-router and
simulated SGLang workers: a slot added under load is an instance job of a one-minute time limit
that renews into its twin directory; the front follows the slot to the successor (its state.json
names the job the pair runs now), counts it as one instance throughout (no second add, no
remove while the load lasts), and once the load ends drains the successor, not the job it
replaced. No request fails."""

from __future__ import annotations

import subprocess

import pytest

from hpcserve.runtime.contract import SCALED_IN
from jobkit import Job, Load, deployment, requests_in, until

pytestmark = pytest.mark.slurm

FAST = {"interval": 0.5, "timeout": 1, "failures": 3, "node_interval": 1, "hung_after": 1}
# 8 tokens at 0.2 s: a request runs 1.6 s, so ten clients hold ten running requests but for
# the moments between one's answer and its next request. At 0.4 s a request, on a loaded 2-core
# machine (CI, a vLLM start-up beside it), the clients' threads fell behind: one reading of
# fewer than 5 running decided a remove while the load lasted.
ENGINE = {"name": "sglang", "version": "0.5.23", "simulate": True,
          "sim_decode_s_per_token": 0.2}
CLIENTS = 10
# 10 running over 1 instance > 5: one slot added; over 2 (5 each, never above) no second one,
# and one fewer (10) is not below 5: no remove. A renewal counted twice (capacity 3) would
# remove, one counted as a gap (capacity 1) would add worker-s2: either shows in the decisions.
SCALE = {"min": 1, "max": 3, "signal": "running", "target": 5, "cool_down": "4s",
         "interval": 0.5, "drain_timeout": 20}
RENEW = {"margin": "40s", "time_limit": "00:01:00"}   # as test_renew_jobs.py


def test_a_slot_job_renews_under_load_and_stays_one_instance_of_capacity(submit):
    dep = deployment(name="t-slotrenew", liveness=FAST, engine=ENGINE, renew=RENEW)
    dep["roles"] = {"worker": {"nodes": 1, "autoscale": SCALE}}
    front = submit(dep)
    st = front.wait({"serving", "failed", "cancelled"}, 60)
    assert st["phase"] == "serving", front.logs()
    slot_a, slot_b = front.dir / "scale" / "worker-s1", front.dir / "scale" / "worker-s1b"
    assert "#SBATCH --signal=B:23@40" in (slot_b / "job.sbatch").read_text()

    def auto() -> dict:
        return (front.state().get("autoscale") or {}).get("worker", {})

    def decisions() -> list[dict]:
        return auto().get("decisions", [])

    ids: set[str] = set()
    try:
        with Load(st["endpoint"], clients=CLIENTS, key=front.key) as load:
            added = until("an autoscale add under load", decisions, 30, why=front.logs)[0]
            assert (added["action"], added["slot"]) == ("add", "worker-s1"), added
            first_id = until("the slot's job id", lambda: decisions()[0]["job_id"], 15)
            ids.add(first_id)
            first = Job(front.cluster, slot_a, first_id, front.env)
            assert first.wait({"serving", "failed", "done"}, 60)["phase"] == "serving", \
                first.logs()
            # the slot's job renews into its twin directory before its one-minute limit
            fst = first.wait({"done", "failed", "cancelled"}, 75)
            succ_id = (fst.get("renew") or {}).get("successor_job_id")
            assert (fst["phase"], fst["reason"]) == ("done", f"renewed by job {succ_id}"), \
                first.logs()
            ids.add(succ_id)
            succ = Job(front.cluster, slot_b, succ_id, front.env)
            # the front follows the slot to the successor: same slot, same capacity
            slot = front.wait_until(lambda s: s["autoscale"]["worker"]["slots"]["worker-s1"]
                                    ["job_id"] == succ_id, 15)["autoscale"]["worker"]
            assert slot["slots"]["worker-s1"] == {"dir": str(slot_b), "job_id": succ_id,
                                                  "status": "serving"}, slot
            assert slot["capacity"] == 2, slot
            sst = succ.state()
            engine_log = slot_b / sst["startup"]["instances"]["worker-0"]["log"]
            seen = requests_in(engine_log)
            until("requests served by the successor's engine",
                  lambda: requests_in(engine_log) >= seen + 3, 30, why=succ.logs)
            # a renewal is neither an add nor a remove
            assert [d["action"] for d in decisions()] == ["add"], decisions()
        removed = until("an autoscale remove", lambda: decisions()[1:], 30, why=front.logs)[0]
        assert (removed["action"], removed["slot"]) == ("remove", "worker-s1"), removed
        # the drain went to the job the pair runs now (a second renewal may have come)
        now_id = removed["job_id"]
        now = succ if now_id == succ_id else Job(front.cluster, slot_a, now_id, front.env)
        ids.add(now_id)
        nst = now.wait({"done", "failed", "cancelled"}, 40)
        assert (nst["phase"], nst["reason"]) == ("done", SCALED_IN), now.logs()
        assert not load.failures(), load.failures()[:3]
        assert [d["action"] for d in decisions()] == ["add", "remove"], decisions()
        front.wait_until(lambda s: s["autoscale"]["worker"]["slots"]["worker-s1"]["status"]
                         == "free", 15)
        log = (front.dir / "logs" / "hpcserve-job.log").read_text()
        assert f"autoscale worker: worker-s1 renewed: job {succ_id} in {slot_b} takes over " \
               f"from job {first_id}" in log, log
    finally:  # every job either directory of the pair ran or was submitted into
        for d in (slot_a, slot_b):
            st = Job(front.cluster, d, "", front.env).state()
            ids |= {str(v) for v in (st.get("job_id"), (st.get("renew") or {}).get(
                "successor_job_id")) if v}
        for i in ids:
            subprocess.run(["scancel", i], env=front.env, capture_output=True)
        for i in ids:
            Job(front.cluster, slot_a, i, front.env).squeue_gone(60)
