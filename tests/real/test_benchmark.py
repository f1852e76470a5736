"""The benchmark step on the real test cluster: vLLM's own client (`vllm bench serve`, from the
vLLM CPU release) against the simulated engines behind the real sglang-router, and against the
real vLLM on CPU; the gate failing a point that produced 0 tokens or whose decode never got its
KV, with that reason in state.json; `hpcserve report` (table, PNG plots, an HTML page rendered
by headless Chromium); `hpcserve bench` against a deployment that serves, as a job of its own
(submitit) and as a step of its allocation."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

# At import, while "conftest" is still tests/real's (pytest loads each directory's conftest
# under that one name, so inside a test it may be another directory's)
from conftest import hpcserve_runner, real_deployment, write_deployment
from test_vllm_cpu import _job_id, _status, read_state, wait_no_job_processes, wait_state

# tests/jobs, on sys.path since test_vllm_cpu's import
from jobkit import OWNER, check_startup, hand_over, owners_jobs

# Only the test of the real vLLM runs an engine: the others run vLLM's client against simulated
# engines, which may run beside the real-engine tests (tests/suiteplan.py).
pytestmark = [pytest.mark.slurm]

POINTS = [1, 4]
PROMPTS = 8
IN, OUT = 48, 12


def sim_pd(name: str, jobs: str, client_python: Path, tokenizer: str, **bench) -> dict:
    """A simulated SGLang 1P1D deployment behind the real sglang-router, benchmarked with
    vLLM's client (any client speaks OpenAI completions to any router)."""
    return {
        "name": name, "jobs_dir": jobs, "site": "local",
        "model": {"profile": "kimi-k2-instruct", "path": "/models/Kimi-K2-Instruct",
                  "served_name": "kimi-k2"},
        "engine": {"name": "sglang", "version": "0.5.23", "simulate": True,
                   "sim_decode_s_per_token": 0.002},
        "time_limit": "00:10:00",
        "roles": {"prefill": {"nodes": 1}, "decode": {"nodes": 1}},
        "router": {"port": 8000},
        "env": {"HF_HUB_OFFLINE": 1, "TRANSFORMERS_OFFLINE": 1, "VLLM_NO_USAGE_STATS": 1},
        "readiness": {"engine_timeout": 60, "router_timeout": 30, "poll_interval": 0.1},
        "benchmark": {"client": "vllm", "python": str(client_python), "tokenizer": tokenizer,
                      "input_tokens": IN, "output_tokens": OUT, "concurrency": POINTS,
                      "prompts_per_point": PROMPTS, "warmup": 0, "metrics_interval_s": 0.5,
                      **bench},
    }


def submit(hs, tmp_path: Path, dep: dict) -> tuple[str, Path]:
    r = hs("submit", str(write_deployment(tmp_path, dep)), check=False)
    assert "submitted job " in r.stdout, (r.stdout, r.stderr)
    job = _job_id(r.stdout)
    return job, Path(_status(hs, job)["job_dir"])


# First: the module's passing deployment goes on serving on these nodes (and ports).
@pytest.mark.parametrize("fault,reason", [
    ({"decode": {"kind": "empty", "after_requests": 1}}, "0 output tokens"),
    ({"prefill": {"kind": "kv_lost", "after_requests": 1}}, "KV transfer failed"),
])
def test_the_gate_fails_a_benchmark_that_proves_nothing(hs_module, dev_cluster, vllm_cpu,
                                                        tiny_models, tmp_path, fault, reason):
    jobs = str(owners_jobs(dev_cluster) / "bench")
    dep = sim_pd(f"t-bench-{next(iter(fault.values()))['kind'].replace('_', '-')}", jobs,
                 vllm_cpu, tiny_models["llama"], concurrency=[2])
    for role, f in fault.items():  # the smoke request passes; what follows does not
        dep["roles"][role]["sim_fault"] = f
    dep["env"]["HPCSERVE_SIM_BOOTSTRAP_TIMEOUT"] = 2
    job, job_dir = submit(hs_module, tmp_path, dep)
    st = wait_state(job_dir, {"failed", "done", "cancelled"}, 300)
    f = st["failure"]
    assert st["phase"] == "failed" and f["reason"] == "benchmark failed", st
    assert (f["role"], f["point"], f["node"]) == ("benchmark", "c2", st["benchmark"]["node"])
    assert reason in f["detail"], f
    assert f"{0} of {PROMPTS} requests succeeded" in f["detail"] or reason == "0 output tokens"
    assert st["reason"].startswith("benchmark failed at point c2: ")
    assert not st["benchmark"]["passed"] and st["benchmark"]["points"][0]["verdict"] == "fail"
    wait_no_job_processes(dev_cluster, 60)


