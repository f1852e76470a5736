"""Whether the deployment serves: each instance leader's health, the router's readiness with
every worker, one smoke request that must return tokens. An answer counts only from this job's
own process (run/ports/NAME, written by its launch script's port check: Instances.owns_port):
on a shared node another deployment's engine may answer on the same port."""

from __future__ import annotations

import threading
import urllib.error

from .failures import READINESS_TIMEOUT, SMOKE_EMPTY, SMOKE_FAILED, Stop
from .probes import SMOKE_TIMEOUT, chat_body, completion_tokens, dotted, http_json, router_auth
from .spec import Readiness as ReadinessSpec, RouterReadiness
from .state import now


def _smoke_failed(why: str) -> Stop:
    return Stop("failed", why, {"role": "router", "reason": SMOKE_FAILED})


class Readiness:
    def __init__(self, job):
        self.job = job

    def wait_engines(self, heads: dict, rd: ReadinessSpec) -> None:
        job = self.job
        pending = {i.name: job.instances.health_url(heads, i) for i in job.plan.instances}
        total = len(pending)
        answered: set = set()  # answered /health, whoever's process that was
        deadline = now() + rd.engine_timeout
        job.state.update(engines_ready_count=0, engines_total=total)
        while pending:
            job.check()
            job.startup.scan()  # the engines' start-up lines before this poll's answers
            for name, url in list(pending.items()):
                # each poll may take its full 2 s: a signal must not wait for all instances' polls
                job.check()
                # a port of it held by another process: named now, not at the timeout (an
                # engine whose side channel cannot bind may never answer: vLLM's NIXL waits)
                self.job.instances.owns_port(name)
                try:
                    code, _ = http_json(url, timeout=2)
                except (OSError, ValueError, urllib.error.URLError):
                    continue
                if code == 200:
                    answered.add(name)
                # it answers: its launch script's port check follows within moments
                if code == 200 and self.job.instances.owns_port(name, wait=0.5):
                    job.startup.healthy(name)
                    del pending[name]
                    job.log(f"{name} healthy ({url})")
                    job.state.update(engines_ready_count=total - len(pending))
            if pending:
                if now() > deadline:
                    raise self._engines_late(sorted(pending), answered, rd)
                job.sleep(rd.poll_interval)

    @staticmethod
    def _engines_late(pending: list, answered: set, rd: ReadinessSpec) -> Stop:
        unowned = sorted(answered & set(pending))
        return Stop("failed", f"not healthy within {rd.engine_timeout} s: "
                              + ", ".join(pending) + (
                                  f" ({', '.join(unowned)} answered, but its launch "
                                  "script never confirmed that it was its own "
                                  "process: see its log)" if unowned else ""),
                    {"role": pending[0].rpartition("-")[0],
                     "instance": int(pending[0].rpartition("-")[2]),
                     "reason": READINESS_TIMEOUT})

    def wait_router(self, url: str, ready: RouterReadiness, rd: ReadinessSpec) -> None:
        """The router's readiness answers 200 and counts every instance as a healthy worker
        (the sum of the fields the router adapter named; none present: the 200 suffices)."""
        deadline = now() + rd.router_timeout
        expected = ready.workers
        seen = None
        # no worker yet (a front of autoscale slots alone): the routers' readiness answers 503
        # until one is healthy, so their worker API's listing answering says they listen
        path = ready.path if expected else "/workers"
        while True:
            self.job.check()
            try:
                code, body = http_json(url + path, timeout=2,
                                       headers=None if expected else router_auth(self.job.plan))
                seen = body
                counts = [dotted(body, f) for f in ready.count]
                counts = [c for c in counts if isinstance(c, int)]
                if code == 200 and (not counts or sum(counts) >= expected) and \
                        self.job.instances.owns_port("router", wait=0.5):
                    self.job.log(f"router ready with {expected} worker(s) at {url}")
                    return
            except urllib.error.HTTPError as e:
                seen = f"HTTP {e.code}"
            except (OSError, ValueError, urllib.error.URLError):
                pass
            if now() > deadline:
                raise Stop("failed", f"router not ready with {expected} workers within "
                                     f"{rd.router_timeout} s (last answer: {seen})",
                           {"role": "router", "reason": READINESS_TIMEOUT})
            self.job.sleep(rd.poll_interval)

    def smoke(self, url: str, rd: ReadinessSpec) -> None:
        """One chat request through the router that must return tokens."""
        code, resp = self._smoke_answer(url, rd)
        tokens = completion_tokens(resp)
        if tokens <= 0:
            raise Stop("failed", SMOKE_EMPTY,
                       {"role": "router", "reason": SMOKE_EMPTY})
        self.job.log(f"smoke request returned {tokens} token(s)")
        self.job.state.update(smoke_tokens=tokens)

    def _smoke_answer(self, url: str, rd: ReadinessSpec):
        plan = self.job.plan
        auth = router_auth(plan)
        body = chat_body(plan, rd.smoke_tokens)
        # In a thread, so that a signal or a dying step ends the wait at once, not after up to
        # SMOKE_TIMEOUT s; the thread is a daemon and ends with the router's connection.
        box: dict = {}

        def call() -> None:
            try:
                box["result"] = http_json(url + "/v1/chat/completions", body, headers=auth,
                                          timeout=SMOKE_TIMEOUT)
            except BaseException as e:
                box["error"] = e

        t = threading.Thread(target=call, name="hpcserve-smoke", daemon=True)
        deadline = now() + SMOKE_TIMEOUT
        t.start()
        while t.is_alive():
            self.job.check()
            if now() > deadline:  # urllib's timeout is per socket operation, not overall
                raise _smoke_failed(f"smoke request failed: no answer within "
                                    f"{SMOKE_TIMEOUT:g} s")
            t.join(0.1)
        try:
            if "error" in box:
                raise box["error"]
            return box["result"]
        except urllib.error.HTTPError as e:
            raise _smoke_failed(f"smoke request failed: HTTP {e.code} "
                                f"{e.read()[:300].decode(errors='replace')}") from None
        except (OSError, ValueError, urllib.error.URLError) as e:
            raise _smoke_failed(f"smoke request failed: {e}") from None
