"""The running router's workers: take a failed instance out, put its replacement back, while the
router serves through the others (plan.json's router.workers_api names how).

Kinds, named by how the router answers (tests/sim/test_router_workers.py runs the real ones);
the runtime names no engine, the plan's router adapter picks the kind:
- "queued": sglang-router 0.3.2, plain and PD mode. GET /workers lists {id, url, is_healthy};
  DELETE /workers/{id} and POST /workers {url, worker_type, bootstrap_port, api_key} answer 202
  and queue a job (src/core/job_queue.rs), so both are done only once GET /workers says so; a
  failed job is told by GET /workers/{id} (job_status.status "failed", with the router's words).
- "direct": vllm-router 0.1.17, plain mode. POST /workers {url} answers once the worker is healthy
  (200), or 400 after the router's --worker-startup-timeout-secs; DELETE /workers/{quoted url}
  answers 200 at once, for a URL it does not list too (src/routers/http/router.rs).
- "remove-only": vllm-router 0.1.17 in PD mode: DELETE /workers/{quoted url} takes a worker out
  at once, but adding one is refused ("PD router requires specific add_prefill_server or
  add_decode_server methods", src/routers/http/pd_router.rs): the replacement goes in by a
  restart of the router.
- "restart": the router cannot change its workers while it runs (vllm-router's PD mode refuses
  to add one; TensorRT-LLM's front server reads them from its config file at start): the caller
  restarts it with the new set.

Standard library only: this module ships in the job directory (hpcserve_runtime/).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from .contract import WORKERS_APIS as KINDS  # declared with plan.json's other keys
from .probes import DIRECT

# "queued": the worker_type of each hpcserve role (sglang-router's GET /workers says "regular"
# in plain mode).
WORKER_TYPES = {"prefill": "prefill", "decode": "decode", "worker": "regular"}
POLL_S = 0.02  # a queued change is done within tens of ms (0.3.2)



class WorkerApiError(Exception):
    """The router refused or did not do it; the message carries the router's own words."""


class NoAnswer(WorkerApiError):
    """No answer within one call's timeout, or no connection: a router busy (a loaded node
    starves it for seconds) or gone, which only the caller's deadline tells apart, so a change
    asks again until then."""


