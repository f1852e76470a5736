"""The start-up phases (hpcserve/runtime/startup.py): each engine adapter's patterns against lines
as each pinned release's own source prints them, and the phases a log's lines give."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from hpcserve.engines import get as engine
from hpcserve.operate.ops import View, startup_line
from hpcserve.runtime.startup import EngineLog, Startup, phases_between


def _lines(name: str, version: str) -> dict:
    a = engine(name)
    return a.startup_lines(a.release(version))


# Lines as the releases print them, formatted from the source's own format strings.
VLLM_032 = [
    # vllm/model_executor/model_loader/default_loader.py, vLLM 0.32.0:
    # logger.info_once("Loading weights took %.2f seconds", ...)
    ("weights_loaded", "(EngineCore pid=812) INFO 11-26 02:47:02 [default_loader.py:502] "
                       "Loading weights took 41.07 seconds"),
    # vllm/v1/worker/gpu_model_runner.py, vLLM 0.32.0:
    # "Model loading took %s GiB memory and %.6f seconds"
    ("weights_loaded", "(Worker_TP0 pid=9) INFO 11-26 02:47:03 [gpu_model_runner.py:5150] "
                       "Model loading took 63.42 GiB memory and 43.912345 seconds"),
    # vllm/entrypoints/launchers/api_server/entry.py, vLLM 0.32.0:
    # logger.info("Starting vLLM server on %s", listen_address)
    ("ready", "(APIServer pid=1) INFO 11-26 02:49:10 [entry.py:140] Starting vLLM server on "
              "http://10.0.0.5:8000"),
]
SGLANG = [
    # sglang/srt/model_executor/model_runner.py, SGLang 0.5.23 (0.5.9 and 0.4.6.post5 print the
    # same start without elapsed=): f"Load weight end. elapsed={...:.2f} s, type=..., ..."
    ("weights_loaded", "[2026-11-26 02:47:14 TP0] Load weight end. elapsed=93.30 s, "
                       "type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=13.43 GB, "
                       "mem usage=47.06 GB."),
    ("weights_loaded", "[2026-11-26 02:47:14 TP0] Load weight end. type=DeepseekV3ForCausalLM, "
                       "dtype=torch.bfloat16, avail mem=13.43 GB, mem usage=47.06 GB."),
    # sglang/srt/entrypoints/http_server.py, SGLang 0.4.6.post5 to 0.5.23:
    # logger.info("The server is fired up and ready to roll!")
    ("ready", "[2026-11-26 02:49:01] The server is fired up and ready to roll!"),
]
# Lines near them that mark something else: none may be taken for a start-up line.
OTHERS = [
    "INFO 11-26 02:46:30 [base_loader.py:84] Initializing model took 0.012345 seconds",
    "[2026-11-26 02:46:20 TP0] Load weight begin. avail mem=78.00 GB",
    "INFO 11-26 02:47:40 [core.py:403] init engine (profile, create kv cache, warmup model) "
    "took 20.10 s",
    "[2026-11-26 02:48:55] INFO:     Uvicorn running on http://10.0.0.5:30000",
]


@pytest.mark.parametrize("engine,version,cases", [
    ("vllm", "0.32.0", VLLM_032), ("vllm", "0.33.0", VLLM_032), ("sglang", "0.5.23", SGLANG),
    ("sglang", "0.5.20", SGLANG), ("ktransformers", "0.5.23", SGLANG)])
def test_each_pattern_matches_its_release_line_and_no_other(engine, version, cases):
    pats = _lines(engine, version)
    for key, line in cases:
        assert re.search(pats[key], line), (key, line)
        other = [k for k in pats if k != key]
        assert not any(re.search(pats[k], line) for k in other), line
    for line in OTHERS:
        assert not any(re.search(p, line) for p in pats.values()), line


@pytest.mark.parametrize("engine,version", [
    ("vllm", "0.31.0"), ("trtllm", "1.3.0rc3"), ("ktransformers_legacy", "0.2.4")])
def test_a_release_whose_lines_were_not_verified_has_none(engine, version):
    assert _lines(engine, version) == {"weights_loaded": None, "ready": None}


def test_the_sim_prints_the_lines_of_the_release_it_stands_in_for(tmp_path):
    """The stand-ins' lines, as their format strings write them, match the adapters'."""
    src = engine("sglang").sim_source().read_text()
    assert 'f"Load weight end. elapsed={s:.2f} s' in src
    assert re.search(_lines("sglang", "0.5.23")["weights_loaded"],
                     "Load weight end. elapsed=0.30 s, type=SimulatedModel, avail mem=0.00 GB")
    src = engine("vllm").sim_source().read_text()
    assert 'f"Loading weights took {s:.2f} seconds"' in src


def _log(tmp_path, patterns, lines_at):
    """An EngineLog fed `lines_at` [(time, line)], healthy at the last time."""
    path = tmp_path / "engine.log"
    path.write_text("an earlier try's Load weight end. line\n")  # read from where this try began
    log = EngineLog(str(path), patterns, started=100.0)
    for at, line in lines_at:
        with open(path, "a") as f:
            f.write(line)
        log.scan(at)
    return log


def test_an_instances_phases_split_at_its_lines_and_sum_to_its_start_up(tmp_path):
    pats = _lines("sglang", "0.5.23")
    log = _log(tmp_path, pats, [(101.0, "starting\n[..] Load weight"),  # half a line: not yet
                                (104.5, " end. elapsed=4 s\n"),
                                (107.0, "The server is fired up and ready to roll!\n")])
    log.healthy = 107.25
    rec = log.record()
    assert rec["phases"] == {"engine_load": 4.5, "engine_warmup": 2.5, "health_wait": 0.25}
    assert rec["total_s"] == 7.25 and rec["unknown_s"] == 0
    assert rec["lines_seen"] == ["ready", "weights_loaded"]


def test_a_line_that_never_came_makes_its_phases_unknown_not_guessed(tmp_path):
    # vLLM's dummy loader prints no weights line: load and warm-up are one unknown stretch
    log = _log(tmp_path, _lines("vllm", "0.32.0"),
               [(103.0, "INFO [entry.py:140] Starting vLLM server on http://h:1\n")])
    log.healthy = 103.5
    rec = log.record()
    assert rec["phases"] == {"engine_load": None, "engine_warmup": None, "health_wait": 0.5}
    assert rec["unknown_s"] == 3.0
    assert sum(v for v in rec["phases"].values() if v) + rec["unknown_s"] == rec["total_s"]


def test_a_release_without_lines_has_its_whole_engine_start_unknown(tmp_path):
    log = _log(tmp_path, _lines("trtllm", "1.3.0rc3"), [(102.0, "Application startup\n")])
    log.healthy = 109.0
    rec = log.record()
    assert rec["phases"] == {"engine_load": None, "engine_warmup": None}
    assert rec["unknown_s"] == rec["total_s"] == 9.0


def test_phases_partition_the_time_between_marks():
    phases, unknown = phases_between(0.0, [("a", 1.0), ("b", None), ("c", 3.5), ("d", 4.0)])
    assert phases == {"a": 1.0, "b": None, "c": None, "d": 0.5} and unknown == 2.5


def test_the_deployments_phases_take_the_engines_of_the_instance_ready_last(tmp_path):
    job = SimpleNamespace(t0=0.0, dir=str(tmp_path), plan={}, job_id="")
    su = Startup(job)
    su.marks = [("job_setup", 1.0), ("preflight", 3.0), ("engines", 20.0),
                ("router_registration", 21.0), ("smoke_request", 22.0)]
    fast, slow = EngineLog(str(tmp_path / "a"), {}, 3.1), EngineLog(str(tmp_path / "b"), {}, 3.2)
    fast.seen, fast.healthy = {"weights_loaded": 8.0}, 10.0
    slow.seen, slow.healthy = {"weights_loaded": 15.0}, 19.9
    for name, log in (("prefill-0", fast), ("decode-0", slow)):
        log.patterns, log.rel = {"weights_loaded": re.compile("x")}, f"logs/{name}.log"
        su.logs[name] = log
    rec = su.record(22.5)
    assert rec["phases"] == {"job_setup": 1.0, "preflight": 2.0, "engine_load": 12.0,
                             "engine_warmup": 5.0, "router_registration": 1.0,
                             "smoke_request": 1.5}
    assert sum(rec["phases"].values()) == rec["total_s"] == 22.5
    assert rec["slowest"] == {"instance": "decode-0", "total_s": 16.7, "phase": "engine_load",
                              "phase_s": 11.8}


def test_status_shows_the_start_up_once_known():
    v = View("7", "d", "/j", None)
    v.state = {}
    assert startup_line(v) is None
    v.state = {"startup": {"total_s": 95.0, "queue_wait_s": 4.0, "slowest": {
        "instance": "decode-1", "total_s": 80.2, "phase": "engine_load", "phase_s": 61.3}}}
    assert startup_line(v) == ("  start-up 95 s (after 4.0 s in the queue); slowest instance "
                               "decode-1 80 s, most in engine_load 61 s")


def test_the_report_draws_the_start_up_beside_the_throughput(tmp_path):
    """startup.png/svg where a job has phases: a segment per known phase and the unknown time,
    each as long as its seconds; a job without phases draws no start-up chart."""
    import xml.etree.ElementTree as ET

    from hpcserve.operate import report
    su = {"total_s": 10.0, "unknown_s": 3.0, "phases": {
        "job_setup": 1.0, "preflight": 2.0, "engine_load": None, "engine_warmup": None,
        "router_registration": 4.0}}
    bench = {"points": [], "passed": True}
    j = report.JobBench("42", "kimi", "vLLM 0.32.0", nodes=1, gpus=1, bench=bench, startup=su)
    assert report._startup_plot([report.JobBench("7", "k", "v", 1, 1, bench)], tmp_path,
                                None) == []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    assert report._startup_plot([j], tmp_path, plt) == [tmp_path / "startup.png"]
    svg = ET.parse(tmp_path / "startup.svg").getroot()
    ns = {"s": "http://www.w3.org/2000/svg"}
    widths = {}
    for g in svg.iterfind(".//s:g[@id]", ns):
        if g.get("id").startswith("startup-42-"):
            d = g.find(".//s:path", ns).get("d").split()
            xs = [float(t) for t in d if t.replace(".", "").replace("-", "").isdigit()][0::2]
            widths[g.get("id")[len("startup-42-"):]] = max(xs) - min(xs)
    assert set(widths) == {"job_setup", "preflight", "router_registration", "unknown"}
    unit = widths["job_setup"]
    assert [round(widths[k] / unit, 2) for k in ("preflight", "unknown", "router_registration")] \
        == [2.0, 3.0, 4.0]
