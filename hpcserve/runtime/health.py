"""Whether the deployment serves: each instance leader's health, the router's readiness with
every worker, one smoke request that must return tokens (readiness); then, while serving, every
probe bounded in time, a hung engine told from an unreachable one (liveness). An answer counts
only from this job's own process (run/ports/NAME, written by its launch script's port check):
on a shared node another deployment's engine may answer on the same port."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from .failures import Stop, step_identity
from .logs import read_from
from .state import now

# sbatch exports the submitter's environment, http_proxy/HTTP_PROXY included, and urlopen would
# send /health, /readiness and the smoke request to that site proxy, which cannot reach (or must
# not see) the allocation's nodes.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_json(url: str, body: dict | None = None, timeout: float = 2.0,
              headers: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with _DIRECT.open(req, timeout=timeout) as r:
        raw = r.read()
        return r.status, (json.loads(raw) if raw.strip() else None)


def probe(url: str, timeout: float) -> tuple[str | None, str]:
    """(None, "") when `url` answers 2xx/3xx/4xx within `timeout`; else the kind of failure:
    hung (no answer in time), unreachable (refused, no route) or unhealthy (an error status)."""
    try:
        with _DIRECT.open(urllib.request.Request(url), timeout=timeout) as r:
            r.read(65536)
        return None, ""
    except urllib.error.HTTPError as e:
        return ("unhealthy", f"HTTP {e.code}") if e.code >= 500 else (None, "")
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            return "hung", f"no answer within {timeout:g} s"
        return "unreachable", str(e.reason)
    except (socket.timeout, TimeoutError):
        return "hung", f"no answer within {timeout:g} s"
    except OSError as e:
        return "unreachable", str(e)


def front_router(plan: dict) -> dict | None:
    """The router this job's instances serve behind: its own (plan.json router), or the running
    router of the deployment it joins (plan.json attach); both name workers_api and
    api_key_env."""
    return plan.get("router") or plan.get("attach")


def router_auth(plan: dict) -> dict:
    """The header the deployment's API key (plan.json api_key) goes in, to its router and its
    engines: read from this job's environment (job.sbatch exported it), never from plan.json."""
    key_env = (plan.get("api_key") or {}).get("env")
    return {"Authorization": f"Bearer {os.environ.get(key_env, '')}"} if key_env else {}


def _dotted(obj, path: str):
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def _smoke_failed(why: str) -> Stop:
    return Stop("failed", why, {"role": "router", "reason": "smoke request failed"})


