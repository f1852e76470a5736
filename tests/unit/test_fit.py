"""The fit report against what the seed guides say of Kimi-K2 and DeepSeek-V3: checkpoint sizes,
the smallest unit for Kimi-K2 FP8 (8 GPUs of at least 140 GB for TP8, 16 GPUs for a 128k
context), the 4P12D decode batch of 480 at 2,000 + 100 tokens; a plan that cannot fit is
refused with its numbers (exit 2), a tight one warned about, every figure in `hpcserve plan`."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcserve.author import fit
from hpcserve.author.config import load_profile
from hpcserve.errors import ConfigError
from unitkit import ROOT, load_plan, plan_of, small_site, write_yaml


def arch(name: str):
    return load_profile(name)[0].architecture


@pytest.mark.parametrize("profile, gb", [
    ("kimi-k2-instruct", 1026),   # "about 1 TB" of FP8
    ("kimi-k2-thinking", 593),    # INT4 experts with BF16 group scales: "about 0.6 TB"
    ("deepseek-v3", 671),         # "about 0.7 TB" of FP8
])
def test_checkpoint_sizes(profile, gb):
    assert round(arch(profile).weight_bytes / 1e9) == gb


def test_kimi_experts_and_kv_per_token_from_config_json():
    a = arch("kimi-k2-instruct")
    # 384 experts x 60 MoE layers (first_k_dense_replace 1) x gate/up/down 7168 x 2048
    assert a.expert_parameters == 384 * 60 * 3 * 7168 * 2048
    # MLA: (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes (BF16 KV)
    assert fit.kv_bytes_per_token(a, {"tp": 8}, 2.0) == 576 * 61 * 2 == 70272


def doc(gpu_gb: float, worker: dict, engine: str = "sglang") -> dict:
    return {"name": "t", "site": small_site(node={"gpus": 8, "gpu_memory_gb": gpu_gb}),
            "model": {"profile": "kimi-k2-instruct", "path": "/m"},
            "engine": {"name": engine, "version": "0.5.23" if engine == "sglang" else "0.33.0"},
            "roles": {"worker": worker}}


def test_kimi_fp8_tp8_needs_gpus_of_140_gb(tmp_path):
    # 1026 GB / 8 = 119.4 GiB per GPU: on 80 GiB GPUs it is refused with the numbers ...
    with pytest.raises(ConfigError) as e:
        plan_of(tmp_path, doc(80, {}))
    assert e.value.field == "roles.worker.nodes"
    assert "119.4 GiB per GPU" in e.value.message and "8 x 80 GiB GPUs" in e.value.message
    # ... on H200 (141) it fits, with too little KV cache for one 128k sequence: tight
    p = plan_of(tmp_path, doc(141, {}))
    (f,) = p.fits
    assert round(f.weights_gb, 1) == 119.4 and f.verdict == "tight"
    assert f.tokens < 131072
    assert any("tight fit" in w and "131,072-token sequence" in w for w in p.warnings)


def test_sixteen_gpus_hold_a_128k_context(tmp_path):
    # TP16 over two H200 nodes: 59.7 GiB of weights per GPU, over 128k tokens of KV cache
    p = plan_of(tmp_path, doc(141, {"nodes": 2}))
    (f,) = p.fits
    assert round(f.weights_gb, 1) == 59.7 and f.verdict == "fits" and f.tokens > 131072
    # 16 x H800 (80 GiB): SGLang's own reserve (0.5 + 1.5 x 8192 / 1024 + 16 / 8 = 14.5 GiB)
    # leaves 89k tokens; mem_fraction_static 0.88 leaves the 128k the guide promises
    (f,) = plan_of(tmp_path, doc(80, {"nodes": 2})).fits
    assert f.verdict == "tight" and 85_000 < f.tokens < 131072
    (f,) = plan_of(tmp_path, doc(80, {"nodes": 2, "mem_fraction_static": 0.88})).fits
    assert f.verdict == "fits" and f.tokens > 131072


def test_4p12d_decode_holds_the_seeds_batch_of_480():
    p = load_plan(ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml")
    decode = next(f for f in p.fits if f.role == "decode")
    assert decode.groups == 96 and decode.seq_tokens == 2100
    # --cuda-graph-bs 480 per DP rank at 2,000 + 100 tokens: 1,008,000 tokens per GPU
    assert decode.requests // decode.groups >= 480
    assert decode.budget.how.startswith("mem_fraction_static 0.8 x 141 GiB")


def test_each_engine_has_its_own_memory_rule(tmp_path):
    (v,) = plan_of(tmp_path, doc(141, {"nodes": 2}, engine="vllm")).fits
    assert v.budget.how == "gpu_memory_utilization 0.9 x 141 GiB - weights"
    assert round(v.kv_gb, 1) == round(0.9 * 141 - v.weights_gb, 1)
    t = doc(141, {"nodes": 2}, engine="trtllm")
    t["engine"]["version"] = "1.3.0rc3"
    t["router"] = {"enabled": False}
    (f,) = plan_of(tmp_path, t).fits
    assert round(f.kv_gb, 1) == round(0.9 * (141 - f.weights_gb), 1)
    fp8 = doc(141, {"nodes": 2, "kv_cache_dtype": "fp8"}, engine="vllm")
    (g,) = plan_of(tmp_path, fp8).fits
    assert g.kv_bytes_per_token == v.kv_bytes_per_token / 2


def test_workload_sets_the_request_count(tmp_path):
    d = doc(141, {"nodes": 2})
    d["workload"] = {"input_tokens": 8000, "output_tokens": 2000}
    (f,) = plan_of(tmp_path, d).fits
    assert f.seq_tokens == 10000 and f.requests == f.tokens // 10000


def test_plan_shows_the_fit_and_refuses_one_line(tmp_path):
    cli = [sys.executable, "-c", "from hpcserve.cli import main; main()"]
    out = subprocess.run([*cli, "plan", str(ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "fit (per GPU; tokens and requests per instance, at 2,100 tokens a request):" \
        in out.stdout
    assert "  decode: weights 18.1 GiB of 141 GiB per GPU" in out.stdout
    bad = write_yaml(tmp_path / "k.yaml", doc(80, {}))
    r = subprocess.run([*cli, "plan", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "roles.worker.nodes" in r.stderr
