"""The instances' membership in the router they serve behind: the job's own router, or the
running one of the deployment an instance job joins (attach). One client of its worker API
(workers.py); each call that may take seconds runs in the job's pool, never in the serving loop.

Taken out first: an instance whose step ended, or that failed, leaves the router before
anything else is asked, so that no new request reaches an engine that is gone. Put back only
after its own smoke request: the router never sees a worker that cannot answer.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

from .probes import (SMOKE_TIMEOUT, chat_body, completion_tokens, front_router, http_json,
                     router_auth)
from .spec import Spec
from .table import SERVING, Rec, Table
from .workers import RouterWorkers, WorkerApiError


class Membership:
    def __init__(self, plan: Spec, instances, table: Table, pool: ThreadPoolExecutor, log):
        self.plan, self.instances, self.table, self.pool, self.log = \
            plan, instances, table, pool, log
        self.router: RouterWorkers | None = None

    def connect(self, router_url: str) -> RouterWorkers:
        # a router started with --api-key wants the key on its worker API too
        self.router = RouterWorkers(front_router(self.plan).workers_api, router_url,
                                    headers=router_auth(self.plan))
        return self.router

    @property
    def removes(self) -> bool:
        """Whether a worker can leave the router while it runs (no router: nothing to ask)."""
        return self.router is None or self.router.removes

    @property
    def adds(self) -> bool:
        """Whether a worker can join the router while it runs; else the router restarts with
        the serving set (job.py's restart_router)."""
        return self.router is None or self.router.live

    def worker_url(self, name: str) -> str:
        return f"http://{self.instances.heads[name]}:{self.instances.spec(name).port}"

    def take_out(self, name: str) -> None:
        """Out of the router now (its failure is judged next): a serving instance whose step
        just ended."""
        rec = self.table.get(name)
        if rec is not None and rec.status == SERVING and not rec.taken_out:
            rec.taken_out = True
            self.deregister(rec)

    def deregister(self, rec: Rec) -> Future | None:
        """Out of the router before anything else: no new request may reach it. The removal's
        future (its result: whether the router took it out), None without a router to ask."""
        if self.router is None or not self.router.removes:
            return None
        url, router, log = self.worker_url(rec.name), self.router, self.log

        def remove() -> bool:  # in the pool: a queued removal may take seconds to be done
            try:
                router.remove(url)
                log(f"{rec.name} removed from the router ({url})")
                return True
            except WorkerApiError as e:
                log(f"{rec.name}: the router did not remove {url}: {e}")
                return False

        return self.pool.submit(remove)

    # -- in the pool's threads: what may take seconds
    def smoke(self, name: str) -> str | None:
        """One request to the instance itself (the engine's instance smoke): its error words,
        or None."""
        smoke = self.instances.spec(name).smoke
        url = self.worker_url(name) + smoke.path
        tokens = max(1, self.plan.readiness.smoke_tokens)
        try:
            if smoke.kind == "get":
                code, _ = http_json(url, timeout=SMOKE_TIMEOUT)
                return None if code == 200 else f"HTTP {code} from {url}"
            code, resp = http_json(url, chat_body(self.plan, tokens), timeout=SMOKE_TIMEOUT,
                                   headers=router_auth(self.plan))
        except Exception as e:  # urllib's many errors: each is a failed smoke request
            return f"{url}: {e}"
        got = completion_tokens(resp)
        return None if got > 0 else f"{url} returned {got} tokens"

    def register(self, name: str) -> str | None:
        """Back into the router through its worker API: its error words, or None."""
        if self.router is None or not self.router.live:
            return None
        spec = self.instances.spec(name)
        try:
            self.router.add(self.worker_url(name), spec.role, spec.ports.get("bootstrap"))
        except WorkerApiError as e:
            return str(e)
        return None