class Readiness:
    SMOKE_TIMEOUT = 120.0  # s, the whole smoke request

    def __init__(self, job):
        self.job = job

    def owns_port(self, name: str, wait: float = 0.0) -> bool:
        """Whether the launch script of `name` (an instance or the router) found its own
        process listening on its port (run/ports/NAME). Raises the port clash it found instead:
        another process, another deployment's on a shared node, holds one of its ports."""
        path = os.path.join(self.job.dir, "run", "ports", name)
        end = now() + wait
        verdict = read_from(path, 0).strip()
        while not verdict and now() < end:
            time.sleep(0.02)
            verdict = read_from(path, 0).strip()
        if not verdict.startswith("taken "):
            return verdict == "ours"
        port, _, holder = verdict[6:].partition(" by ")
        node = self.job.instances.leader_node(name)
        raise Stop("failed", f"port {port} on node {node} is taken by {holder}: {name} cannot "
                             "serve there (another deployment on a shared node?)",
                   {**step_identity(name), "node": node, "node_rank": 0,
                    "reason": "port taken", "port": int(port), "holder": holder,
                    "exit_code": None})

    def wait_engines(self, heads: dict, rd: dict) -> None:
        job = self.job
        pending = {i["name"]: job.instances.health_url(heads, i) for i in job.plan["instances"]}
        total = len(pending)
        answered: set = set()  # answered /health, whoever's process that was
        deadline = now() + rd["engine_timeout"]
        job.state.update(engines_ready_count=0, engines_total=total)
        while pending:
            job.check()
            job.startup.scan()  # the engines' start-up lines before this poll's answers
            for name, url in list(pending.items()):
                # each poll may take its full 2 s: a signal must not wait for all instances' polls
                job.check()
                # a port of it held by another process: named now, not at the timeout (an
                # engine whose side channel cannot bind may never answer: vLLM's NIXL waits)
                self.owns_port(name)
                try:
                    code, _ = http_json(url, timeout=2)
                except (OSError, ValueError, urllib.error.URLError):
                    continue
                if code == 200:
                    answered.add(name)
                # it answers: its launch script's port check follows within moments
                if code == 200 and self.owns_port(name, wait=0.5):
                    job.startup.healthy(name)
                    del pending[name]
                    job.log(f"{name} healthy ({url})")
                    job.state.update(engines_ready_count=total - len(pending))
            if pending:
                if now() > deadline:
                    raise self._engines_late(sorted(pending), answered, rd)
                job.sleep(rd["poll_interval"])

    @staticmethod
    def _engines_late(pending: list, answered: set, rd: dict) -> Stop:
        unowned = sorted(answered & set(pending))
        return Stop("failed", f"not healthy within {rd['engine_timeout']} s: "
                              + ", ".join(pending) + (
                                  f" ({', '.join(unowned)} answered, but its launch "
                                  "script never confirmed that it was its own "
                                  "process: see its log)" if unowned else ""),
                    {"role": pending[0].rpartition("-")[0],
                     "instance": int(pending[0].rpartition("-")[2]),
                     "reason": "readiness timeout"})

    def wait_router(self, url: str, ready: dict, rd: dict) -> None:
        """The router's readiness answers 200 and counts every instance as a healthy worker
        (the sum of the fields the router adapter named; none present: the 200 suffices)."""
        deadline = now() + rd["router_timeout"]
        expected = ready["workers"]
        seen = None
        # no worker yet (a front of autoscale slots alone): the routers' readiness answers 503
        # until one is healthy, so their worker API's listing answering says they listen
        path = ready["path"] if expected else "/workers"
        while True:
            self.job.check()
            try:
                code, body = http_json(url + path, timeout=2,
                                       headers=None if expected else router_auth(self.job.plan))
                seen = body
                counts = [_dotted(body, f) for f in ready["count"]]
                counts = [c for c in counts if isinstance(c, int)]
                if code == 200 and (not counts or sum(counts) >= expected) and \
                        self.owns_port("router", wait=0.5):
                    self.job.log(f"router ready with {expected} worker(s) at {url}")
                    return
            except urllib.error.HTTPError as e:
                seen = f"HTTP {e.code}"
            except (OSError, ValueError, urllib.error.URLError):
                pass
            if now() > deadline:
                raise Stop("failed", f"router not ready with {expected} workers within "
                                     f"{rd['router_timeout']} s (last answer: {seen})",
                           {"role": "router", "reason": "readiness timeout"})
            self.job.sleep(rd["poll_interval"])

    def smoke(self, url: str, rd: dict) -> None:
        """One chat request through the router that must return tokens."""
        code, resp = self._smoke_answer(url, rd)
        tokens = ((resp or {}).get("usage") or {}).get("completion_tokens") or 0
        if tokens <= 0:
            raise Stop("failed", "smoke request returned 0 tokens",
                       {"role": "router", "reason": "smoke request returned 0 tokens"})
        self.job.log(f"smoke request returned {tokens} token(s)")
        self.job.state.update(smoke_tokens=tokens)

    def _smoke_answer(self, url: str, rd: dict):
        plan = self.job.plan
        auth = router_auth(plan)
        body = {"model": plan["served_name"], "max_tokens": rd["smoke_tokens"],
                "messages": [{"role": "user", "content": "hpcserve smoke test: say hello"}]}
        # In a thread, so that a signal or a dying step ends the wait at once, not after up to
        # SMOKE_TIMEOUT s; the thread is a daemon and ends with the router's connection.
        box: dict = {}

        def call() -> None:
            try:
                box["result"] = http_json(url + "/v1/chat/completions", body, headers=auth,
                                          timeout=self.SMOKE_TIMEOUT)
            except BaseException as e:
                box["error"] = e

        t = threading.Thread(target=call, name="hpcserve-smoke", daemon=True)
        deadline = now() + self.SMOKE_TIMEOUT
        t.start()
        while t.is_alive():
            self.job.check()
            if now() > deadline:  # urllib's timeout is per socket operation, not overall
                raise _smoke_failed(f"smoke request failed: no answer within "
                                    f"{self.SMOKE_TIMEOUT:g} s")
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


def scrape(url: str, timeout: float, headers: dict | None = None) -> str | None:
    """The Prometheus text at `url`, None when it does not answer (or answers badly). With the
    deployment's key in `headers` (router_auth): SGLang asks it of its gauges (/v1/loads),
    not of /metrics."""
    try:
        with _DIRECT.open(urllib.request.Request(url, headers=headers or {}),
                          timeout=timeout) as r:
            return r.read(4 << 20).decode(errors="replace")
    except (OSError, ValueError, urllib.error.URLError, http.client.HTTPException):
        return None


def samples(text: str, names) -> list[float]:
    """The value of every sample of the metrics `names`, over every label set."""
    got = []
    for line in text.splitlines():
        if line and line[0] != "#" and line.split("{", 1)[0].split(" ", 1)[0] in names:
            try:
                got.append(float(line.rsplit(" ", 1)[-1]))
            except ValueError:
                pass
    return got


