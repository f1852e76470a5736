"""hpcserve_runtime's RouterWorkers against the real routers, in the modes hpcserve starts them:
a worker taken out gets no more requests while the others serve every one; put back, it gets
requests again. The simulated engines log each request they answer ("POST /v1/... 200"), which
tells where the router sent it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from hpcserve import engines
from hpcserve.runtime.workers import KINDS, RouterWorkers, WorkerApiError
from hpcserve.author.words import show
from simlib import (ROUTER_CMD, VLLM_ROUTER_CMD, free_port, http, wait_router_ready,
                    wait_status)

CHAT = {"model": "kimi-k2", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
SG_COMMON = ["--model-path", "/models/Kimi-K2", "--served-model-name", "kimi-k2",
             "--host", "127.0.0.1"]


def answered(proc) -> int:
    """Generation requests the simulated engine answered (health checks are not logged)."""
    return sum('"POST /' in line for line in proc.log().splitlines())


def chat_all(url, n):
    statuses = [http("POST", url + "/v1/chat/completions", CHAT)[0] for _ in range(n)]
    assert statuses == [200] * n, statuses


class Traffic:
    """Requests sent one after another through the router while workers change: none may
    fail, since another worker of every role is serving throughout."""

    def __init__(self, url):
        self.url, self.results, self.stop = url, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            self.results.append(http("POST", self.url + "/v1/chat/completions", CHAT))

    def settle(self, timeout=30):
        """Until a request that started after this call has been answered: the one that may
        have been on its way to a worker while it was taken out is over by then."""
        n = len(self.results)
        deadline = time.monotonic() + timeout
        while len(self.results) < n + 2 and time.monotonic() < deadline:
            time.sleep(0.01)

    def check(self):
        self.stop.set()
        self.thread.join(30)
        failed = [r for r in self.results if r[0] != 200]
        assert self.results and not failed, failed[:3]


def take_out_and_put_back(rw, router_url, out, others, role, boot=None):
    """The recovery sequence: remove `out`, serve through `others`, add `out` back."""
    url = out.url
    traffic = Traffic(router_url)
    rw.remove(url)
    assert url not in rw.listed()
    traffic.settle()
    before, others_before = answered(out.proc), sum(answered(o.proc) for o in others)
    chat_all(router_url, 6)
    assert out.proc.alive(), "the removed worker must still run: it is the router that skips it"
    assert answered(out.proc) == before, "a request reached the removed worker"
    assert sum(answered(o.proc) for o in others) >= others_before + 6
    rw.add(url, role, boot)
    assert url in rw.listed()
    chat_all(router_url, 6)
    assert answered(out.proc) > before, "no request reached the worker put back"
    traffic.check()


class W:
    def __init__(self, proc, port):
        self.proc, self.url = proc, f"http://127.0.0.1:{port}"


def sglang_worker(procs, name, *argv):
    port = free_port()
    p = procs.engine(*SG_COMMON, "--port", port, *argv, name=name)
    wait_status(f"http://127.0.0.1:{port}/health", proc=p)
    return W(p, port)


def sglang_pd(procs):
    """Two prefill (each with its own bootstrap port) and two decode instances behind
    sglang-router in PD mode, as SGLangRouter.argv starts it."""
    boots = [free_port(), free_port()]
    pd = ["--disaggregation-transfer-backend", "mooncake", "--disaggregation-ib-device", "mlx5_0"]
    prefill = [sglang_worker(procs, f"prefill{i}", *pd, "--disaggregation-mode", "prefill",
                             "--disaggregation-bootstrap-port", b) for i, b in enumerate(boots)]
    # a decode's own bootstrap port is only its fallback when the router sends none
    decode = [sglang_worker(procs, f"decode{i}", *pd, "--disaggregation-mode", "decode",
                            "--disaggregation-bootstrap-port", boots[0]) for i in range(2)]
    port = free_port()
    args = ["--pd-disaggregation"]
    for w, b in zip(prefill, boots):
        args += ["--prefill", w.url, b]
    for w in decode:
        args += ["--decode", w.url]
    r = procs.router(*args, "--host", "127.0.0.1", "--port", port, "--policy", "round_robin")
    wait_router_ready(r, port, workers=4)
    return f"http://127.0.0.1:{port}", prefill, decode, boots


def test_sglang_pd_takes_a_prefill_out_and_puts_it_back(procs):
    url, prefill, decode, boots = sglang_pd(procs)
    rw = RouterWorkers("queued", url)
    assert rw.live and sorted(rw.listed()) == sorted(w.url for w in prefill + decode)
    # Its requests succeed once it is back only if the router hands the decodes its own
    # bootstrap port (theirs is prefill 0's): a decode fails the request without that KV.
    take_out_and_put_back(rw, url, prefill[1], [prefill[0]], "prefill", boots[1])


def test_sglang_pd_takes_a_decode_out_and_puts_it_back(procs):
    url, prefill, decode, _ = sglang_pd(procs)
    take_out_and_put_back(RouterWorkers("queued", url), url, decode[0], [decode[1]], "decode")


def test_sglang_pd_with_no_prefill_left_answers_503_at_once(procs):
    # What a role with no worker left means to clients: the router answers at once, 503.
    url, prefill, _, _ = sglang_pd(procs)
    rw = RouterWorkers("queued", url)
    for w in prefill:
        rw.remove(w.url)
    status, body = http("POST", url + "/v1/chat/completions", CHAT, timeout=5)
    assert status == 503 and "No prefill workers available" in json.dumps(body)


def sglang_plain(procs):
    workers = [sglang_worker(procs, f"worker{i}") for i in range(2)]
    port = free_port()
    r = procs.router("--worker-urls", *[w.url for w in workers], "--host", "127.0.0.1",
                     "--port", port, "--policy", "round_robin")
    wait_router_ready(r, port, workers=2)
    return f"http://127.0.0.1:{port}", workers


def test_sglang_plain_takes_a_worker_out_and_puts_it_back(procs):
    url, workers = sglang_plain(procs)
    take_out_and_put_back(RouterWorkers("queued", url), url, workers[0], [workers[1]], "worker")


def test_sglang_removing_an_unlisted_worker_is_fine_and_a_refused_add_raises(procs):
    url, workers = sglang_plain(procs)
    rw = RouterWorkers("queued", url)
    rw.remove(f"http://127.0.0.1:{free_port()}")
    rw.remove(workers[0].url)
    rw.remove(workers[0].url)  # twice: the second finds it out already
    assert rw.listed() == [workers[1].url]
    rw.add(workers[1].url, "worker")  # listed already: nothing to do, no "already exists"
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WorkerApiError, match=f"{nobody} not listed by the router 1s after"):
        rw.add(nobody, "worker", wait=1)


def test_sglang_a_failed_add_job_raises_with_the_routers_words(procs):
    w = sglang_worker(procs, "worker0")
    port = free_port()
    r = procs.router("--worker-urls", w.url, "--host", "127.0.0.1", "--port", port,
                     "--policy", "round_robin", "--worker-startup-timeout-secs", 1)
    wait_router_ready(r, port, workers=1)
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WorkerApiError, match="health checks failed for " + nobody):
        RouterWorkers("queued", f"http://127.0.0.1:{port}").add(nobody, "worker", wait=20)


def vllm_plain(procs):
    workers = []
    for i in range(2):
        port = free_port()
        p = procs.vllm("/models/k2", "--served-model-name", "kimi-k2", "--host", "127.0.0.1",
                       "--port", port, name=f"worker{i}")
        wait_status(f"http://127.0.0.1:{port}/health", proc=p)
        workers.append(W(p, port))
    port = free_port()
    r = procs.vllm_router("--worker-urls", *[w.url for w in workers], "--port", port,
                          "--worker-startup-timeout-secs", 3)
    wait_status(f"http://127.0.0.1:{port}/readiness", proc=r, timeout=30)
    return f"http://127.0.0.1:{port}", workers


def test_vllm_plain_takes_a_worker_out_and_puts_it_back(procs):
    url, workers = vllm_plain(procs)
    rw = RouterWorkers("direct", url)
    assert rw.live
    take_out_and_put_back(rw, url, workers[1], [workers[0]], "worker")


def test_vllm_plain_removing_an_unlisted_worker_is_fine_and_a_refused_add_raises(procs):
    url, workers = vllm_plain(procs)
    rw = RouterWorkers("direct", url)
    rw.remove(f"http://127.0.0.1:{free_port()}")
    rw.add(workers[0].url, "worker")  # listed already
    nobody = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WorkerApiError, match=f"HTTP 400 .*Timeout 3s waiting for worker {nobody}"):
        rw.add(nobody, "worker", wait=20)
    assert nobody not in rw.listed()


def test_vllm_pd_router_removes_but_cannot_add_so_its_kind_is_remove_only(procs):
    """vllm-router 0.1.17 in PD mode, as VLLMRouter.argv starts it, takes a worker out at once
    but refuses to add one: the plan says "remove-only", whose RouterWorkers removes and is not
    live (a replacement goes in by restarting the router)."""
    ports = [free_port(), free_port()]
    for port, role in zip(ports, ("kv_producer", "kv_consumer")):
        kv = json.dumps({"kv_connector": "NixlConnector", "kv_role": role})
        p = procs.vllm("/models/k2", "--served-model-name", "kimi-k2", "--host", "127.0.0.1",
                       "--port", port, "--kv-transfer-config", kv, name=role,
                       VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
                       VLLM_NIXL_SIDE_CHANNEL_PORT=free_port())
        wait_status(f"http://127.0.0.1:{port}/health", proc=p)
    rport = free_port()
    r = procs.vllm_router("--vllm-pd-disaggregation", "--prefill", f"http://127.0.0.1:{ports[0]}",
                          "--decode", f"http://127.0.0.1:{ports[1]}", "--port", rport)
    url = f"http://127.0.0.1:{rport}"
    wait_status(url + "/readiness", proc=r, timeout=30)
    extra = f"http://127.0.0.1:{free_port()}"
    status, body = http("POST", url + "/workers", {"url": extra, "worker_type": "prefill"})
    assert status == 400 and "PD router requires specific add_prefill_server" in body["error"]
    assert engines.get("vllm").router_for(True).workers_api(True) == "remove-only"
    rw = RouterWorkers("remove-only", url)
    assert rw.live is False and rw.removes
    with pytest.raises(WorkerApiError, match="restart it with the new set"):
        rw.add(extra, "prefill", None)
    rw.remove(f"http://127.0.0.1:{ports[0]}")  # the only prefill: PD has nothing to route to
    status, body = http("POST", url + "/v1/completions",
                        {"model": "kimi-k2", "prompt": "hi", "max_tokens": 2})
    assert status == 503 and "0 prefill" in json.dumps(body), (status, body)
    gone = RouterWorkers("restart", url)
    assert not gone.removes and not gone.live
    with pytest.raises(WorkerApiError, match="cannot remove a worker while it runs"):
        gone.remove(extra)


def started_empty(procs, engine: str, pd: bool):
    """The router as hpcserve starts it for a front with no engine of its own (every role's
    instances: 0, its autoscale slots join later): its argv from the adapter, no worker URL.
    Its /readiness answers 503 until a worker is healthy; its worker API's listing answers 200
    (what health.wait_router waits for then)."""
    port, prom = free_port(), free_port()
    router = engines.get(engine).router_for(pd)
    argv = router.argv(pd=pd, prefill=[], decode=[], workers=[], port=port,
                       prometheus_port=prom, policy="round_robin", args={}, start_timeout=60)
    cmd = ROUTER_CMD if engine == "sglang" else VLLM_ROUTER_CMD
    # the router's node address, as run/endpoints.env gives it: here the loopback's
    r = procs.start(cmd + [show(a, {"ROUTER_IP": "127.0.0.1"}) for a in argv],
                    f"{router.name}-empty")
    url = f"http://127.0.0.1:{port}"
    wait_status(url + "/workers", proc=r, timeout=30)
    assert http("GET", url + "/readiness")[0] == 503
    rw = RouterWorkers(router.workers_api(pd), url)
    assert rw.live and rw.listed() == []
    return url, rw


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_a_router_started_with_no_worker_takes_one_through_its_worker_api(procs, engine):
    url, rw = started_empty(procs, engine, pd=False)
    if engine == "sglang":
        w = sglang_worker(procs, "worker0")
    else:
        port = free_port()
        p = procs.vllm("/models/k2", "--served-model-name", "kimi-k2", "--host", "127.0.0.1",
                       "--port", port, name="worker0")
        wait_status(f"http://127.0.0.1:{port}/health", proc=p)
        w = W(p, port)
    rw.add(w.url, "worker")
    assert rw.listed() == [w.url]
    chat_all(url, 3)
    assert answered(w.proc) >= 3


def test_sglang_pd_router_started_with_no_worker_takes_a_prefill_and_a_decode(procs):
    url, rw = started_empty(procs, "sglang", pd=True)
    boot = free_port()
    pd = ["--disaggregation-transfer-backend", "mooncake", "--disaggregation-ib-device", "mlx5_0"]
    prefill = sglang_worker(procs, "prefill0", *pd, "--disaggregation-mode", "prefill",
                            "--disaggregation-bootstrap-port", boot)
    decode = sglang_worker(procs, "decode0", *pd, "--disaggregation-mode", "decode",
                           "--disaggregation-bootstrap-port", free_port())
    rw.add(prefill.url, "prefill", boot)
    rw.add(decode.url, "decode")
    assert sorted(rw.listed()) == sorted([prefill.url, decode.url])
    # the decode's own bootstrap port is wrong: a request succeeds only with the prefill's,
    # which the router learned from the add
    chat_all(url, 3)
    assert answered(prefill.proc) >= 3 and answered(decode.proc) >= 3


@pytest.mark.parametrize("name", engines.names())
@pytest.mark.parametrize("pd", [False, True])
def test_every_router_names_a_workers_api_the_runtime_knows(name, pd):
    api = engines.get(name).router_for(pd).workers_api(pd)
    assert api in KINDS
    want = {"sglang": "queued", "ktransformers": "queued",
            "vllm": "remove-only" if pd else "direct"}
    assert api == want.get(name, "restart"), (name, pd, api)


class Stalled:
    """The router stopped (SIGSTOP) for `seconds`, as a loaded node starves it: it accepts
    connections (the kernel queues them) but answers nothing until it runs again."""

    def __init__(self, router, seconds):
        self.router, self.seconds = router, seconds

    def __enter__(self):
        os.kill(self.router.pid, signal.SIGSTOP)
        self.timer = threading.Timer(self.seconds, os.kill, (self.router.pid, signal.SIGCONT))
        self.timer.start()
        self.at = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        os.kill(self.router.pid, signal.SIGCONT)
        # the change waited for the router rather than failing at its first lost answer
        assert time.monotonic() - self.at >= self.seconds


@pytest.mark.parametrize("kind", ["queued", "direct"])
def test_a_change_outlasts_a_router_that_answers_nothing_for_longer_than_a_call(procs, kind):
    """One call's timeout (2 s) is no deadline: a router stalled for 3 s is asked again, and
    the worker goes out and back in within the change's own wait."""
    url, workers = (sglang_plain if kind == "queued" else vllm_plain)(procs)
    router = procs.all[-1]
    rw = RouterWorkers(kind, url)
    assert rw.timeout < 3
    out = workers[0].url
    with Stalled(router, 3):
        rw.remove(out, wait=30)
    assert rw.listed() == [workers[1].url]
    with Stalled(router, 3):
        rw.add(out, "worker", wait=30)
    assert sorted(rw.listed()) == sorted(w.url for w in workers)
    # a router that never answers again is still told apart, at the change's own deadline
    os.kill(router.pid, signal.SIGSTOP)
    try:
        with pytest.raises(WorkerApiError, match="no answer from the router"):
            rw.remove(out, wait=3)
    finally:
        os.kill(router.pid, signal.SIGCONT)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_which_routers_api_key_guards_its_worker_api(procs, engine):
    """The releases' own answer, without a worker to hide behind: sglang-router 0.3.2 started
    with --api-key answers 401 to GET and POST /workers without it (200 with it); vllm-router
    0.1.17 takes its --api-key for the workers (its help: "authorization with workers") and
    lists and adds workers for anyone. Its worker API stays open: the runtime's reconciling
    of the listed workers (recovery.py) and the node-address bind are what guard it."""
    port = free_port()
    cmd = ROUTER_CMD if engine == "sglang" else VLLM_ROUTER_CMD
    extra = ["--prometheus-host", "127.0.0.1", "--prometheus-port", free_port()]
    r = procs.start(cmd + [str(a) for a in ["--host", "127.0.0.1", "--port", port,
                                             "--api-key", "k-123", "--worker-urls", *extra]],
                    f"{engine}-router-key")
    url = f"http://127.0.0.1:{port}"
    wait_status(url + "/health", proc=r, timeout=30)
    keyed = RouterWorkers("queued", url, headers={"Authorization": "Bearer k-123"})
    assert keyed.listed() == []
    nobody = f"http://127.0.0.1:{free_port()}"
    anyone = RouterWorkers("queued", url)
    if engine == "sglang":
        with pytest.raises(WorkerApiError, match="GET /workers: HTTP 401"):
            anyone.listed()
        with pytest.raises(WorkerApiError, match="POST /workers: HTTP 401"):
            anyone._call("POST", "/workers", {"url": nobody})
    else:
        assert anyone.listed() == []  # no key asked for
        # POST /workers without the key is taken up: the router waits for the worker's
        # health (nobody here answers) instead of answering 401
        with pytest.raises(WorkerApiError) as e:
            RouterWorkers("direct", url, timeout=2)._call("POST", "/workers", {"url": nobody})
        assert "POST /workers: no answer from the router" in str(e.value), e.value


