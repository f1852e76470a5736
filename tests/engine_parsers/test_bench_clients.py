"""SGLang's benchmark client takes the argv hpcserve renders for it: each point of the 4P12D
example's sweep parsed by bench_serving's own parser (cli_main, from SGLang 0.5.23's source in
the engines venv, run up to parse_args; its module cannot be imported beside a CPU torch), and
the values it parsed are the workload asked for. vLLM's client runs for real in
tests/real/test_benchmark.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import engines_venv
from hpcserve.author import config, plan
from hpcserve.author.words import show

ROOT = Path(__file__).resolve().parents[2]
CHECK = Path(__file__).resolve().parent / "sglang_bench_check.py"


@pytest.fixture(scope="module")
def serving_py(sglang_parser) -> Path:  # sglang_parser: the engines venv is built
    (p,) = engines_venv().glob("lib/python3*/site-packages/sglang/benchmark/serving.py")
    return p


def parse(serving_py: Path, argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, str(CHECK), str(serving_py)], input=json.dumps(argv),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)


def test_every_point_of_the_4p12d_sweep_parses_as_the_workload_asked(serving_py):
    p = plan.build(config.load(ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml"))
    vals = {"SERVING_URL": "http://10.0.0.1:8000", "BENCH_DIR": "/jobs/k/bench"}
    assert [pt.concurrency for pt, _ in p.benchmark.points] == [480, 1920, 3840]
    for pt, argv in p.benchmark.points:
        r = parse(serving_py, [show(w, vals) for w in argv])
        assert r["ok"], r["error"]
        a = r["args"]
        assert (a["backend"], a["dataset_name"], a["base_url"]) == (
            "sglang-oai", "random-ids", "http://10.0.0.1:8000")
        assert (a["random_input_len"], a["random_output_len"], a["random_range_ratio"]) == (
            2000, 100, 1.0)
        assert (a["max_concurrency"], a["num_prompts"], a["warmup_requests"]) == (
            pt.concurrency, 4 * pt.concurrency, 32)
        assert a["output_file"] == f"/jobs/k/bench/c{pt.concurrency}.json"
        assert a["output_details"] and not a["disable_ignore_eos"] and a["disable_tqdm"]


def test_the_check_refuses_what_sglang_refuses(serving_py):
    r = parse(serving_py, ["--backend", "openai", "--random-range", "1"])
    assert not r["ok"] and "argument --backend: invalid choice: 'openai'" in r["error"]
    r = parse(serving_py, ["--random-range", "1"])  # no abbreviations
    assert not r["ok"] and "unrecognized arguments: --random-range" in r["error"], r
