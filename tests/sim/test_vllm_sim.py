"""The simulated vLLM fails like vLLM where a launcher can be wrong (addresses, ranks, counts,
--headless, the NIXL side channel) and serves like it otherwise, also behind the real
vllm-router in plain and PD mode."""

from __future__ import annotations

import json

import pytest

from simlib import content_chunks, free_port, get_status, http, sse_events, wait_status

CHAT = {"model": "kimi-k2", "max_tokens": 5, "messages": [{"role": "user", "content": "hi there"}]}


def _tp_pair(procs, port, master, **env):
    common = ["/models/k2", "--served-model-name", "kimi-k2", "--host", "127.0.0.1",
              "--tensor-parallel-size", 16, "--nnodes", 2, "--master-addr", "127.0.0.1",
              "--master-port", master]
    r0 = procs.vllm(*common, "--port", port, "--node-rank", 0, name="r0", **env)
    r1 = procs.vllm(*common, "--port", port + 1, "--node-rank", 1, "--headless", name="r1", **env)
    return r0, r1


def test_tp_across_nodes_serves_on_rank0_only_and_dies_with_its_peer(procs):
    port, master = free_port(), free_port()
    r0, r1 = _tp_pair(procs, port, master)
    wait_status(f"http://127.0.0.1:{port}/health", proc=r0)
    r1.wait_log("headless multiproc executor, with head node address 127.0.0.1:%d" % master)
    assert http("GET", f"http://127.0.0.1:{port}/version")[1] == {"version": "0.33.0"}
    status, body = http("POST", f"http://127.0.0.1:{port}/v1/chat/completions", CHAT)
    assert status == 200 and body["usage"]["completion_tokens"] == 5
    # a headless node runs no API server: its --port refuses connections
    assert get_status(f"http://127.0.0.1:{port + 1}/health") == "ConnectionRefusedError"
    assert "Starting vLLM server" not in r1.log()
    r1.popen.kill()
    assert r0.wait(10) == 1
    assert "lost node rank 1" in r0.log()


def test_rank_above_zero_without_headless_fails_like_vllm(procs):
    port, master = free_port(), free_port()
    common = ["/m", "--host", "127.0.0.1", "--tensor-parallel-size", 2, "--nnodes", 2,
              "--master-addr", "127.0.0.1", "--master-port", master]
    procs.vllm(*common, "--port", port, "--node-rank", 0, name="r0")
    r1 = procs.vllm(*common, "--port", free_port(), "--node-rank", 1, name="r1")
    assert r1.wait(15) == 1
    assert "collective_rpc should not be called on follower node" in r1.log()


def test_wrong_master_addr_times_out_naming_it(procs):
    nobody = free_port()
    r1 = procs.vllm("/m", "--tensor-parallel-size", 2, "--nnodes", 2, "--node-rank", 1,
                    "--headless", "--master-addr", "127.0.0.1", "--master-port", nobody,
                    HPCSERVE_SIM_INIT_TIMEOUT=1.5)
    assert r1.wait(15) == 1
    assert (f"The client socket has timed out after 1500ms while trying to connect to "
            f"(127.0.0.1, {nobody})") in r1.log()


def test_node_rank_out_of_range_is_refused_at_start(procs):
    p = procs.vllm("/m", "--tensor-parallel-size", 2, "--nnodes", 2, "--node-rank", 2,
                   "--headless")
    assert p.wait(10) == 1
    assert "`--node-rank` must be between 0 and 1; got `--node-rank 2`" in p.log()


def _dp(procs, head_port, rpc, start=2, headless_flag=True, head_extra=(), **env):
    common = ["/models/k2", "--served-model-name", "kimi-k2", "--data-parallel-size", 4,
              "--data-parallel-size-local", 2, "--data-parallel-address", "127.0.0.1",
              "--data-parallel-rpc-port", rpc, "--enable-expert-parallel"]
    head = procs.vllm(*common, "--host", "127.0.0.1", "--port", head_port, *head_extra,
                      name="head", **env)
    rest = ["--data-parallel-start-rank", start] + (["--headless"] if headless_flag else [])
    node1 = procs.vllm(*common, "--host", "127.0.0.1", "--port", free_port(), *rest,
                       name="node1", **env)
    return head, node1