@pytest.mark.real_engine
def test_a_real_vllm_on_cpu_benchmarked_by_its_own_client_then_the_job_ends(
        hs, dev_cluster, tiny_llama_weights, tmp_path):
    """The real engine loading a real (tiny) checkpoint, its start-up in phases from its own
    lines, its own `vllm bench serve` from the same environment (the site's engine python), then
    `then: stop`: the job ends done, the report draws it."""
    jobs = str(owners_jobs(dev_cluster))
    dep = real_deployment("real-bench", tiny_llama_weights, "tiny-llama", jobs, {},
                          str(Path(dev_cluster.state_dir).parent / "inductor-cache"))
    # vLLM's default loader reads model.safetensors and logs "Loading weights took"
    # (model_loader/default_loader.py, 0.32.0); the dummy loader logs no such line
    del dep["roles"]["worker"]["args"]["load-format"]
    dep["benchmark"] = {"input_tokens": IN, "output_tokens": OUT, "concurrency": POINTS,
                        "prompts_per_point": PROMPTS, "warmup": 1}
    r = hs("submit", str(write_deployment(tmp_path, dep)), check=False)
    assert "submitted job " in r.stdout, (r.stdout, r.stderr)
    job = _job_id(r.stdout)
    job_dir = Path(_status(hs, job)["job_dir"])
    st = wait_state(job_dir, {"failed", "done", "cancelled"}, 600)
    assert (st["phase"], st["reason"]) == ("done", f"benchmark passed ({len(POINTS)} point(s))"), \
        (job_dir / "logs" / "hpcserve-job.log").read_text()[-3000:]
    b = st["benchmark"]
    assert [(p["label"], p["completed"], p["output_tokens"]) for p in b["points"]] == [
        (f"c{c}", PROMPTS, PROMPTS * OUT) for c in POINTS]
    raw = json.loads((job_dir / "bench" / "c4.json").read_text())
    assert raw["backend"] == "openai" and raw["tokenizer_id"] == tiny_llama_weights
    check_startup(st, job_dir, "Loading weights took ")
    (inst,) = st["startup"]["instances"].values()
    for phases in (st["startup"]["phases"], inst["phases"]):
        assert phases["engine_load"] > 0 and phases["engine_warmup"] > 0, st["startup"]
    # the real engine's own metrics, scraped while it ran
    assert "vllm:generation_tokens_total" in (job_dir / "bench" / "metrics" /
                                              "worker-0.prom").read_text()
    rep = hs("report", job, "--out", str(tmp_path / "r")).stdout
    assert "passed" in rep.splitlines()[0] and (tmp_path / "r" / "throughput.png").is_file()
    wait_no_job_processes(dev_cluster, 60)


@pytest.fixture(scope="module")
def passed_job(request, tmp_path_factory, dev_cluster, vllm_cpu, tiny_models):
    """One simulated deployment whose benchmark passed and that goes on serving."""
    hs = request.getfixturevalue("hs_module")
    jobs = str(owners_jobs(dev_cluster) / "bench")
    dep = sim_pd("t-bench-ok", jobs, vllm_cpu, tiny_models["llama"], then="serve")
    job, job_dir = submit(hs, tmp_path_factory.mktemp("bench"), dep)
    # serving, then the benchmark's verdict beside it
    wait_state(job_dir, lambda st: st.get("phase") in ("failed", "cancelled", "done") or
               "passed" in (st.get("benchmark") or {}), 300)
    yield hs, job, job_dir
    hs("cancel", job, "--wait", check=False)
    wait_no_job_processes(dev_cluster, 60)


@pytest.fixture(scope="module")
def hs_module(dev_cluster, tmp_path_factory, owners_hpcserve, site_python):
    return hpcserve_runner(dev_cluster, tmp_path_factory.mktemp("hs"), owners_hpcserve,
                           site_python)


