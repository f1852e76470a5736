"""Helpers for the simulated-engine tests: start processes, end them by their own PID (the router's
process title is `sglang::router`, so names would not even find it), and talk HTTP/SSE."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "hpcserve" / "sim" / "sglang.py"
# -I -S: no site-packages, so a third-party import in the engine fails every test. The engine runs
# on cluster nodes' own python3, so HPCSERVE_SIM_TEST_PYTHON can point the tests at an old one.
ENGINE_PY = os.environ.get("HPCSERVE_SIM_TEST_PYTHON") or sys.executable
ENGINE_CMD = [ENGINE_PY, "-I", "-S", str(ENGINE)]
VLLM_CMD = [ENGINE_PY, "-I", "-S", str(REPO / "hpcserve" / "sim" / "vllm.py"), "serve"]
ROUTER_CMD = [sys.executable, "-m", "sglang_router.launch_router"]
VLLM_ROUTER_CMD = [sys.executable, "-m", "vllm_router.launch_router"]


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("HPCSERVE_SIM_") and k.lower() not in
           ("http_proxy", "https_proxy", "all_proxy", "no_proxy")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Proc:
    def __init__(self, cmd, log_path, env, cwd=None):
        self.cmd = cmd
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                      cwd=cwd, start_new_session=True)
        self.pid = self.popen.pid

    def log(self):
        return Path(self.log_path).read_text(errors="replace")

    def alive(self):
        return self.popen.poll() is None

    def wait(self, timeout):
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.cmd[-1]} still running after {timeout}s; log:\n"
                                 f"{self.log()[-3000:]}")

    def wait_log(self, text, timeout=10):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            if not self.alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in log of pid {self.pid}:\n{self.log()[-3000:]}")

    def stop(self):
        if self.alive():
            self.popen.kill()
        self.popen.wait(10)
        self._log.close()


class Procs:
    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.all = []

    def start(self, cmd, name, env=None, cwd=None):
        p = Proc(cmd, self.tmp / f"{name}.log", env or clean_env(), cwd)
        self.all.append(p)
        return p

    def engine(self, *argv, name="engine", module=False, **env):
        cmd = ([ENGINE_PY, "-m", "hpcserve.sim.sglang"] if module else ENGINE_CMD)
        return self.start(cmd + [str(a) for a in argv], name, clean_env(**env),
                          cwd=REPO if module else None)

    def vllm(self, *argv, name="vllm", **env):
        """The simulated vLLM: `vllm serve` with these arguments."""
        return self.start(VLLM_CMD + [str(a) for a in argv], name, clean_env(**env))

    def vllm_router(self, *argv, name="vllm-router"):
        extra = ["--host", "127.0.0.1", "--prometheus-host", "127.0.0.1",
                 "--prometheus-port", free_port(), "--worker-startup-check-interval", 1,
                 "--policy", "round_robin"]
        return self.start(VLLM_ROUTER_CMD + [str(a) for a in list(argv) + extra], name)

    def router(self, *argv, name="router"):
        extra = ["--prometheus-host", "127.0.0.1", "--prometheus-port", free_port(),
                 "--worker-startup-check-interval", 1, "--log-level", "warn"]
        return self.start(ROUTER_CMD + [str(a) for a in list(argv) + extra], name)

    def close(self):
        for p in reversed(self.all):
            if p.alive() and p.cmd[:3] in (ROUTER_CMD, VLLM_ROUTER_CMD):
                p.popen.terminate()  # let the router shut down cleanly when it can
                try:
                    p.popen.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            p.stop()


def http(method, url, body=None, timeout=30):
    """(status, parsed JSON or text) without raising on HTTP errors."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def sse_events(url, body, timeout=30):
    """POST a streaming request; returns (status, list of data payloads, decoded)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as r:
            status, raw = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, [e.read().decode(errors="replace")]
    events = []
    for line in raw.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return status, events


def content_chunks(events):
    """The chat-completion chunks that carry generated text."""
    return [e for e in events if isinstance(e, dict) and e.get("choices")
            and e["choices"][0].get("delta", {}).get("content")]


def get_status(url, timeout=2):
    """HTTP status, or the connection error's class name when nothing answered."""
    try:
        return http("GET", url, timeout=timeout)[0]
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return type(reason).__name__


def wait_status(url, want=200, timeout=15, proc=None):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = get_status(url)
        if last == want:
            return
        if proc is not None and not proc.alive():
            raise AssertionError(f"process {proc.pid} exited ({proc.popen.returncode}) while "
                                 f"waiting for {url}:\n{proc.log()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"{url} gave {last}, not {want}, within {timeout}s"
                         + (f"; log:\n{proc.log()[-3000:]}" if proc else ""))


def wait_router_ready(router, port, workers, timeout=30):
    url = f"http://127.0.0.1:{port}/readiness"
    deadline = time.monotonic() + timeout
    body = None
    while time.monotonic() < deadline:
        if not router.alive():
            raise AssertionError(f"router exited ({router.popen.returncode}):\n"
                                 f"{router.log()[-3000:]}")
        try:
            status, body = http("GET", url, timeout=2)
            if status == 200 and body.get("healthy_workers") == workers:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"router not ready with {workers} workers: {body}\n{router.log()[-3000:]}")