def test_dp_head_and_headless_serve_every_rank(procs):
    port, rpc = free_port(), free_port()
    head, node1 = _dp(procs, port, rpc)
    wait_status(f"http://127.0.0.1:{port}/health", proc=head)
    node1.wait_log(f"Launching 2 data parallel engine(s) in headless mode, with head node "
                   f"address tcp://127.0.0.1:{rpc}.")
    metrics = http("GET", f"http://127.0.0.1:{port}/metrics")[1]
    assert sorted(set(ln.split('engine="')[1].split('"')[0] for ln in metrics.splitlines()
                      if ln.startswith("vllm:"))) == ["0", "1", "2", "3"]
    status, events = sse_events(f"http://127.0.0.1:{port}/v1/chat/completions",
                                {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200 and len(content_chunks(events)) == 5
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 5


def test_dp_wrong_start_rank_fails_on_the_head_with_vllms_words(procs):
    # rank 1 is one of the head's own (local size 2): vLLM's head refuses it from a remote
    head, node1 = _dp(procs, free_port(), free_port(), start=1)
    assert head.wait(15) == 1
    assert "HELLO message from remote engine 1, expected it to be local" in head.log()
    assert node1.wait(15) == 1


def test_dp_start_rank_out_of_range_is_refused(procs):
    head, node1 = _dp(procs, free_port(), free_port(), start=4)
    assert node1.wait(10) == 1
    assert "data_parallel_rank (4) must be in the range [0, 4)" in node1.log()


def test_dp_remote_without_headless_is_refused(procs):
    head, node1 = _dp(procs, free_port(), free_port(), headless_flag=False)
    assert head.wait(15) == 1
    assert "Remote engine 2 must use --headless" in head.log()


def test_dp_start_rank_on_the_head_means_hybrid_lb_and_refuses_headless(procs):
    # vLLM 0.33: any --data-parallel-start-rank on the API-server node (0 too) is hybrid LB
    head, node1 = _dp(procs, free_port(), free_port(),
                      head_extra=("--data-parallel-start-rank", 0))
    assert head.wait(15) == 1
    assert "must not use --headless in external or hybrid dp lb mode" in head.log()


def test_dp_address_not_of_this_node_fails_to_bind(procs):
    p = procs.vllm("/m", "--data-parallel-size", 4, "--data-parallel-size-local", 2,
                   "--data-parallel-address", "192.0.2.1", "--data-parallel-rpc-port",
                   free_port(), "--host", "127.0.0.1", "--port", free_port())
    assert p.wait(10) == 1
    assert "cannot bind 192.0.2.1" in p.log() and "data-parallel-address" in p.log()


def _pd(procs, connector="NixlConnector"):
    ports = {k: free_port() for k in ("p", "d", "ps", "ds", "boot")}
    env_p = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
             "VLLM_NIXL_SIDE_CHANNEL_PORT": ports["ps"],
             "VLLM_MOONCAKE_BOOTSTRAP_PORT": ports["boot"]}
    env_d = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
             "VLLM_NIXL_SIDE_CHANNEL_PORT": ports["ds"]}
    kv = lambda role: json.dumps({"kv_connector": connector, "kv_role": role})  # noqa: E731
    p = procs.vllm("/models/k2", "--served-model-name", "kimi-k2", "--host", "127.0.0.1",
                   "--port", ports["p"], "--kv-transfer-config", kv("kv_producer"),
                   name="prefill", **env_p)
    d = procs.vllm("/models/k2", "--served-model-name", "kimi-k2", "--host", "127.0.0.1",
                   "--port", ports["d"], "--kv-transfer-config", kv("kv_consumer"),
                   name="decode", **env_d)
    for port, proc in ((ports["p"], p), (ports["d"], d)):
        wait_status(f"http://127.0.0.1:{port}/health", proc=proc)
    return p, d, ports


def _router_ready(router, port):
    wait_status(f"http://127.0.0.1:{port}/readiness", proc=router, timeout=30)


def test_pd_through_the_real_vllm_router_moves_the_kv_over_the_side_channel(procs):
    p, d, ports = _pd(procs)
    rport = free_port()
    router = procs.vllm_router("--port", rport, "--vllm-pd-disaggregation",
                               "--prefill", f"http://127.0.0.1:{ports['p']}",
                               "--decode", f"http://127.0.0.1:{ports['d']}")
    _router_ready(router, rport)
    url = f"http://127.0.0.1:{rport}/v1/chat/completions"
    status, body = http("POST", url, CHAT)
    assert status == 200 and body["usage"]["completion_tokens"] == 5, body
    status, events = sse_events(url, {**CHAT, "stream": True,
                                      "stream_options": {"include_usage": True}})
    assert status == 200 and len(content_chunks(events)) == 5
    # the decode read each request's blocks from the prefill's side channel
    d.wait_log(f"read from 127.0.0.1:{ports['ps']}")
    assert d.log().count(f"read from 127.0.0.1:{ports['ps']}") == 2