def test_the_benchmark_runs_the_client_at_every_point_and_passes_the_gate(passed_job):
    hs, job, job_dir = passed_job
    st = json.loads((job_dir / "state.json").read_text())
    b = st["benchmark"]
    assert st["phase"] == "serving" and b["passed"] and b["failed"] is None, b
    assert [p["label"] for p in b["points"]] == [f"c{c}" for c in POINTS]
    for p in b["points"]:
        # every request answered with the tokens asked, measured by vLLM's own client
        assert (p["verdict"], p["completed"], p["failed"], p["rc"]) == ("ok", PROMPTS, 0, 0), p
        assert p["output_tokens"] == PROMPTS * OUT and p["output_throughput"] > 0, p
        assert p["ttft"]["median"] > 0 and p["tpot"]["p99"] >= p["tpot"]["median"] > 0, p
        raw = json.loads((job_dir / "bench" / f"{p['label']}.json").read_text())
        assert raw["max_concurrency"] == p["concurrency"] and raw["completed"] == PROMPTS
        assert raw["output_lens"] == [OUT] * PROMPTS
    # the client ran on the router's node, inside the allocation
    assert b["node"] == st["router_node"], (b["node"], st["router_node"])
    # the deployment's own engines answered the benchmark: the decode logged the requests
    decode_log = "".join(p.read_text() for p in (job_dir / "logs").glob("decode-0.*.log"))
    assert decode_log.count('"POST /v1/completions"') >= PROMPTS * len(POINTS)
    # Prometheus scraped while it ran: the router's metrics, and the decode engine's own (the
    # simulated SGLang serves /metrics under --enable-metrics, which hpcserve sets)
    router = (job_dir / "bench" / "metrics" / "router.prom").read_text()
    assert router.count("# hpcserve-scrape ") >= 1
    assert 'smg_http_requests_total{method="POST",path="/v1/completions"' in router
    decode = (job_dir / "bench" / "metrics" / "decode-0.prom").read_text()
    assert "hpcserve-scrape-error" not in decode, decode[-2000:]
    assert "sglang:generation_tokens_total{" in decode, decode[-2000:]


def _png_size(p: Path) -> tuple[int, int]:
    head = p.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", p
    return struct.unpack(">II", head[16:24])


def test_report_writes_the_table_the_plots_and_a_page_a_browser_renders(passed_job, tmp_path):
    hs, job, job_dir = passed_job
    hand_over(tmp_path)   # where the job's user writes the report
    out = hs("report", job, "--out", str(tmp_path / "r")).stdout
    lines = out.splitlines()
    assert lines[0].startswith(f"job {job} (t-bench-ok): simulated SGLang 0.5.23") or \
        lines[0].startswith(f"job {job} (t-bench-ok): SGLang 0.5.23"), out
    rows = {ln.split()[1]: ln.split() for ln in lines if ln.startswith(job + " ")}
    assert sorted(rows) == sorted(f"c{c}" for c in POINTS), out
    assert all(r[2] == "ok" and r[3] == str(PROMPTS) for r in rows.values()), out
    js = json.loads(hs("report", job, "--json").stdout)
    got = {r["point"]: r for r in js["rows"]}
    # per node and per GPU: 2 nodes of 8 (nominal) GPUs
    tput = got["c4"]["output_tok_s"]
    assert got["c4"]["output_tok_s_per_node"] == pytest.approx(tput / 2)
    assert got["c4"]["output_tok_s_per_gpu"] == pytest.approx(tput / 16)
    for name in ("throughput.png", "latency.png"):
        w, h = _png_size(tmp_path / "r" / name)
        assert (w, h) == (700, 450)
    # the job's start-up in phases (state.json) is drawn too: one bar, so a low figure
    w, h = _png_size(tmp_path / "r" / "startup.png")
    assert w == 700 and 100 < h < 450, (w, h)
    _plot_points_are_the_results(tmp_path / "r", got)
    page = tmp_path / "r" / "report.html"
    dom, shot = _chromium(page, tmp_path)
    assert "<table id=\"results\">" in dom and dom.count("data:image/png;base64,") == 3
    for c in POINTS:
        assert f"<td>c{c}</td>" in dom
    assert _png_size(shot) == (1000, 1400) and shot.stat().st_size > 20_000


