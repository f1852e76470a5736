"""The benchmark step: the engine's own client on the router's node (or the one instance's
leader) once the deployment serves, Prometheus scraped while it runs, and its gate judged when it
ends (bench.py reads the results and holds the gate, for the job and `hpcserve report` alike)."""

from __future__ import annotations

import json
import os
import shlex

from . import bench
from .failures import BENCHMARK_FAILED, Stop
from .logs import read_from, tail
from .spec import Benchmark
from .state import now
from .supervise import BENCH_STEP


class BenchStep:
    def __init__(self, job):
        self.job = job
        self.run: dict | None = None  # while it runs: node, t0, next scrape, engine log sizes

    @property
    def spec(self) -> Benchmark | None:
        return self.job.plan.benchmark

    def start(self, found: dict, url: str) -> None:
        """The client's step, told the serving URL through run/endpoints.env."""
        b, job = self.spec, self.job
        if b is None:
            return
        node = found[b.component][b.node_offset][0]
        with open(os.path.join(job.dir, "run", "endpoints.env"), "a") as f:
            f.write(f"SERVING_URL={shlex.quote(url)}\n")
        os.makedirs(os.path.join(job.dir, b.dir), exist_ok=True)
        job.steps.start(BENCH_STEP, "steps/bench.sh", [node])
        self.run = {"node": node, "t0": now(), "next_scrape": now(),
                    "log_sizes": self.engine_log_sizes()}
        job.state.update(benchmark={"running": True, "node": node, "client": b.client,
                                    "points": [p.label for p in b.points],
                                    "started_at": round(now(), 3)})
        job.log(f"benchmark: {b.title} on {node} against {url}, "
                f"{len(b.points)} point(s)")

    def tick(self, heads: dict) -> None:
        """While the benchmark runs: scrape metrics now and then; once its step ended, the
        gate (a Stop unless it passed and the deployment goes on serving)."""
        r, spec = self.run, self.spec
        if not r or r.get("done"):
            return
        step = self.job.steps[BENCH_STEP]
        every = spec.metrics_interval_s
        if step.poll() is None:
            if every and now() >= r["next_scrape"]:
                bench.scrape(self.metrics_targets(heads),
                             os.path.join(self.job.dir, spec.dir, "metrics"))
                r["next_scrape"] = now() + every
            return
        r["done"] = True
        self.verdict(spec, step.returncode)

    def metrics_targets(self, heads: dict) -> list:
        """Every Prometheus endpoint of the deployment: each instance leader's /metrics and
        the router's metrics port, where it has one (TensorRT-LLM's front server has none)."""
        plan, inst = self.job.plan, self.job.instances
        out = [(i.name, f"http://{heads[i.name]}:{i.port}/metrics")
               for i in plan.instances]
        r = plan.router
        if r is not None and inst.router_addr and r.metrics_path:
            out.append(("router", f"http://{inst.router_addr}:{r.prometheus_port}"
                                  f"{r.metrics_path}"))
        return out

    def verdict(self, spec: Benchmark, rc: int) -> None:
        job = self.job
        bdir = os.path.join(job.dir, spec.dir)
        result = bench.evaluate(bdir, spec)
        result.update(node=self.run["node"], step_rc=rc, took_s=round(now() - self.run["t0"], 3))
        f = result["failed"]
        if f:
            f["reason"] += self.evidence(f["reason"], bdir)
        with open(os.path.join(bdir, "summary.json"), "w") as fh:
            json.dump(result, fh, indent=1)
        job.state.update(benchmark=result)
        for p in result["points"]:
            job.log(f"benchmark {bench.one_line(p)}")
        if f:
            raise Stop("failed", f"benchmark failed at point {f['point']}: {f['reason']}",
                       {"step": BENCH_STEP, "role": "benchmark", "node": self.run["node"],
                        "reason": BENCHMARK_FAILED, "point": f["point"],
                        "detail": f["reason"]})
        job.log(f"benchmark passed: {len(result['points'])} point(s) in {result['took_s']:.1f} s")
        if spec.then == "stop":
            raise Stop("done", f"benchmark passed ({len(result['points'])} point(s))")

    def evidence(self, reason: str, bdir: str) -> str:
        """What the logs add to a failed point: the client's last words (or srun's, where the
        step never started it), and the first error an engine logged meanwhile."""
        out = ""
        if "wrote no results" in reason or "did not run" in reason:
            last = (tail(os.path.join(bdir, "bench.log"), 1) if "wrote" in reason else
                    tail(self.job.steps.srun_log(BENCH_STEP), 1,
                         self.job.steps.offsets.get(BENCH_STEP, 0)))
            if last:
                out += f": {last[0].strip()[:300]}"
        seen = self.engine_error(self.run["log_sizes"])
        return out + (f"; engine log {seen}" if seen else "")

    def engine_log_sizes(self) -> dict:
        """Each engine log's size now: what an engine logs from here on is the benchmark's."""
        logs = os.path.join(self.job.dir, "logs")
        names = tuple(i.name + "." for i in self.job.plan.instances)
        return {f: os.path.getsize(os.path.join(logs, f)) for f in os.listdir(logs)
                if f.startswith(names) and f.endswith(".log")}

    def engine_error(self, sizes: dict) -> str | None:
        """The first error an engine logged while the benchmark ran (a client sees only "HTTP
        500"; the decode's log says its KV never came)."""
        for f in sorted(self.engine_log_sizes()):
            for line in read_from(os.path.join(self.job.dir, "logs", f),
                                  sizes.get(f, 0)).splitlines():
                if "ERROR" in line or "Error" in line:
                    return f"{f.split('.')[0]} ({f.split('.')[2]}): {line.strip()[:300]}"
        return None
