"""`hpcserve report`: a benchmark's results as people want to see them: a table (throughput per
node and per GPU, TTFT/TPOT/ITL percentiles, success counts), two plots (throughput against
concurrency, latency percentiles against throughput) as PNG, and one self-contained HTML page
holding both; several jobs side by side, one line per job in each plot.

It reads what the job's gate wrote (state.json's benchmark block, the normalized points) and
plan.json (nodes and GPUs), locally or through the SSH runner, so it works from a laptop.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import HpcserveError
from ..slurm.runner import read_json

PLOTS = ("throughput.png", "latency.png")


@dataclass(frozen=True)
class JobBench:
    job_id: str
    name: str
    engine: str
    nodes: int
    gpus: int
    bench: dict   # state.json's benchmark block (hpcserve_bench.evaluate's result)
    startup: dict | None = None  # state.json's start-up in phases (runtime/startup.py)


def load(entry, runner) -> JobBench:
    """One job's benchmark, or a one-line error saying why there is none."""
    state = read_json(runner, f"{entry.job_dir}/state.json")
    plan = read_json(runner, f"{entry.job_dir}/plan.json")
    b = (state or {}).get("benchmark")
    if not plan or not b or "points" not in b:
        why = ("it is still running" if b and b.get("running") else
               "it has no benchmark results (no benchmark: in its deployment, or it ended "
               "before the benchmark)")
        raise HpcserveError(f"job {entry.job_id} ({entry.job_dir}): {why}")
    nodes = sum(c["nodes"] for c in plan["components"])
    gpus = sum(i["gpus_per_node"] * i["nodes"] for i in plan["instances"])
    return JobBench(entry.job_id, plan["name"], f"{plan['engine']['title']} "
                    f"{plan['engine']['version']}", nodes, max(gpus, 1), b,
                    (state or {}).get("startup"))


def _ms(p: dict, metric: str, stat: str):
    return (p.get(metric) or {}).get(stat)


def rows(jobs: list[JobBench]) -> list[dict]:
    """One row per job and point, in the units the table shows."""
    out = []
    for j in jobs:
        for p in j.bench["points"]:
            tput = p.get("output_throughput")
            out.append({
                "job": j.job_id, "name": j.name, "point": p["label"],
                "concurrency": p["concurrency"], "rate": p.get("rate"),
                "verdict": p.get("verdict"), "reason": p.get("reason"),
                "succeeded": p.get("completed"), "requests": p["prompts"],
                "output_tokens": p.get("output_tokens"),
                "output_tok_s": tput,
                "output_tok_s_per_node": tput / j.nodes if tput is not None else None,
                "output_tok_s_per_gpu": tput / j.gpus if tput is not None else None,
                "requests_s": p.get("request_throughput"),
                **{f"{m}_{s}_ms": _ms(p, m, s) for m in ("ttft", "tpot", "itl", "e2e")
                   for s in ("median", "p90", "p99")}})
    return out


COLUMNS = (("job", "job"), ("point", "point"), ("verdict", "gate"), ("succeeded", "ok"),
           ("requests", "asked"), ("output_tok_s", "out tok/s"),
           ("output_tok_s_per_node", "/node"), ("output_tok_s_per_gpu", "/GPU"),
           ("ttft_median_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99"),
           ("tpot_median_ms", "TPOT p50"), ("tpot_p99_ms", "TPOT p99"),
           ("itl_median_ms", "ITL p50"), ("itl_p99_ms", "ITL p99"))


def _cell(v) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def _about(j: JobBench) -> str:
    b = j.bench
    return (f"{j.engine}, {j.nodes} node(s), {j.gpus} GPU(s); {b['title']}, "
            f"{b['input_tokens']} in / {b['output_tokens']} out tokens")


def _verdict(j: JobBench) -> str:
    return "passed" if j.bench["passed"] else "FAILED"


def table_text(jobs: list[JobBench]) -> str:
    head = [f"job {j.job_id} ({j.name}): {_about(j)}; {_verdict(j)}" for j in jobs]
    data = rows(jobs)
    grid = [[title for _, title in COLUMNS]] + [[_cell(r[k]) for k, _ in COLUMNS] for r in data]
    widths = [max(len(r[i]) for r in grid) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i > 2 else c.ljust(w) for i, (c, w) in
                       enumerate(zip(r, widths))).rstrip() for r in grid]
    fails = [f"{r['job']} {r['point']}: {r['reason']}" for r in data if r["reason"]]
    return "\n".join(head + [""] + lines + ([""] + fails if fails else []))


def as_json(jobs: list[JobBench]) -> dict:
    return {"jobs": [{"job": j.job_id, "name": j.name, "engine": j.engine, "nodes": j.nodes,
                      "gpus": j.gpus, "passed": j.bench["passed"],
                      "failed": j.bench.get("failed")} for j in jobs],
            "rows": rows(jobs)}


LATENCIES = (("ttft_median_ms", "TTFT p50", "o-"), ("ttft_p99_ms", "TTFT p99", "o--"),
             ("tpot_median_ms", "TPOT p50", "s-"), ("tpot_p99_ms", "TPOT p99", "s--"))


def plot_data(data: list[dict]) -> dict:
    """What each plot draws, per line: (label, xs, ys); report.json's rows in, so a test can
    hold a plot against the table."""
    jobs = list(dict.fromkeys((r["job"], r["name"]) for r in data))
    out: dict = {"throughput": [], "latency": []}
    for job, name in jobs:
        pts = [r for r in data if r["job"] == job and r["output_tok_s_per_gpu"] is not None]
        out["throughput"].append((f"{name} ({job})", [r["concurrency"] for r in pts],
                                  [r["output_tok_s_per_gpu"] for r in pts]))
        for key, label, _ in LATENCIES:
            out["latency"].append((f"{label}, job {job}", [r["output_tok_s_per_gpu"] for r in pts],
                                   [r[key] for r in pts]))
    return out


