"""The benchmark gate and the report, on results files as each client writes them: SGLang's
bench_serving (JSON lines, appended; its total_output_tokens is max_tokens unless the server
streams usage, so the retokenized count is read) and vLLM's bench serve (one object, with
`failed`). Each refusal names its reason; nothing is read from a client by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hpcserve.operate import report
from hpcserve.engines.bench_clients import CLIENTS
from hpcserve.runtime import bench
from hpcserve.runtime.spec import Benchmark

OUT = 100


def spec(client: str, labels=("c1", "c4"), prompts=8) -> Benchmark:
    return Benchmark({
        "client": client, "title": CLIENTS[client].title, "dir": "bench",
        "input_tokens": 2000, "output_tokens": OUT, "warmup": 0,
        "points": [{"label": lb, "concurrency": int(lb[1:]), "rate": None,
                    "prompts": prompts, "file": f"{lb}.json"} for lb in labels],
        "keys": CLIENTS[client].keys(), "point_timeout_s": 60,
        "gate": {"min_success": 1.0, "output_tolerance": 0.25}})


def vllm_result(completed=8, failed=0, lens=None, errors=()):
    lens = [OUT] * completed if lens is None else lens
    return {"completed": completed, "failed": failed, "total_output_tokens": sum(lens),
            "output_lens": lens, "errors": list(errors) or [""] * (completed + failed),
            "duration": 2.0, "output_throughput": sum(lens) / 2.0, "request_throughput": 4.0,
            "mean_ttft_ms": 12.0, "median_ttft_ms": 11.0, "p90_ttft_ms": 15.0,
            "p99_ttft_ms": 20.0, "median_tpot_ms": 3.0, "p99_tpot_ms": 4.0}


def write(d: Path, label: str, result, rc=0, lines=False) -> None:
    text = (json.dumps({"completed": 0}) + "\n" + json.dumps(result) + "\n") if lines \
        else json.dumps(result)
    (d / f"{label}.json").write_text(text)
    (d / f"{label}.run.json").write_text(json.dumps({"rc": rc, "start": 1.0, "end": 3.0}))


def test_a_clean_vllm_sweep_passes_with_its_numbers_under_one_set_of_names(tmp_path):
    for lb in ("c1", "c4"):
        write(tmp_path, lb, vllm_result())
    r = bench.evaluate(str(tmp_path), spec("vllm"))
    assert r["passed"] and r["failed"] is None
    p = r["points"][1]
    assert (p["label"], p["completed"], p["failed"], p["output_tokens"], p["verdict"]) == \
        ("c4", 8, 0, 800, "ok")
    assert p["ttft"] == {"mean": 12.0, "median": 11.0, "p90": 15.0, "p99": 20.0}
    assert p["output_throughput"] == 400.0


def test_sglang_results_are_the_last_json_line_and_its_retokenized_count(tmp_path):
    res = {"completed": 8, "total_output_tokens": 800, "total_output_tokens_retokenized": 0,
           "output_lens": [0] * 8, "duration": 1.0, "median_e2e_latency_ms": 9.0}
    write(tmp_path, "c1", res, lines=True)
    r = bench.evaluate(str(tmp_path), spec("sglang", labels=("c1",)))
    p = r["points"][0]
    # max_tokens says 800; what came back was nothing: the gate reads what came back
    assert p["output_tokens"] == 0 and p["e2e"]["median"] == 9.0
    assert r["failed"] == {"point": "c1", "reason": "0 output tokens"}


@pytest.mark.parametrize("result,rc,reason", [
    (vllm_result(completed=0, failed=8, lens=[], errors=["Internal Server Error"] * 8), 0,
     "0 output tokens; 0 of 8 requests succeeded; first error: Internal Server Error"),
    (vllm_result(completed=6, failed=2, errors=["", "timeout"]), 0,
     "6 of 8 requests succeeded; first error: timeout"),
    (vllm_result(lens=[10] * 8), 0, "mean output 10.0 tokens of the 100 asked"),
    (vllm_result(), 3, "the client exited with code 3"),
])
def test_the_gate_names_why_a_point_proves_nothing(tmp_path, result, rc, reason):
    write(tmp_path, "c1", result, rc=rc)
    r = bench.evaluate(str(tmp_path), spec("vllm", labels=("c1",)))
    assert not r["passed"] and r["failed"] == {"point": "c1", "reason": reason}


def test_a_client_that_wrote_nothing_fails_and_the_points_after_it_did_not_run(tmp_path):
    (tmp_path / "c1.run.json").write_text(json.dumps({"rc": 1, "start": 1, "end": 2}))
    r = bench.evaluate(str(tmp_path), spec("vllm"))
    assert r["failed"] == {"point": "c1",
                           "reason": "the client exited with code 1 and wrote no results"}
    assert [p["verdict"] for p in r["points"]] == ["fail", "not run"]


def test_report_rows_are_per_node_and_per_gpu_and_the_plot_draws_them(tmp_path):
    for lb in ("c1", "c4"):
        write(tmp_path, lb, vllm_result())
    b = bench.evaluate(str(tmp_path), spec("vllm"))
    j = report.JobBench("42", "kimi", "SGLang 0.5.23", nodes=16, gpus=128, bench=b)
    rows = report.rows([j])
    assert rows[1]["output_tok_s_per_node"] == 25.0 and rows[1]["output_tok_s_per_gpu"] == 3.125
    text = report.table_text([j])
    assert text.splitlines()[0].startswith("job 42 (kimi): SGLang 0.5.23, 16 node(s), 128 GPU(s)")
    assert "TTFT p50" in text and text.splitlines()[-1].split()[:3] == ["42", "c4", "ok"]
    drawn = report.plot_data(rows)
    assert drawn["throughput"] == [("kimi (42)", [1, 4], [3.125, 3.125])]
    assert [ln[0] for ln in drawn["latency"]] == ["TTFT p50, job 42", "TTFT p99, job 42",
                                                  "TPOT p50, job 42", "TPOT p99, job 42"]
    page = report.write([j], tmp_path / "r").read_text()
    assert page.count("data:image/png;base64,") == 2 and "<td>c4</td>" in page


def listed(monkeypatch, tmp_path: Path, job_id: str, name: str, jd: Path) -> None:
    """The job in hpcserve's own list of deployments (the one `submit` writes), for commands
    run from here on."""
    from hpcserve.operate import deployments
    monkeypatch.setenv("HPCSERVE_STATE_DIR", str(tmp_path / "state"))
    deployments.record(deployments.Entry(job_id, name, str(jd)))


def test_bench_and_report_of_a_job_that_is_not_serving_say_so_in_one_line(tmp_path,
                                                                          monkeypatch):
    jd = tmp_path / "job"
    (jd / "run").mkdir(parents=True)
    (jd / "plan.json").write_text(json.dumps({"name": "x", "instances": [], "components": []}))
    (jd / "state.json").write_text(json.dumps({"phase": "failed"}))
    listed(monkeypatch, tmp_path, "77", "x", jd)
    hs = str(Path(sys.executable).parent / "hpcserve")
    for args, want in ((["bench", "77", "--in-allocation"],
                        "hpcserve: error: job 77 is not serving (phase: failed): nothing to "
                        "benchmark\n"),
                       (["report", "77"], f"hpcserve: error: job 77 ({jd}): it has no "
                                          "benchmark results (no benchmark: in its deployment, "
                                          "or it ended before the benchmark)\n")):
        p = subprocess.run([hs, *args], capture_output=True, text=True, timeout=60)
        assert (p.returncode, p.stderr, p.stdout) == (2, want, ""), p
    assert not (jd / "bench-runs").exists()


def test_two_jobs_side_by_side_one_line_each(tmp_path):
    jobs = []
    for jid, nodes, lens in (("42", 16, [OUT] * 8), ("43", 4, [OUT // 2 - 1] * 8)):
        d = tmp_path / jid
        d.mkdir()
        for lb in ("c1", "c4"):
            write(d, lb, vllm_result(lens=lens))
        jobs.append(report.JobBench(jid, f"kimi-{jid}", "vLLM 0.33.0", nodes=nodes, gpus=8 * nodes,
                                    bench=bench.evaluate(str(d), spec("vllm"))))
    text = report.table_text(jobs)
    assert [ln.split()[:3] for ln in text.splitlines() if ln[:2] in ("42", "43")] == [
        ["42", "c1", "ok"], ["42", "c4", "ok"], ["43", "c1", "fail"], ["43", "c4", "fail"],
        ["43", "c1:", "mean"], ["43", "c4:", "mean"]]  # the rows, then each failure's reason
    assert "job 43 (kimi-43): vLLM 0.33.0, 4 node(s), 32 GPU(s)" in text and "FAILED" in text
    assert text.splitlines()[-2] == "43 c1: mean output 49.0 tokens of the 100 asked"
    drawn = report.plot_data(report.rows(jobs))
    assert [ln[0] for ln in drawn["throughput"]] == ["kimi-42 (42)", "kimi-43 (43)"]
    assert report.as_json(jobs)["jobs"][1]["failed"] == {
        "point": "c1", "reason": "mean output 49.0 tokens of the 100 asked"}
