"""The simulated engine behind the real sglang-router 0.3.2, in PD and in plain mode."""

import threading
import time
from types import SimpleNamespace

import pytest

from simlib import (Procs, content_chunks, free_port, http, sse_events, wait_router_ready,
                    wait_status)

PREFILL_S_PER_TOKEN = 0.02


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    """One prefill and one decode instance sharing a bootstrap port number, as real deployments
    usually do, so that the router's `bootstrap_port: null` case resolves on the decode side."""
    ps = Procs(tmp_path_factory.mktemp("pd"))
    try:  # processes started before a failing readiness wait must still be ended
        p_port, d_port, boot = free_port(), free_port(), free_port()
        common = ["--model-path", "/models/Kimi-K2", "--served-model-name", "kimi-k2",
                  "--trust-remote-code", "--host", "127.0.0.1", "--tp-size", 1,
                  "--disaggregation-transfer-backend", "mooncake",
                  "--disaggregation-ib-device", "mlx5_0", "--disaggregation-bootstrap-port", boot]
        prefill = ps.engine(*common, "--port", p_port, "--disaggregation-mode", "prefill",
                            name="prefill", HPCSERVE_SIM_PREFILL_S_PER_TOKEN=PREFILL_S_PER_TOKEN)
        decode = ps.engine(*common, "--port", d_port, "--disaggregation-mode", "decode",
                           name="decode", HPCSERVE_SIM_BOOTSTRAP_TIMEOUT=2)
        wait_status(f"http://127.0.0.1:{p_port}/health", 200, proc=prefill)
        wait_status(f"http://127.0.0.1:{d_port}/health", 200, proc=decode)
        ns = SimpleNamespace(prefill=prefill, decode=decode, boot=boot,
                             prefill_url=f"http://127.0.0.1:{p_port}",
                             decode_url=f"http://127.0.0.1:{d_port}")

        def router(boot_arg, *extra, name="router"):
            """A PD router over both workers; boot_arg None means `--prefill URL` alone."""
            port = free_port()
            prefill_arg = [ns.prefill_url] + ([boot_arg] if boot_arg is not None else [])
            r = ps.router("--pd-disaggregation", "--prefill", *prefill_arg,
                          "--decode", ns.decode_url, "--host", "127.0.0.1", "--port", port,
                          "--policy", "round_robin", *extra, name=name)
            wait_router_ready(r, port, workers=2)
            return f"http://127.0.0.1:{port}"

        ns.router = router
        ns.url = router(boot)
        yield ns
    finally:
        ps.close()


def chat(n, stream=False, words=3, **extra):
    body = {"model": "kimi-k2", "max_tokens": n, "stream": stream,
            "messages": [{"role": "user", "content": " ".join(["word"] * words)}]}
    body.update(extra)
    return body


def test_chat_completion_returns_exactly_max_tokens(pd):
    status, resp = http("POST", pd.url + "/v1/chat/completions", chat(7, words=20))
    assert status == 200, resp
    assert resp["usage"] == {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}
    assert resp["choices"][0]["message"]["content"].split() == [f"tok{i}" for i in range(7)]
    assert resp["choices"][0]["finish_reason"] == "length"


def test_streamed_chat_counts_tokens_and_usage(pd):
    status, events = sse_events(pd.url + "/v1/chat/completions",
                                chat(9, stream=True, stream_options={"include_usage": True}))
    assert status == 200, events
    assert events[-1] == "[DONE]"
    assert len(content_chunks(events)) == 9
    assert events[-2]["usage"]["completion_tokens"] == 9
    assert any(e["choices"] and e["choices"][0]["finish_reason"] == "length" for e in events[:-1])


def test_streamed_chat_without_usage_option(pd):
    status, events = sse_events(pd.url + "/v1/chat/completions", chat(4, stream=True))
    assert status == 200 and events[-1] == "[DONE]"
    assert len(content_chunks(events)) == 4


