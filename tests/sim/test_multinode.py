"""Multi-node rendezvous, HTTP ownership, binding and signal behaviour of the simulated engine."""

import signal
import threading
import time

from simlib import content_chunks, free_port, get_status, http, sse_events, wait_status


def instance_argv(port, dist_port, nnodes, rank, host="127.0.0.1", dist_host="127.0.0.1", tp=16):
    # The argv hpcserve renders: identical on every node except --node-rank.
    return ["--model-path", "/models/Kimi-K2", "--served-model-name", "kimi-k2",
            "--trust-remote-code", "--host", host, "--port", port,
            "--dist-init-addr", f"{dist_host}:{dist_port}", "--nnodes", nnodes,
            "--node-rank", rank, "--tp-size", tp, "--attn-dp-size", tp,
            "--moe-a2a-backend", "deepep", "--deepep-mode", "low_latency"]


def test_two_node_instance_serves_only_on_rank0_and_dies_with_its_peer(procs):
    port, dist, boot = free_port(), free_port(), free_port()
    pd = ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", boot]
    # Rank 1 first, with the very same --host/--port: if it bound HTTP, rank 0 could not.
    r1 = procs.engine(*instance_argv(port, dist, 2, 1), *pd, name="rank1")
    r1.wait_log("connecting to 127.0.0.1:")
    time.sleep(0.3)
    assert get_status(f"http://127.0.0.1:{port}/health") == "ConnectionRefusedError"
    assert get_status(f"http://127.0.0.1:{boot}/health") == "ConnectionRefusedError"
    r0 = procs.engine(*instance_argv(port, dist, 2, 0), *pd, name="rank0")
    wait_status(f"http://127.0.0.1:{port}/health", 200, proc=r0)
    r0.wait_log("The server is fired up and ready to roll!")
    r1.wait_log("joined 127.0.0.1:")
    assert get_status(f"http://127.0.0.1:{boot}/health") == 200  # rank 0's bootstrap server
    status, info = http("GET", f"http://127.0.0.1:{port}/server_info")
    assert status == 200
    assert (info["nnodes"], info["node_rank"], info["tp_size"], info["served_model_name"],
            info["disaggregation_mode"], info["disaggregation_bootstrap_port"]) == \
        (2, 0, 16, "kimi-k2", "prefill", boot)
    # Rank >= 1 ignores SIGTERM (SGLang waits for rank 0's ShutdownReq) ...
    r1.popen.send_signal(signal.SIGTERM)
    r1.wait_log("ignoring it")
    time.sleep(0.3)
    assert r1.alive() and r0.alive()
    # ... but a peer that dies takes the leader down within about a second.
    r1.popen.kill()
    t0 = time.monotonic()
    assert r0.wait(5) != 0
    assert time.monotonic() - t0 < 2.0
    assert "lost node rank 1" in r0.log()


def test_leader_crash_ends_every_peer(procs):
    port, dist = free_port(), free_port()
    r0 = procs.engine(*instance_argv(port, dist, 3, 0), name="rank0")
    peers = [procs.engine(*instance_argv(port, dist, 3, r), name=f"rank{r}") for r in (1, 2)]
    wait_status(f"http://127.0.0.1:{port}/health", 200, proc=r0)
    r0.popen.kill()
    t0 = time.monotonic()
    for p in peers:
        assert p.wait(5) != 0
        assert "lost connection to node rank 0" in p.log()
    assert time.monotonic() - t0 < 2.0


def test_leader_sigterm_drains_then_peers_exit(procs):
    port, dist = free_port(), free_port()
    argv = instance_argv(port, dist, 2, 0)
    r0 = procs.engine(*argv, name="rank0", HPCSERVE_SIM_DECODE_S_PER_TOKEN=0.05)
    r1 = procs.engine(*instance_argv(port, dist, 2, 1), name="rank1")
    wait_status(f"http://127.0.0.1:{port}/health", 200, proc=r0)
    result = {}
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 20, "stream": True}
    t = threading.Thread(target=lambda: result.update(
        r=sse_events(f"http://127.0.0.1:{port}/v1/chat/completions", body)))
    t.start()
    time.sleep(0.3)  # the stream is in flight (20 tokens x 50 ms)
    r0.popen.send_signal(signal.SIGTERM)
    r0.wait_log("gracefully exiting")
    assert get_status(f"http://127.0.0.1:{port}/health") == 503
    t.join(10)
    status, events = result["r"]
    assert status == 200 and events[-1] == "[DONE]"
    assert len(content_chunks(events)) == 20
    assert r0.wait(5) == 0
    assert r1.wait(5) == 0
    assert "ShutdownReq" in r1.log()


def test_peer_with_wrong_dist_init_addr_times_out(procs):
    nobody = free_port()
    r1 = procs.engine(*instance_argv(free_port(), nobody, 2, 1), name="rank1",
                      HPCSERVE_SIM_INIT_TIMEOUT=1.5)
    assert r1.wait(10) != 0
    log = r1.log()
    assert f"timed out after 1.5s connecting to 127.0.0.1:{nobody}" in log
    assert "torch.distributed init failed" in log


def test_leader_times_out_naming_missing_ranks(procs):
    port, dist = free_port(), free_port()
    r0 = procs.engine(*instance_argv(port, dist, 3, 0), name="rank0", HPCSERVE_SIM_INIT_TIMEOUT=1.5)
    r1 = procs.engine(*instance_argv(port, dist, 3, 1), name="rank1", HPCSERVE_SIM_INIT_TIMEOUT=1.5)
    assert r0.wait(10) != 0
    assert f"timed out waiting for ranks [2] at 127.0.0.1:{dist}" in r0.log()
    assert r1.wait(10) != 0
    assert "timed out waiting for ranks [2]" in r1.log()


