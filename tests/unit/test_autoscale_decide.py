"""The autoscaler's decision (runtime/autoscale_decide.py), pure: what it adds or removes given
the role's autoscale spec as plan.json renders it, the front's own instances, the slots'
statuses and the signal read. Each case sits next to the one that tips it, so a rule that
went missing (a pending slot counted twice or not at all, cool-down, min/max, below-min, the
one-fewer rule, the newest slot first) fails the case it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcserve.author.render import render_files
from hpcserve.runtime.autoscale_decide import capacity, decide
from hpcserve.runtime.spec import AutoscaleRole
from unitkit import load_plan

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
T0 = 1000.0   # the last decision; cool-down is 5 s


@pytest.fixture(scope="module")
def spec() -> AutoscaleRole:
    """plan.json's autoscale.decode for min 1, max 4, queued above 2 per instance: the front's
    own decode instance and three slots."""
    auto = '{"min": 1, "max": 4, "signal": "queued", "target": 2, "cool_down": "5s"}'
    p = load_plan(DEMO, [f"roles.decode.autoscale={auto}"])
    got = json.loads(render_files(p, "/jobs/demo")["plan.json"][0])["autoscale"]["decode"]
    assert (got["min"], got["max"], got["target"], got["cool_down_s"]) == (1, 4, 2, 5)
    assert len(got["slots"]) == 3
    return AutoscaleRole(got)


def slots(*statuses: str, at: tuple = ()) -> list:
    """(name, status, submitted at) for decode-s1.. in order; `at` the submit times."""
    at = at or (0.0,) * len(statuses)
    return [(f"decode-s{k + 1}", st, t) for k, (st, t) in enumerate(zip(statuses, at))]


def test_a_slot_on_its_way_counts_once_whatever_its_stage():
    assert capacity(1, ["submitting", "pending", "starting", "serving"]) == 5
    assert capacity(1, ["free", "draining", "free"]) == 1


def test_a_pending_slot_is_capacity_so_the_same_load_asks_for_nothing_more(spec):
    # 5 queued on the one serving instance: alone it is 5 per instance, above target 2 ...
    assert decide(spec, 1, slots("free", "free", "free"), [5.0], T0 + 60, T0) == \
        ("add", "decode-s1", "queued 5 per instance > target 2")
    # ... but with s1 pending and s2 starting it is 5 / 3 per instance: no third slot
    assert decide(spec, 1, slots("pending", "starting", "free"), [5.0], T0 + 60, T0) is None
    # ... where counting s1 alone (not s2) would still add
    assert decide(spec, 1, slots("pending", "free", "free"), [5.0], T0 + 60, T0) == \
        ("add", "decode-s2", "queued 2.5 per instance > target 2")


def test_no_decision_within_the_cool_down(spec):
    busy = slots("free", "free", "free")
    assert decide(spec, 1, busy, [9.0], T0 + 4.9, T0) is None
    assert decide(spec, 1, busy, [9.0], T0 + 5.0, T0)[:2] == ("add", "decode-s1")
    idle = slots("serving", "free", "free")
    assert decide(spec, 1, idle, [0.0, 0.0], T0 + 4.9, T0) is None
    assert decide(spec, 1, idle, [0.0, 0.0], T0 + 5.0, T0)[:2] == ("remove", "decode-s1")


def test_never_past_max_however_busy(spec):
    full = slots("serving", "serving", "serving")   # 1 + 3 = max 4
    assert decide(spec, 1, full, [50.0] * 4, T0 + 60, T0) is None
    assert decide(spec, 0, full, [50.0] * 3, T0 + 60, T0) is None  # 3: below max, no free slot
    assert decide(spec, 0, slots("serving", "serving", "free"), [50.0] * 2, T0 + 60, T0)[:2] == \
        ("add", "decode-s3")
    # a free slot left, but max (3 here) reached
    assert decide(AutoscaleRole({**spec.as_json(), "max": 3}), 1,
                  slots("serving", "serving", "free"), [50.0] * 3, T0 + 60, T0) is None


def test_below_min_adds_whatever_the_signal(spec):
    # the front's own instance failed: capacity 0 < min 1, whether idle, unread or silent
    for values in ([], [None], [0.0]):
        assert decide(spec, 0, slots("free", "free", "free"), values, T0 + 60, T0) == \
            ("add", "decode-s1", "0 instance(s), below min 1"), values
    assert decide(spec, 0, slots("draining", "free", "free"), [], T0 + 60, T0)[:2] == \
        ("add", "decode-s2")
    assert decide(spec, 0, slots("pending", "free", "free"), [], T0 + 60, T0) is None  # at min


def test_never_below_min_however_idle(spec):
    assert decide(spec, 0, slots("serving", "free", "free"), [0.0], T0 + 60, T0) is None
    assert decide(spec, 1, slots("serving", "free", "free"), [0.0, 0.0], T0 + 60, T0)[:2] == \
        ("remove", "decode-s1")
    assert decide(AutoscaleRole({**spec.as_json(), "min": 2}), 1, slots("serving", "free", "free"),
                  [0.0, 0.0], T0 + 60, T0) is None


def test_remove_only_when_one_fewer_would_still_read_below_target(spec):
    two = slots("serving", "free", "free")
    # 2 queued over 2 instances: 1 each, below target, but on one instance it would be 2
    assert decide(spec, 1, two, [1.0, 1.0], T0 + 60, T0) is None
    assert decide(spec, 1, two, [1.0, 0.9], T0 + 60, T0) == \
        ("remove", "decode-s1", "queued 1.9 per instance with one fewer < target 2")
    # an instance that did not answer may be the busy one: no remove on a partial reading
    assert decide(spec, 1, two, [0.0, None], T0 + 60, T0) is None


def test_the_newest_serving_slot_drains_first(spec):
    # s1 was submitted last (it had ended and was added again), s2 before it: s1 goes
    three = slots("serving", "serving", "pending", at=(300.0, 200.0, 400.0))
    assert decide(spec, 1, three, [0.0, 0.0, 0.0], T0 + 60, T0)[:2] == ("remove", "decode-s1")
    # a draining or pending slot is never the one removed; same age: the later slot
    three = slots("draining", "serving", "serving", at=(500.0, 0.0, 0.0))
    assert decide(spec, 1, three, [0.0, 0.0, 0.0], T0 + 60, T0)[:2] == ("remove", "decode-s3")


@pytest.mark.parametrize("reply, want", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\nvllm:num_requests_waiting 3\n", 3.0),
    (b"not http at all\r\n\r\n", None),  # http.client.BadStatusLine: not read, no traceback
])
def test_a_bad_metrics_reply_reads_as_no_value(reply, want):
    """An engine whose metrics port answers garbage is one instance not read this round; it
    must not raise into the front's liveness loop (which would end the deployment)."""
    import socket
    import threading
    from hpcserve.runtime.autoscale_decide import signal_value
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer():
        conn, _ = srv.accept()
        conn.recv(4096)
        conn.sendall(reply.replace(b"42", str(len(reply.split(b"\r\n\r\n", 1)[1])).encode()))
        conn.close()

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/metrics"
        assert signal_value(url, "queued", ["vllm:num_requests_waiting"], 5) == want
    finally:
        t.join(5)
        srv.close()