class RouterWorkers:
    def __init__(self, kind: str, router_url: str, timeout: float = 2.0,
                 headers: dict | None = None):
        if kind not in KINDS:
            raise ValueError(f"unknown router workers API {kind!r}; expected one of {KINDS}")
        self.kind = kind
        self.url = router_url.rstrip("/")
        self.timeout = timeout
        self.headers = headers or {}  # a router started with --api-key wants it here too
        # The deployment's key is the router's and its engines' alike. sglang-router 0.3.2
        # asks a worker added through its API with the key that request names (api_key), not
        # with its own --api-key: without one it asks the worker's /server_info and
        # /model_info with no key (tests/sim/test_router_workers.py).
        auth = self.headers.get("Authorization", "")
        self.worker_key = auth[len("Bearer "):] if auth.startswith("Bearer ") else None

    @property
    def live(self) -> bool:
        """Whether a worker can be added while the router runs (False: the caller restarts it
        with the new worker set instead)."""
        return self.kind in ("queued", "direct")

    @property
    def removes(self) -> bool:
        """Whether a worker can be taken out while the router runs."""
        return self.kind != "restart"

    def listed(self) -> list[str]:
        """The worker URLs the router lists (GET /workers, alike in both live kinds)."""
        return [w["url"] for w in self._workers()]

    def remove(self, worker_url: str, wait: float = 30.0) -> None:
        """Take `worker_url` out; one the router does not list is already out."""
        if not self.removes:
            raise WorkerApiError(f"the router at {self.url} cannot remove a worker while it "
                                 "runs")
        deadline = time.monotonic() + wait
        if self.kind in ("direct", "remove-only"):
            # answered 200 for a URL it does not list too: asking again is safe
            self._asking(deadline, lambda: self._call(
                "DELETE", "/workers/" + urllib.parse.quote(worker_url, safe="")))
            return
        self._asking(deadline, lambda: self._delete_queued(worker_url))
        self._until(lambda: worker_url not in self.listed(), deadline,
                    f"{worker_url} still listed by the router {wait:g}s after its removal")

    def _delete_queued(self, worker_url: str) -> None:
        for w in self._workers():
            if w["url"] == worker_url:
                # 404: another removal of the same worker finished first.
                self._call("DELETE", f"/workers/{w['id']}", also_ok=(404,))

    def add(self, worker_url: str, role: str, bootstrap_port: int | None = None,
            wait: float = 60.0) -> None:
        """Put `worker_url` (an instance of `role`) in; returns once the router lists it (both
        list a worker only after it answered their health check), raises WorkerApiError when the
        router refused or `wait` seconds went by."""
        self._need_live()
        deadline = time.monotonic() + wait
        job = self._asking(deadline, lambda: self._post(worker_url, role, bootstrap_port,
                                                        deadline))
        if job is not None:
            self._until(lambda: self._job_added(worker_url, job["worker_id"]), deadline,
                        f"{worker_url} not listed by the router {wait:g}s after adding it")

    def _post(self, worker_url: str, role: str, bootstrap_port: int | None,
              deadline: float) -> dict | None:
        """POST /workers unless it is listed (both routers refuse a URL they list: "already
        exists", so a POST whose answer was lost is asked again safely): the queued job, or
        None when there is nothing to wait for."""
        if worker_url in self.listed():
            return None
        if self.kind == "direct":
            # The answer comes once the router saw the worker healthy: wait that long for it.
            self._call("POST", "/workers", {"url": worker_url},
                       timeout=max(self.timeout, deadline - time.monotonic()))
            return None
        body = {"url": worker_url, "worker_type": WORKER_TYPES[role]}
        if bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        if self.worker_key:
            body["api_key"] = self.worker_key
        return self._call("POST", "/workers", body)

    # ---- helpers --------------------------------------------------------------------------
    def _need_live(self) -> None:
        if not self.live:
            raise WorkerApiError(f"the router at {self.url} cannot change its workers while it "
                                 "runs: restart it with the new set")

    def _workers(self) -> list[dict]:
        self._need_live()
        return self._call("GET", "/workers")["workers"]

    def _job_added(self, worker_url: str, job_id: str) -> bool:
        if worker_url in self.listed():
            return True
        # Until the queued job ends, GET /workers/{id} answers with its status.
        status = (self._call("GET", f"/workers/{job_id}", also_ok=(404,)) or {}).get(
            "job_status") or {}
        if status.get("status") == "failed":
            raise WorkerApiError(f"the router could not add {worker_url}: "
                                 f"{status.get('message')}")
        return False

    @staticmethod
    def _asking(deadline: float, call):
        """call(), asked again while the router does not answer, until `deadline`."""
        while True:
            try:
                return call()
            except NoAnswer:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(POLL_S)

    @staticmethod
    def _until(done, deadline: float, why: str) -> None:
        """Until done() (a poll the router did not answer is a "not yet"), or `deadline`."""
        while True:
            try:
                if done():
                    return
                late = why
            except NoAnswer as e:
                late = f"{why} ({e})"
            if time.monotonic() > deadline:
                raise WorkerApiError(late)
            time.sleep(POLL_S)

    def _call(self, method: str, path: str, body: dict | None = None,
              timeout: float | None = None, also_ok: tuple = ()):
        """The router's JSON answer (None for none, or for a status in also_ok)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **self.headers})
        try:
            with DIRECT.open(req, timeout=timeout or self.timeout) as r:  # no proxy (probes.py)
                raw = r.read()
        except urllib.error.HTTPError as e:
            if e.code in also_ok:
                return None
            words = e.read()[:2000].decode("utf-8", "replace")
            raise WorkerApiError(f"{method} {path}: HTTP {e.code} {words}") from None
        except (OSError, ValueError) as e:  # URLError, timeouts, refused connections
            raise NoAnswer(f"{method} {path}: no answer from the router at {self.url}: "
                           f"{getattr(e, 'reason', e)}") from None
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError:
            return None  # vllm-router answers some calls in plain text