class _Recorder:
    """A worker that answers every request 200 with a small OpenAI-shaped body and records
    each request's path and Authorization header: what the router hands on."""

    def __init__(self):
        import http.server
        seen = self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            def _any(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                seen.append((self.command, self.path.split("?")[0],
                             self.headers.get("Authorization")))
                body = json.dumps({"object": "list", "data": [{"id": "m"}], "choices": [
                    {"index": 0, "text": "x", "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "x"}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                              "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _any

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def generations(self) -> list:
        return [a for m, p, a in self.seen if m == "POST" and p == "/v1/chat/completions"]


@pytest.mark.parametrize("engine,pd", [("sglang", False), ("sglang", True), ("vllm", False),
                                       ("vllm", True)])
def test_what_key_each_router_hands_its_workers(procs, engine, pd):
    """Whether the engines behind a router can ask for the deployment's key
    (RouterAdapter.keys_workers), from the releases themselves: sglang-router 0.3.2 sends its
    own --api-key to every worker, in plain and PD mode; vllm-router 0.1.17 passes the
    client's Authorization on in plain mode, and in PD mode sends both halves "Bearer " with
    no key, which a keyed engine would turn away (so hpcserve keys no engine behind it)."""
    workers = [_Recorder() for _ in range(2 if pd else 1)]
    port = free_port()
    if engine == "sglang":
        mode = (["--pd-disaggregation", "--prefill", workers[0].url, str(free_port()),
                 "--decode", workers[1].url] if pd else ["--worker-urls", workers[0].url])
        cmd = ROUTER_CMD
    else:
        mode = (["--vllm-pd-disaggregation", "--prefill", workers[0].url,
                 "--decode", workers[1].url] if pd else ["--worker-urls", workers[0].url])
        cmd = VLLM_ROUTER_CMD
    r = procs.start(cmd + ["--host", "127.0.0.1", "--port", str(port), "--api-key", "k-router",
                           "--prometheus-host", "127.0.0.1", "--prometheus-port",
                           str(free_port()), *mode], f"{engine}-router-hands-on")
    url = f"http://127.0.0.1:{port}"
    wait_status(url + "/health", proc=r, timeout=30)
    body = json.dumps({"model": "m", "max_tokens": 1,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    import urllib.request
    # sglang-router asks its own key of the client (test_which_routers_api_key_guards_...);
    # vllm-router asks none, so the client's may be any
    client = "k-router" if engine == "sglang" else "k-client"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 30
    while True:  # until the router counts its workers healthy and sends the request on
        req = urllib.request.Request(url + "/v1/chat/completions", body, {
            "Content-Type": "application/json", "Authorization": f"Bearer {client}"})
        try:
            with opener.open(req, timeout=10) as resp:
                assert resp.status == 200
            break
        except OSError:
            assert time.monotonic() < deadline, [w.seen for w in workers]
            time.sleep(0.5)
    got = [a for w in workers for a in w.generations()]
    assert got, [w.seen for w in workers]
    want = {("sglang", False): "Bearer k-router", ("sglang", True): "Bearer k-router",
            ("vllm", False): "Bearer k-client", ("vllm", True): "Bearer "}[engine, pd]
    assert set(got) == {want}, [w.seen for w in workers]
    assert engines.get(engine).router_for(pd).keys_workers(pd) == (want != "Bearer ")


def test_a_worker_added_through_sglang_routers_api_is_asked_with_the_deployments_key(procs):
    """sglang-router 0.3.2 asks a worker added by POST /workers with the key that request
    names, not with its own --api-key: without it, its /server_info and /model_info go keyless
    (which a keyed engine answers 401). The runtime's add names the deployment's key."""
    port = free_port()
    r = procs.start(ROUTER_CMD + ["--host", "127.0.0.1", "--port", str(port), "--api-key", "k-dep",
                                  "--prometheus-host", "127.0.0.1", "--prometheus-port",
                                  str(free_port()), "--worker-urls"], "sglang-router-add-keyed")
    url = f"http://127.0.0.1:{port}"
    wait_status(url + "/health", proc=r, timeout=30)
    bare, keyed = _Recorder(), _Recorder()
    RouterWorkers("queued", url, headers={"Authorization": "Bearer k-dep"}).add(
        keyed.url, "worker", wait=30)
    # the same add without the key in its body: what the router then sends that worker
    api = RouterWorkers("queued", url, headers={"Authorization": "Bearer k-dep"})
    api.worker_key = None
    api.add(bare.url, "worker", wait=30)
    for rec, want in ((keyed, "Bearer k-dep"), (bare, None)):
        asked = {(p, a) for m, p, a in rec.seen if p in ("/server_info", "/model_info")}
        assert asked == {("/server_info", want), ("/model_info", want)}, rec.seen