def test_generate_and_completions(pd):
    status, resp = http("POST", pd.url + "/generate",
                        {"text": "the quick brown fox", "sampling_params": {"max_new_tokens": 5}})
    assert status == 200, resp
    assert resp["meta_info"]["completion_tokens"] == 5
    assert resp["meta_info"]["prompt_tokens"] == 4
    assert len(resp["output_ids"]) == 5
    status, events = sse_events(pd.url + "/generate", {"text": "a b", "stream": True,
                                                       "sampling_params": {"max_new_tokens": 6}})
    assert status == 200 and events[-1] == "[DONE]" and len(events) == 7
    assert events[-2]["meta_info"]["completion_tokens"] == 6
    status, resp = http("POST", pd.url + "/v1/completions",
                        {"model": "kimi-k2", "prompt": "a b", "max_tokens": 3})
    assert status == 200, resp
    assert resp["usage"]["completion_tokens"] == 3


def test_null_bootstrap_port_uses_decode_own_port(pd):
    # `--prefill URL` without a port: the router sends bootstrap_port null and the decode falls
    # back to its own --disaggregation-bootstrap-port, which here matches the prefill's.
    url = pd.router(None, name="router-null")
    status, resp = http("POST", url + "/v1/chat/completions", chat(3))
    assert status == 200, resp
    assert resp["usage"]["completion_tokens"] == 3


def test_wrong_bootstrap_port_fails_in_the_bootstrap_fetch(pd):
    wrong = free_port()
    url = pd.router(wrong, "--disable-retries", "--disable-circuit-breaker", name="router-wrong")
    status, resp = http("POST", url + "/v1/chat/completions", chat(3))
    assert status == 500, resp
    msg = str(resp)
    assert "KV transfer failed" in msg and f"bootstrap server http://127.0.0.1:{wrong}" in msg
    assert f"bootstrap server http://127.0.0.1:{wrong}" in pd.decode.log()
    # Streamed, the decode fails before its first byte, so the client gets no tokens either.
    status, events = sse_events(url + "/v1/chat/completions", chat(3, stream=True))
    assert status == 500 and "KV transfer failed" in str(events) and not content_chunks(events)


def test_decode_and_prefill_reject_requests_without_bootstrap_info(pd):
    for url in (pd.decode_url, pd.prefill_url):
        status, resp = http("POST", url + "/v1/chat/completions", chat(3))
        assert status == 400
        assert "bootstrap_room" in resp["message"]


def test_decode_waits_for_the_prefill_room(pd):
    def body(room):
        return {"text": "x y", "sampling_params": {"max_new_tokens": 2}, "bootstrap_room": room,
                "bootstrap_host": "127.0.0.1", "bootstrap_port": pd.boot}

    # A room no prefill ever computes: the decode waits out its timeout and emits nothing.
    t0 = time.monotonic()
    status, resp = http("POST", pd.decode_url + "/generate", body(12345))
    assert status == 500
    assert "room not registered yet" in resp["error"]["message"]
    assert time.monotonic() - t0 >= 1.9  # HPCSERVE_SIM_BOOTSTRAP_TIMEOUT=2
    # Decode first, prefill later (the router's fan-out gives no order): decode holds until then.
    result = {}
    t = threading.Thread(target=lambda: result.update(r=http("POST", pd.decode_url + "/generate",
                                                             body(777))))
    t.start()
    time.sleep(0.5)
    assert t.is_alive() and not result
    assert http("POST", pd.prefill_url + "/generate", body(777))[0] == 200
    t.join(5)
    status, resp = result["r"]
    assert status == 200 and resp["meta_info"]["completion_tokens"] == 2


def test_plain_mode_with_worker_urls(procs):
    port = free_port()
    worker = procs.engine("--model-path", "/models/Kimi-K2", "--served-model-name", "kimi-k2",
                          "--host", "127.0.0.1", "--port", port, name="worker", module=True)
    wait_status(f"http://127.0.0.1:{port}/health", 200, proc=worker)
    rport = free_port()
    r = procs.router("--worker-urls", f"http://127.0.0.1:{port}", "--host", "127.0.0.1",
                     "--port", rport, "--policy", "round_robin")
    wait_router_ready(r, rport, workers=1)
    url = f"http://127.0.0.1:{rport}"
    status, resp = http("POST", url + "/v1/chat/completions", chat(6))
    assert status == 200, resp
    assert resp["usage"]["completion_tokens"] == 6
    status, events = sse_events(url + "/v1/chat/completions", chat(5, stream=True))
    assert len(content_chunks(events)) == 5
    status, resp = http("POST", url + "/generate",
                        {"text": "hi", "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and resp["meta_info"]["completion_tokens"] == 4
    status, workers = http("GET", url + "/workers")
    assert workers["workers"][0]["model_id"] == "kimi-k2"
