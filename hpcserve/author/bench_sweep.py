"""The serving benchmark's sweep, at plan time: every point (each concurrency at each rate) with
its client's argv, and plan.json's benchmark block (the points, where their results go, what the
gate asks). The planner builds a deployment's own `benchmark:` step from it, and `hpcserve bench
JOB` (bench_ops.py) a run against a deployment that already serves.
"""

from __future__ import annotations

from ..engines.bench_clients import BenchClient, BenchPoint, BenchRun
from .words import Var, Word


def sweep(client: BenchClient, *, served_name: str, tokenizer: str, input_tokens: int,
          output_tokens: int, warmup: int, concurrency: list[int], rates: list[float],
          prompts_per_point: int | None) -> list[tuple[BenchPoint, tuple[Word, ...]]]:
    """Every point (each concurrency at each rate) with the client's argv for it."""
    out = []
    for c in concurrency:
        for rate in rates or [None]:
            pt = BenchPoint(c, rate, prompts_per_point or max(16, 4 * c))
            run = BenchRun(base_url=(Var("SERVING_URL"),), served_name=served_name,
                           tokenizer=tokenizer, input_tokens=input_tokens,
                           output_tokens=output_tokens, warmup=warmup, point=pt,
                           result_dir=(Var("BENCH_DIR"),), result_file=f"{pt.label}.json")
            out.append((pt, tuple(client.argv(run))))
    return out


def spec(client: BenchClient, points: list, *, bench_dir: str, input_tokens: int,
         output_tokens: int, warmup: int, point_timeout_s: int, min_success: float,
         output_tolerance: float, metrics_interval_s: float, then: str) -> dict:
    """plan.json's benchmark block: the points, where their results are, what the gate asks."""
    return {"client": client.name, "title": client.title, "dir": bench_dir,
            "input_tokens": input_tokens, "output_tokens": output_tokens, "warmup": warmup,
            "points": [{"label": p.label, "concurrency": p.concurrency, "rate": p.rate,
                        "prompts": p.prompts, "file": f"{p.label}.json"} for p, _ in points],
            "keys": client.keys(), "point_timeout_s": point_timeout_s,
            "gate": {"min_success": min_success, "output_tolerance": output_tolerance},
            "metrics_interval_s": metrics_interval_s, "then": then}