def metrics_totals(m: dict, timeout: float) -> tuple[float | None, float] | None:
    """(progress, pending) of an instance (Liveness.metrics_of): the sum of its `progress`
    counters (None where the engine exports none of them: no stall can be told from them) and of
    its `pending` gauges over every label set, read at its gauges URL where it has one (one
    label set per scheduler there); None when either does not answer."""
    text = scrape(m["url"], timeout)
    gauges = text if text is None or not m.get("gauges_url") else scrape(m["gauges_url"],
                                                                          timeout, m.get("auth"))
    if gauges is None:
        return None
    progress = samples(text, m["progress"])
    return (sum(progress) if progress else None), sum(samples(gauges, m["pending"]))


class Track:
    """One probe target's record across rounds: its failed rounds in a row, its last progress
    counter, and when it last showed a sign of progress (its counters moved, a health path
    that proves generation answered, or it answered holding no request)."""

    def __init__(self, at: float):
        self.failed = 0
        self.progress: float | None = None
        self.alive_at = at
        self.busy = False   # its last probe failed while its counters moved

    def judge(self, kind: str | None, detail: str, m: tuple | None, at: float,
              hung_after: float, proves_progress: bool):
        """(kind, detail, ripe) of a failure this round, or None; ripe: it has failed long
        enough to be taken out. Hung is not busy: an engine whose counters moved since the
        last round works, however slowly it answers; a timed-out probe, or an answer that
        proves nothing while requests stand still, is hung only after `hung_after` s without
        any sign of progress (a long step shows none until it ends)."""
        prev = self.progress
        moved = m is not None and m[0] is not None and prev is not None and m[0] > prev
        if m is not None and m[0] is not None:
            self.progress = m[0]
        held = m[1] if m is not None else None
        if moved or (kind is None and (proves_progress or held == 0)):
            self.alive_at = at
        self.busy = kind is not None and moved
        stalled = (kind is None and not proves_progress and bool(held) and not moved
                   and prev is not None)
        if moved or (kind is None and not stalled):
            self.failed = 0
            return None  # busy (it answers slowly because it works), or well
        self.failed += 1
        still = at - self.alive_at
        if stalled:
            return "hung", (f"it answers its health path but holds {held:g} request(s) while "
                            f"its progress counters stand still ({still:.0f} s)"), \
                still >= hung_after
        if kind == "hung":
            return kind, f"{detail}, no sign of progress for {still:.0f} s", still >= hung_after
        return kind, detail, True


SCAN_S = 0.5  # s between two looks for drain requests (run/control/) while serving