def need_matplotlib() -> None:
    """The plots need matplotlib, an extra (the rest of hpcserve does not): say which."""
    import importlib.util
    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # a broken install, or sys.modules["matplotlib"] = None
        found = False
    if not found:
        raise HpcserveError("hpcserve report draws its plots with matplotlib, which is not "
                            "installed: pip install 'hpcserve[report]' (or --json for the rows)")


def plot(jobs: list[JobBench], out: Path) -> list[Path]:
    """throughput.png and latency.png in `out`, one line per job (and latency), and the same
    figures as SVG (text kept as text, each line a group "<plot>-<k>"), which a script or a
    test can read back: axes, labels, and where each point was drawn."""
    import matplotlib
    matplotlib.use("Agg")  # no display on a login node
    import matplotlib.pyplot as plt
    plt.rcParams["svg.fonttype"] = "none"
    out.mkdir(parents=True, exist_ok=True)
    lines = plot_data(rows(jobs))
    styles = [s for _, _, s in LATENCIES]
    for name, xlabel, ylabel, title in (
            ("throughput", "concurrency (requests in flight)", "output tokens/s per GPU",
             "Throughput against concurrency"),
            ("latency", "output tokens/s per GPU", "latency (ms)",
             "Latency percentiles against throughput")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for k, (label, xs, ys) in enumerate(lines[name]):
            ax.plot(xs, ys, "o-" if name == "throughput" else styles[k % len(styles)],
                    label=label, gid=f"{name}-{k}")
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        if name == "throughput":
            ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        _save(fig, out, name)
    return [out / p for p in PLOTS] + _startup_plot(jobs, out, plt)


def _save(fig, out: Path, name: str) -> None:
    fig.savefig(out / f"{name}.png", dpi=100)
    fig.savefig(out / f"{name}.svg")
    import matplotlib.pyplot as plt
    plt.close(fig)


def _startup_plot(jobs: list[JobBench], out: Path, plt) -> list[Path]:
    """startup.png beside the throughput plot where a job's state.json has its start-up in
    phases: one bar per job, a segment per phase in order (each bar "startup-<job>-<phase>"
    in the SVG), unknown time hatched."""
    measured = [j for j in jobs if j.startup and j.startup.get("phases")]
    if not measured:
        return []
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.6 * len(measured)))
    colors: dict[str, str] = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for y, j in enumerate(measured):
        left = 0.0
        segments = [(k, v) for k, v in j.startup["phases"].items() if v] + \
            [("unknown", j.startup.get("unknown_s") or 0.0)]
        for phase, secs in segments:
            if not secs:
                continue
            new = phase not in colors
            colors.setdefault(phase, "white" if phase == "unknown"
                              else palette[len(colors) % len(palette)])
            ax.barh(y, secs, left=left, color=colors[phase], edgecolor="black",
                    hatch="//" if phase == "unknown" else None, label=phase if new else None,
                    gid=f"startup-{j.job_id}-{phase}")
            left += secs
    ax.set_yticks(range(len(measured)), [f"{j.job_id} {j.name}" for j in measured])
    ax.set(xlabel="seconds from the job's start to serving", title="Start-up in phases")
    ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    _save(fig, out, "startup")
    return [out / "startup.png"]


def html_page(jobs: list[JobBench], pngs: list[Path]) -> str:
    """One self-contained page: the table, and the plots inlined as data: URIs."""
    e = html.escape
    heads = "".join(f"<li>job {e(j.job_id)} <b>{e(j.name)}</b>: {e(_about(j))}; "
                    f"<span class=\"{'ok' if j.bench['passed'] else 'fail'}\">{_verdict(j)}"
                    f"</span></li>" for j in jobs)
    data = rows(jobs)
    th = "".join(f"<th>{e(t)}</th>" for _, t in COLUMNS)
    trs = "".join("<tr>" + "".join(f"<td>{e(_cell(r[k]))}</td>" for k, _ in COLUMNS) + "</tr>"
                  for r in data)
    imgs = "".join(f'<figure><img alt="{e(p.stem)}" src="data:image/png;base64,'
                   f'{base64.b64encode(p.read_bytes()).decode()}"></figure>' for p in pngs)
    reasons = "".join(f"<li>{e(r['job'])} {e(r['point'])}: {e(r['reason'])}</li>"
                      for r in data if r["reason"])
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>hpcserve benchmark "
            f"report</title><style>{_CSS}</style></head><body><h1>hpcserve benchmark report</h1>"
            f"<ul>{heads}</ul><table id=\"results\"><thead><tr>{th}</tr></thead>"
            f"<tbody>{trs}</tbody></table>" + (f"<ul class=\"fail\">{reasons}</ul>" if reasons
                                               else "") + f"{imgs}</body></html>\n")


_CSS = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        ".ok{color:#060}.fail{color:#a00}img{max-width:100%}")


def write(jobs: list[JobBench], out: Path) -> Path:
    """The plots and report.html in `out`; the page's path."""
    pngs = plot(jobs, out)
    page = out / "report.html"
    page.write_text(html_page(jobs, pngs), encoding="utf-8")
    (out / "report.json").write_text(json.dumps(as_json(jobs), indent=1), encoding="utf-8")
    return page