def test_duplicate_rank_fails_every_side(procs):
    port, dist = free_port(), free_port()
    r0 = procs.engine(*instance_argv(port, dist, 3, 0), name="rank0")
    a = procs.engine(*instance_argv(port, dist, 3, 1), name="rank1a")
    r0.wait_log("node rank 1 joined")
    b = procs.engine(*instance_argv(port, dist, 3, 1), name="rank1b")
    for p in (r0, a, b):
        assert p.wait(10) != 0
        assert "duplicate node rank 1" in p.log()


def test_nnodes_mismatch_fails_both_sides(procs):
    port, dist = free_port(), free_port()
    r0 = procs.engine(*instance_argv(port, dist, 2, 0), name="rank0")
    r1 = procs.engine(*instance_argv(port, dist, 4, 1), name="rank1")
    for p in (r0, r1):
        assert p.wait(10) != 0
        assert "expected 2 nodes, peer rank 1 says 4" in p.log()


def test_rank_out_of_range_fails_both_sides(procs):
    port, dist = free_port(), free_port()
    r0 = procs.engine(*instance_argv(port, dist, 2, 0), name="rank0")
    r2 = procs.engine(*instance_argv(port, dist, 2, 2), name="rank2")
    for p in (r0, r2):
        assert p.wait(10) != 0
        assert "node rank 2 out of range for nnodes 2" in p.log()


def test_same_port_twice_fails_the_second(procs):
    port = free_port()
    first = procs.engine("--model-path", "/m", "--port", port, name="first")
    wait_status(f"http://127.0.0.1:{port}/health", 200, proc=first)
    second = procs.engine("--model-path", "/m", "--port", port, name="second")
    assert second.wait(10) != 0
    assert f"{port}" in second.log() and "Address already in use" in second.log()
    assert first.alive()


def test_tp_size_mismatch_fails(procs):
    port, dist = free_port(), free_port()
    r0 = procs.engine(*instance_argv(port, dist, 2, 0, tp=16), name="rank0")
    r1 = procs.engine(*instance_argv(port, dist, 2, 1, tp=8), name="rank1")
    for p in (r0, r1):
        assert p.wait(10) != 0
        assert "tp_size mismatch" in p.log()


def test_binding_a_non_local_address_fails(procs):
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
    http_bad = procs.engine("--model-path", "/m", "--host", "192.0.2.1", "--port", free_port(),
                            name="http")
    dist_bad = procs.engine(*instance_argv(free_port(), free_port(), 2, 0, dist_host="192.0.2.1"),
                            name="dist")
    assert http_bad.wait(10) != 0
    assert "cannot bind 192.0.2.1" in http_bad.log() and "HTTP server" in http_bad.log()
    assert dist_bad.wait(10) != 0
    assert "cannot bind 192.0.2.1" in dist_bad.log() and "dist-init-addr" in dist_bad.log()


def test_port_refused_during_startup_delay_then_ready(procs):
    port = free_port("127.0.0.2")
    p = procs.engine("--model-path", "/m", "--host", "127.0.0.2", "--port", port,
                     name="delay", HPCSERVE_SIM_STARTUP_DELAY=1.0)
    time.sleep(0.4)
    assert get_status(f"http://127.0.0.2:{port}/health") == "ConnectionRefusedError"
    assert "fired up" not in p.log()
    wait_status(f"http://127.0.0.2:{port}/health", 200, proc=p)
    assert "The server is fired up and ready to roll!" in p.log()


def test_faults(procs):
    ports = [free_port() for _ in range(3)]
    crash = procs.engine("--model-path", "/m", "--port", ports[0], name="crash",
                         HPCSERVE_SIM_FAULT="exit:7:0.5")
    sick = procs.engine("--model-path", "/m", "--port", ports[1], name="sick",
                        HPCSERVE_SIM_FAULT="unhealthy")
    hang = procs.engine("--model-path", "/m", "--port", ports[2], name="hang",
                        HPCSERVE_SIM_FAULT="hang:0.8", HPCSERVE_SIM_FAULT_RANKS="0")
    wait_status(f"http://127.0.0.1:{ports[2]}/health", 200, proc=hang)
    sick.wait_log("fired up")
    assert get_status(f"http://127.0.0.1:{ports[1]}/health") == 503
    assert crash.wait(5) == 7
    time.sleep(0.8)
    assert get_status(f"http://127.0.0.1:{ports[2]}/health", timeout=1) == "TimeoutError"
    hang.popen.send_signal(signal.SIGTERM)  # a wedged server does not exit on SIGTERM
    time.sleep(0.3)
    assert hang.alive()


def test_fault_on_peer_rank_only(procs):
    port, dist = free_port(), free_port()
    env = {"HPCSERVE_SIM_FAULT": "exit:3:1.0", "HPCSERVE_SIM_FAULT_RANKS": "1"}
    r0 = procs.engine(*instance_argv(port, dist, 2, 0), name="rank0", **env)
    r1 = procs.engine(*instance_argv(port, dist, 2, 1), name="rank1", **env)
    wait_status(f"http://127.0.0.1:{port}/health", 200, proc=r0)
    assert r1.wait(5) == 3
    assert r0.wait(3) != 0
    assert "lost node rank 1" in r0.log()