class Liveness:
    def __init__(self, job):
        self.job = job
        self.pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="hpcserve-probe")
        self.tracks: dict[str, Track] = {}
        self._next_scan = 0.0

    def targets(self, router_url: str | None) -> list[tuple[str, str, dict | None]]:
        """(name, liveness URL, metrics URLs and names) of every serving instance, and the
        router's readiness."""
        job = self.job
        inst = job.instances
        out = []
        for i in job.plan["instances"]:
            if not job.recovery.serving(i["name"]):
                self.tracks.pop(i["name"], None)  # its next attempt's counters start at 0
                continue
            out.append((i["name"], inst.liveness_url(inst.heads, i), self.metrics_of(i)))
        if router_url:
            out.append(("router", router_url + job.plan["router"]["readiness"]["path"], None))
        return out

    def metrics_of(self, spec: dict) -> dict | None:
        """The instance's metrics (plan.json: path, progress and pending names) with the URLs
        of its leader's (url: the counters; gauges_url: the gauges, where the engine reports
        them elsewhere); None where its engine has none."""
        m = spec.get("metrics")
        if not m:
            return None
        base = f"http://{self.job.instances.heads[spec['name']]}:{spec['port']}"
        return {**m, "url": base + m["path"], "auth": router_auth(self.job.plan),
                "gauges_url": m.get("gauges_path") and base + m["gauges_path"]}

    def watch(self, router_url: str | None, tick) -> None:
        """While serving: every round, all targets probed at once (each bounded by `timeout`),
        the engines' metrics read beside their health; Slurm asked about the nodes now and then;
        drain requests taken between rounds; tick() called once a round (the benchmark's), and
        the router's worker list set against the deployment's (reconcile.py). One
        instance that fails `failures` rounds in a row is recovery's (recovery.py); the router's
        failure, a signal or a lost router node end the deployment by raising Stop. `router_url` is the
        job's own router only: an instance job (attach) probes its engines, and the router it
        joined is its front job's to watch."""
        job = self.job
        lv = job.plan["liveness"]
        next_nodes = now() + lv["node_interval"]
        while True:
            self._pause(lv["interval"])
            tick()
            if router_url:  # the router this job runs: its workers as the deployment wants them
                job.reconcile.round()
            for name, url, res in self._round(self.targets(router_url), lv["timeout"]):
                self._judge(name, url, res, lv)
            job.state.record(job.log, health={
                n: ("ok" if t.failed == 0 else f"failing {t.failed}/{lv['failures']}")
                for n, t in self.tracks.items() if job.recovery.serving(n)})
            if now() >= next_nodes:
                job.supervisor.check_nodes()
                next_nodes = now() + lv["node_interval"]

    def _pause(self, seconds: float) -> None:
        """The wait between rounds, in which recovery and drains move on, and drain requests are
        looked for every SCAN_S (not once a round: a round may be 10 s apart, and a drain request
        should not wait for it; a listing every SCAN_S is light even on a parallel file
        system)."""
        job = self.job
        end = now() + seconds
        while True:
            job.check()
            if now() >= self._next_scan:
                job.drains.scan()
                self._next_scan = now() + SCAN_S
            job.recovery.tick()
            job.reconcile.poll()
            job.renewal.tick()
            job.drains.tick()
            job.autoscaler.tick()
            if now() >= end:
                return
            time.sleep(min(0.1, max(0.0, end - now())))

    def _round(self, targets: list, timeout: float) -> list:
        """Every target's health probe and metrics read at once, waited for while the job's
        checks and recovery go on."""
        futs = [(name, url, self.pool.submit(probe, url, timeout),
                 m and self.pool.submit(metrics_totals, m, timeout))
                for name, url, m in targets]
        while not all(f.done() and (g is None or g.done()) for _, _, f, g in futs):
            self._pause(0.05)
        return [(name, url, (*f.result(), g and g.result())) for name, url, f, g in futs]

    def _judge(self, name: str, url: str, res: tuple, lv: dict) -> None:
        job = self.job
        kind, detail, m = res
        if name not in self.tracks:  # alive since it went serving (its readiness, or its
            rec = job.recovery.recs.get(name)  # replacement's smoke request): its last sign
            self.tracks[name] = Track(rec.since if rec else now())
        t = self.tracks[name]
        if name == "router" and kind == "unhealthy" and (
                not job.recovery.all_serving() or job.autoscaler.slots_alone()):
            kind = None  # its readiness counts the workers: one is out, on purpose
        if name != "router" and not job.recovery.serving(name):
            self.tracks.pop(name, None)
            return  # taken out meanwhile (its step ended while the round ran)
        was, was_busy = t.failed, t.busy
        live = {} if name == "router" else job.instances.spec(name)["liveness"]
        verdict = t.judge(kind, detail, m, now(), live.get("hung_after", 0),
                          live.get("proves_progress", False))
        if t.busy and not was_busy:
            job.log(f"{name}: busy, not hung: {kind} ({detail}) at {url}, but its progress "
                    "counters moved")
        if verdict is None:
            if was or (was_busy and not t.busy):
                job.log(f"{name} answers again at {url}")
            return
        kind, detail, ripe = verdict
        count = t.failed
        job.log(f"{name}: {kind} ({detail}) at {url}, {count} of {lv['failures']}")
        if count >= lv["failures"] and ripe:
            self.tracks.pop(name, None)
            stop = self._gone(name, kind, url, detail, count)
            if not job.recovery.handles(name):
                raise stop
            job.recovery.failed(name, (stop.failure or {}).get("reason") or kind, stop.failure)

    def _gone(self, name: str, kind: str, url: str, detail: str, count: int) -> Stop:
        """The Stop that a target's failure means: a lost node where its step cannot end or
        its node's slurmd does not answer; else its own kind (hung, unreachable, unhealthy)."""
        sup, steps = self.job.supervisor, self.job.steps
        try:
            if name in steps and steps.terminating(name):
                sup.step_lost(name)  # not the engine's fault: a node or task is gone
            if name in steps:  # an engine on a crashed node does not answer either
                sup.raise_if_node_lost(name, sup.failure_of(name, None))
        except Stop as s:
            return s
        if kind == "hung":
            sup.hung_steps.add(name)
        return Stop("failed", f"{name} {kind}: {detail}, {count} probes of {url} in a row",
                    self.probe_failure(name, kind, url, detail))

    def probe_failure(self, name: str, kind: str, url: str, detail: str) -> dict:
        inst = self.job.instances
        f = {**step_identity(name), "node": inst.leader_node(name), "node_rank": 0}
        f.update(reason=kind, probe=url, detail=detail, exit_code=None,
                 log=inst.log_file(name, 0, f["node"]))
        self.job.supervisor.last_words(f)
        return f