def test_decode_fails_the_request_when_the_side_channel_is_wrong(procs):
    p, d, ports = _pd(procs)
    params = {"do_remote_prefill": True, "remote_engine_id": "x", "remote_request_id": "r",
              "remote_block_ids": [[1]], "remote_host": "127.0.0.1"}
    nobody = free_port()
    status, body = http("POST", f"http://127.0.0.1:{ports['d']}/v1/chat/completions",
                        {**CHAT, "kv_transfer_params": {**params, "remote_port": nobody}})
    assert status == 500 and body["error"]["message"] == "Internal server error"
    assert "handshake_failed" in d.log() and f"'remote_port': {nobody}" in d.log()
    # a side channel that is not the prefill's (the decode's own, as with the default
    # VLLM_NIXL_SIDE_CHANNEL_HOST=localhost on both nodes): another engine answers
    status, _ = http("POST", f"http://127.0.0.1:{ports['d']}/v1/chat/completions",
                     {**CHAT, "kv_transfer_params": {**params, "remote_port": ports["ds"]}})
    assert status == 500 and "Remote NIXL agent engine ID mismatch" in d.log()


def test_pd_with_mooncake_through_the_real_vllm_router(procs):
    p, d, ports = _pd(procs, "MooncakeConnector")
    rport = free_port()
    router = procs.vllm_router("--port", rport, "--vllm-pd-disaggregation",
                               "--kv-connector", "mooncake",
                               "--prefill", f"http://127.0.0.1:{ports['p']}", ports["boot"],
                               "--decode", f"http://127.0.0.1:{ports['d']}")
    _router_ready(router, rport)
    status, body = http("POST", f"http://127.0.0.1:{rport}/v1/chat/completions", CHAT)
    assert status == 200 and body["usage"]["completion_tokens"] == 5, (body, d.log()[-2000:])
    assert f"received from http://127.0.0.1:{ports['boot']}" in d.log()


def test_sigterm_ends_the_head_and_its_headless_node(procs):
    port, rpc = free_port(), free_port()
    head, node1 = _dp(procs, port, rpc)
    wait_status(f"http://127.0.0.1:{port}/health", proc=head)
    head.popen.terminate()
    assert head.wait(10) == 0 and node1.wait(10) == 0


def _status(url: str, key: str | None = None, body: dict | None = None) -> int:
    import json
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, None if body is None else json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  **({"Authorization": f"Bearer {key}"} if key else {})})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_keyed_stand_in_asks_the_key_where_its_release_does(procs, engine):
    """With --api-key the stand-ins answer 401 where the releases do and serve where they
    do not: vLLM 0.32.0 guards /v1, /v2, /inference and /cohere (authenticate.py
    GUARDED_PREFIX), SGLang 0.5.23 all but /health*, /ready* and /metrics* (auth.py
    decide_request_auth); vLLM takes VLLM_API_KEY when --api-key is not given. Neither logs
    the key where its release does not: vLLM redacts it in its args line."""
    port = free_port()
    if engine == "vllm":
        p = procs.vllm("/models/tiny", "--served-model-name", "tiny", "--host", "127.0.0.1",
                       "--port", port, name="keyed", VLLM_API_KEY="k-env-42")
        key, open_paths, guarded = "k-env-42", ["/health", "/metrics", "/version", "/load"], \
            ["/v1/models"]
    else:
        p = procs.engine("--model-path", "/m", "--served-model-name", "tiny", "--host",
                         "127.0.0.1", "--port", port, "--api-key", "k-arg-42", "--enable-metrics",
                         name="keyed")
        key, open_paths, guarded = "k-arg-42", ["/health", "/metrics"], \
            ["/model_info", "/get_server_info", "/v1/models", "/v1/loads?format=prometheus"]
    url = f"http://127.0.0.1:{port}"
    wait_status(url + "/health", proc=p, timeout=30)
    for path in open_paths:
        assert _status(url + path) == 200, path
    for path in guarded:
        assert _status(url + path) == 401, path
        assert _status(url + path, "k-wrong") == 401, path
        assert _status(url + path, key) == 200, path
    chat = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert _status(url + "/v1/chat/completions", None, chat) == 401
    assert _status(url + "/v1/chat/completions", key, chat) == 200
    if engine == "vllm":
        assert key not in p.log() and '"api_key": null' in p.log()
    else:  # the runtime reads SGLang's gauges (/v1/loads) with the deployment's key
        from hpcserve.runtime.probes import metrics_totals
        m = {"url": url + "/metrics", "gauges_url": url + "/v1/loads?format=prometheus",
             "progress": ["sglang:realtime_tokens_total"], "pending": ["sglang_num_running_reqs"]}
        assert metrics_totals(m, 5.0) is None  # turned away: no reading
        assert metrics_totals({**m, "auth": {"Authorization": f"Bearer {key}"}}, 5.0) is not None
