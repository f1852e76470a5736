"""Stateless probes of the deployment's HTTP endpoints: one opener that never goes through a proxy,
every call bounded in time, and one reader of Prometheus' text format. Nothing here keeps
state or calls into the job: the concerns (readiness, liveness, recovery, drains, autoscale)
call these, in their own threads or the job's pool."""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.error
import urllib.request

from .failures import HUNG, UNHEALTHY, UNREACHABLE
from .spec import Attach, Instance, Router, Spec

SMOKE_TIMEOUT = 120.0  # s, a whole smoke request (the router's, or one instance's)

# sbatch exports the submitter's environment, http_proxy/HTTP_PROXY included, and urlopen would
# send /health, /readiness and the smoke request to that site proxy, which cannot reach (or must
# not see) the allocation's nodes.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the one opener


def http_json(url: str, body: dict | None = None, timeout: float = 2.0,
              headers: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with DIRECT.open(req, timeout=timeout) as r:
        raw = r.read()
        return r.status, (json.loads(raw) if raw.strip() else None)


def probe(url: str, timeout: float) -> tuple[str | None, str]:
    """(None, "") when `url` answers 2xx/3xx/4xx within `timeout`; else the kind of failure:
    hung (no answer in time), unreachable (refused, no route) or unhealthy (an error status)."""
    try:
        with DIRECT.open(urllib.request.Request(url), timeout=timeout) as r:
            r.read(65536)
        return None, ""
    except urllib.error.HTTPError as e:
        return (UNHEALTHY, f"HTTP {e.code}") if e.code >= 500 else (None, "")
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            return HUNG, f"no answer within {timeout:g} s"
        return UNREACHABLE, str(e.reason)
    except (socket.timeout, TimeoutError):
        return HUNG, f"no answer within {timeout:g} s"
    except OSError as e:
        return UNREACHABLE, str(e)


def front_router(plan: Spec) -> Router | Attach | None:
    """The router this job's instances serve behind: its own (plan.json router), or the running
    router of the deployment it joins (plan.json attach); both name workers_api and
    api_key_env."""
    return plan.router if plan.router is not None else plan.attach


def router_auth(plan: Spec) -> dict:
    """The header the deployment's API key (plan.json api_key) goes in, to its router and its
    engines: read from this job's environment (job.sbatch exported it), never from plan.json."""
    key_env = plan.api_key.env if plan.api_key is not None else None
    return {"Authorization": f"Bearer {os.environ.get(key_env, '')}"} if key_env else {}


def dotted(obj, path: str):
    """obj["a"]["b"] for "a.b"; None where a part is missing."""
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def scrape(url: str, timeout: float, headers: dict | None = None) -> str | None:
    """The Prometheus text at `url`, None when it does not answer (or answers badly). With the
    deployment's key in `headers` (router_auth): SGLang asks it of its gauges (/v1/loads),
    not of /metrics."""
    try:
        with DIRECT.open(urllib.request.Request(url, headers=headers or {}),
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
    """(progress, pending) of an instance (metrics_of): the sum of its `progress`
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


def metrics_of(plan: Spec, heads: dict, inst: Instance) -> dict | None:
    """An instance's metrics (plan.json: path, progress, pending and queued names) with the URLs
    of its leader's (url: the counters; gauges_url: the gauges, where the engine reports them
    elsewhere), as metrics_totals reads them; None where its engine has none."""
    m = inst.metrics
    if m is None:
        return None
    base = f"http://{heads[inst.name]}:{inst.port}"
    return {"path": m.path, "gauges_path": m.gauges_path, "progress": m.progress,
            "pending": m.pending, "queued": m.queued, "url": base + m.path,
            "auth": router_auth(plan), "gauges_url": m.gauges_path and base + m.gauges_path}


def chat_body(plan: Spec, tokens: int) -> dict:
    """The smoke request: one chat completion of `tokens` tokens of the served model."""
    return {"model": plan.served_name, "max_tokens": tokens,
            "messages": [{"role": "user", "content": "hpcserve smoke test: say hello"}]}


def completion_tokens(resp) -> int:
    """The tokens an OpenAI-style answer says it generated (0 when it says nothing)."""
    return ((resp or {}).get("usage") or {}).get("completion_tokens") or 0