def _plot_points_are_the_results(out: Path, rows: dict) -> None:
    """The throughput figure, read back from its SVG twin: its axes and title, and one marker
    per point of the table, left to right by concurrency, higher where the throughput is."""
    import xml.etree.ElementTree as ET
    svg = ET.parse(out / "throughput.svg").getroot()
    texts = {t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")}
    assert {"concurrency (requests in flight)", "output tokens/s per GPU",
            "Throughput against concurrency"} <= texts, texts
    (line,) = [g for g in svg.iter("{http://www.w3.org/2000/svg}g")
               if g.get("id") == "throughput-0"]
    marks = [(float(u.get("x")), float(u.get("y")))
             for u in line.iter("{http://www.w3.org/2000/svg}use")]
    assert len(marks) == len(POINTS) and marks == sorted(marks), marks
    ys = [rows[f"c{c}"]["output_tok_s_per_gpu"] for c in POINTS]
    # SVG's y grows downwards: the higher throughput is drawn higher up
    assert (marks[1][1] < marks[0][1]) == (ys[1] > ys[0]), (marks, ys)


def _chromium(page: Path, tmp_path: Path) -> tuple[str, Path]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "chromium is installed by scripts/setup.sh"
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'chrome'}"]
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    shot = tmp_path / "page.png"
    subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1000,1400", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    return dom, shot


def _bench_log(job_dir: Path) -> str:
    (run,) = sorted((job_dir / "bench-runs").iterdir())[-1:]
    return (run / "bench.log").read_text()


def test_hpcserve_bench_as_a_job_of_its_own_brings_the_verdict_back(passed_job):
    """submitit submits the benchmark function as a one-node job beside the deployment and
    brings its return value (the gate's verdict, computed on the cluster) back to the command."""
    hs, job, job_dir = passed_job
    before = set((job_dir / "bench-runs").iterdir()) if (job_dir / "bench-runs").exists() else set()
    v = json.loads(hs("bench", job, "-c", "2", "--rate", "50,100", "--prompts", "4",
                      "--json").stdout)
    assert v["passed"] and [p["label"] for p in v["points"]] == ["c2-r50", "c2-r100"], v
    assert all((p["completed"], p["output_tokens"]) == (4, 4 * OUT) for p in v["points"]), v
    (run,) = set((job_dir / "bench-runs").iterdir()) - before
    assert [json.loads((run / f"c2-r{r}.json").read_text())["request_rate"]
            for r in (50, 100)] == [50.0, 100.0]  # the rates reached vLLM's client
    log = (run / "bench.log").read_text()
    bench_job = log.split("Slurm job ")[1].split()[0]
    assert bench_job != job and bench_job.isdigit(), log  # a job of its own
    # submitit's own files: the batch script it wrote and the pickled result it brought back
    sub = run / "submitit"
    assert (sub / f"{bench_job}_submission.sh").is_file()
    assert (sub / f"{bench_job}_0_result.pkl").is_file()
    assert read_state(job_dir)["phase"] == "serving"  # the deployment went on serving


def test_hpcserve_bench_over_ssh_runs_as_a_step_of_the_allocation(passed_job, dev_cluster,
                                                                  tmp_path_factory):
    """From this machine's hpcserve, over SSH to the login node as the job's user."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ssh"))
    from sshkit import keygen, start_sshd, stop
    hs, job, job_dir = passed_job
    d = tmp_path_factory.mktemp("bench-ssh")
    hand_over(d)   # sshd reads the user's authorized_keys as that user
    keys = {n: keygen(d / f"{n}_ed25519") for n in ("user", "other", "impostor")}
    s = start_sshd(d, "login", keys, f"SetEnv SLURM_CONF={dev_cluster.conf_path}\n"
                                    "AllowTcpForwarding no", user=OWNER)
    try:
        env = {k: v for k, v in hs.env.items() if k != "SLURM_CONF"}  # only the login node knows
        p = subprocess.run([str(Path(sys.executable).parent / "hpcserve"),
                            "--remote", s.target, "-i", str(s.user_key),
                            "--known-hosts", str(s.known_hosts),
                            "bench", job, "--in-allocation", "-c", "2", "--prompts", "4"],
                           env=env, capture_output=True, text=True, timeout=300)
    finally:
        stop(s.proc)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[0].startswith("c2: ok, 4/4 requests, 48 output tokens"), p.stdout
    assert p.stdout.splitlines()[-1] == "benchmark passed"
    log = _bench_log(job_dir)
    # a step of the deployment's own job, on its first instance's leader node
    node = (job_dir / "run" / "prefill-0.nodes").read_text().split()[1]
    assert f"hpcserve-bench: Slurm job {job} step " in log and f" on {node}, " in log, log
