"""Self-checks of the engine-parser harness and of the SGLang flag matrix.

* marked ``engine_parser`` (need the engines venv, built by the `sglang_parser` fixture):
  the reference PD command lines (shared/reference/engines.md A.9) parse under the real
  SGLang 0.5.23 parser with the values we meant; removed flags are refused; and the committed
  ``hpcserve/engines/data/sglang_flags.json`` entry for that version equals the real parser's
  option strings, deprecations and choices -- as does the static extractor run over the installed
  package -- so neither the data file nor the tool can drift from the engine.
* unmarked: facts of the version matrix (engines.md A.3/A.4), checked on the data file alone.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLAGS_JSON = REPO / "hpcserve" / "engines" / "data" / "sglang_flags.json"
EXTRACTOR = REPO / "tools" / "extract_sglang_flags.py"
REAL_VERSION = "0.5.23"  # what scripts/setup-engines.sh installs

P0, D0 = "10.1.0.1", "10.1.1.1"

# engines.md A.9, verbatim apart from the shell placeholders.
PREFILL = r"""
python3 -m sglang.launch_server \
  --model-path /models/DeepSeek-V3 --served-model-name deepseek-v3 --trust-remote-code \
  --host 0.0.0.0 --port 30000 \
  --disaggregation-mode prefill \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-bootstrap-port 8998 \
  --disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  --dist-init-addr ${P0}:5757 --nnodes 2 --node-rank ${r} \
  --tp-size 16 --attn-dp-size 16 \
  --moe-a2a-backend deepep --deepep-mode normal \
  --mem-fraction-static 0.8 --disable-radix-cache
"""
DECODE = r"""
python3 -m sglang.launch_server \
  --model-path /models/DeepSeek-V3 --served-model-name deepseek-v3 --trust-remote-code \
  --host 0.0.0.0 --port 30001 \
  --disaggregation-mode decode \
  --disaggregation-transfer-backend mooncake \
  --disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7 \
  --dist-init-addr ${D0}:5757 --nnodes 2 --node-rank ${r} \
  --tp-size 16 --attn-dp-size 16 \
  --moe-a2a-backend deepep --deepep-mode low_latency \
  --mem-fraction-static 0.8 --max-running-requests 128 \
  --cuda-graph-max-bs-decode 64
"""
IB = "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7"


def server_argv(cmd: str, rank: int) -> list[str]:
    text = cmd.replace("${P0}", P0).replace("${D0}", D0).replace("${r}", str(rank))
    argv = shlex.split(text.replace("\\\n", " "))  # backslash-newline: a shell line continuation
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    return argv[3:]


def load_matrix() -> dict:
    return json.loads(FLAGS_JSON.read_text())["versions"]


# ---------------------------------------------------------------------------------------------
# Real parser (engines venv)
# ---------------------------------------------------------------------------------------------


@pytest.mark.engine_parser
def test_real_parser_is_the_pinned_version(sglang_parser):
    assert sglang_parser.version == REAL_VERSION


@pytest.mark.engine_parser
def test_reference_pd_command_lines_parse(sglang_parser):
    argvs = [server_argv(PREFILL, r) for r in (0, 1)] + [server_argv(DECODE, r) for r in (0, 1)]
    results = sglang_parser(argvs)
    for argv, res in zip(argvs, results):
        assert res["ok"], (argv, res)
        assert res["server_ok"], (argv, res)
        assert res["warnings"] == [], res["warnings"]  # nothing deprecated in the reference lines

    common = {
        "model_path": "/models/DeepSeek-V3", "served_model_name": "deepseek-v3",
        "trust_remote_code": True, "host": "0.0.0.0", "nnodes": 2, "tp_size": 16,
        "attn_dp_size": 16, "dp_size": 1, "enable_dp_attention": False,
        "moe_a2a_backend": "deepep", "disaggregation_transfer_backend": "mooncake",
        "disaggregation_bootstrap_port": 8998, "disaggregation_ib_device": IB,
        "mem_fraction_static": 0.8,
    }
    for rank, res in enumerate(results[:2]):
        want = {**common, "port": 30000, "disaggregation_mode": "prefill", "deepep_mode": "normal",
                "dist_init_addr": f"{P0}:5757", "node_rank": rank, "disable_radix_cache": True,
                "max_running_requests": None, "cuda_graph_max_bs_decode": None}
        assert {k: res["values"][k] for k in want} == want
    for rank, res in enumerate(results[2:]):
        want = {**common, "port": 30001, "disaggregation_mode": "decode",
                "deepep_mode": "low_latency", "dist_init_addr": f"{D0}:5757", "node_rank": rank,
                "disable_radix_cache": False, "max_running_requests": 128,
                "cuda_graph_max_bs_decode": 64}
        assert {k: res["values"][k] for k in want} == want


@pytest.mark.engine_parser
def test_removed_and_ambiguous_flags_are_refused(sglang_parser):
    base = ["--model-path", "/models/m"]
    cases = [
        ["--enable-deepep-moe"],
        ["--cuda-graph-max-bs", "128"],
        ["--disaggregation-decode-tp", "4"],
        ["--disaggregation-decode-dp", "2"],
        ["--enable-ep-moe"],
    ]
    results = sglang_parser([base + c for c in cases])
    for case, res in zip(cases, results):
        assert not res["ok"], (case, res)
        assert res["error"] == f"unrecognized arguments: {' '.join(case)}", res
        assert not res["server_ok"], (case, res)
    # The real server allows abbreviations, so the removed --cuda-graph-max-bs is a prefix of two
    # new flags there (engines.md A.4); the strict parser calls it unknown.
    assert results[1]["server_error"] == (
        "ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )
    assert results[0]["server_error"] == "unrecognized arguments: --enable-deepep-moe"


@pytest.mark.engine_parser
def test_strictness_choices_and_deprecations(sglang_parser):
    base = ["--model-path", "/models/m"]
    abbrev, bad_choice, old_dp, eq_form = sglang_parser([
        base + ["--tp", "16"],
        base + ["--moe-a2a-backend", "deepep_ll"],
        base + ["--tp-size", "16", "--dp-size", "16", "--enable-dp-attention"],
        base + ["--tensor-parallel-size=8", "--nccl-init-addr=10.0.0.1:5000", "--ep", "8"],
    ])
    # An abbreviation only works because the server leaves allow_abbrev on: never emit one.
    assert not abbrev["ok"] and abbrev["server_ok"]
    assert abbrev["error"] == "unrecognized arguments: --tp 16"
    assert not bad_choice["ok"] and "invalid choice: 'deepep_ll'" in bad_choice["error"]
    # Pre-0.5.22 DP attention spelling: still parsed, with a deprecation warning.
    assert old_dp["ok"], old_dp
    assert old_dp["values"]["enable_dp_attention"] is True and old_dp["values"]["dp_size"] == 16
    assert any("--enable-dp-attention" in w and "deprecated" in w for w in old_dp["warnings"])
    # Aliases land on the canonical destinations.
    assert eq_form["ok"], eq_form
    assert eq_form["values"]["tp_size"] == 8
    assert eq_form["values"]["dist_init_addr"] == "10.0.0.1:5000"
    assert eq_form["values"]["ep_size"] == 8


@pytest.mark.engine_parser
def test_flag_data_equals_real_parser(sglang_parser):
    """The committed matrix entry for the real version IS the real parser's surface."""
    real = sglang_parser.list_flags()
    entry = load_matrix()[real["sglang_version"]]
    assert set(entry["flags"]) == set(real["flags"]), (
        f"only in data: {sorted(set(entry['flags']) - set(real['flags']))}; "
        f"only in parser: {sorted(set(real['flags']) - set(entry['flags']))} -- "
        "re-run tools/extract_sglang_flags.py"
    )
    assert entry["flags"] == sorted(entry["flags"])
    assert entry["deprecated"] == real["deprecated"]
    assert entry["choices"] == real["choices"]
    assert entry.get("short_flags", []) == real["short_flags"]


@pytest.mark.engine_parser
def test_static_extractor_equals_real_parser(sglang_parser):
    """The extractor, run over the very package the real parser comes from, gives the same answer."""
    spec = importlib.util.spec_from_file_location("extract_sglang_flags", EXTRACTOR)
    tool = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = tool  # its dataclasses look their module up there
    spec.loader.exec_module(tool)
    site = next((sglang_parser.python.parent.parent / "lib").glob("python3*/site-packages"))
    static = tool.extract(tool.Source(site))
    real = sglang_parser.list_flags()
    assert static["flags"] == real["flags"]
    assert static["deprecated"] == real["deprecated"]
    assert static["choices"] == real["choices"]
    assert static["choices_unresolved"] == {}


# ---------------------------------------------------------------------------------------------
# The matrix itself (data only; engines.md A.3 / A.4)
# ---------------------------------------------------------------------------------------------

EXPECTED_VERSIONS = [
    "0.4.6.post5", "0.4.9.post6", "0.4.10.post2", "0.5.2", "0.5.4.post3", "0.5.6.post2", "0.5.9",
    "0.5.12.post1", "0.5.16", "0.5.20", "0.5.21", "0.5.22", "0.5.23",
]


def status(matrix: dict, version: str, flag: str) -> str:
    e = matrix[version]
    return "deprecated" if flag in e["deprecated"] else "ok" if flag in e["flags"] else "absent"


def test_matrix_shape():
    doc = json.loads(FLAGS_JSON.read_text())
    assert doc["generated_by"] == "tools/extract_sglang_flags.py"
    assert list(doc["versions"]) == EXPECTED_VERSIONS
    for v, e in doc["versions"].items():
        assert e["flags"] == sorted(set(e["flags"])), v
        assert set(e["deprecated"]) <= set(e["flags"]), v
        assert set(e["choices"]) <= set(e["flags"]), v
        assert all(f.startswith("--") for f in e["flags"]), v
        assert "choices_unresolved" not in e, (v, e.get("choices_unresolved"))
        for opt in ("--disaggregation-mode", "--disaggregation-transfer-backend",
                    "--load-balance-method", "--tool-call-parser", "--reasoning-parser",
                    "--deepep-mode"):
            assert opt in e["choices"], (v, opt)


@pytest.mark.parametrize(
    "flag, expected",
    [
        # --enable-deepep-moe: primary <=0.4.9, "(Deprecated)" 0.4.10-0.5.2, gone by 0.5.4.post3
        ("--enable-deepep-moe", {"0.4.6.post5": "ok", "0.4.9.post6": "ok", "0.4.10.post2": "deprecated",
                                 "0.5.2": "deprecated", "0.5.4.post3": "absent", "0.5.23": "absent"}),
        ("--enable-ep-moe", {"0.5.2": "deprecated", "0.5.4.post3": "absent"}),
        # --moe-a2a-backend first in 0.4.10
        ("--moe-a2a-backend", {"0.4.9.post6": "absent", "0.4.10.post2": "ok", "0.5.23": "ok"}),
        # DP attention: normal up to 0.5.21, deprecated from 0.5.22 in favour of --attn-dp-size
        ("--enable-dp-attention", {"0.5.21": "ok", "0.5.22": "deprecated", "0.5.23": "deprecated"}),
        ("--attn-dp-size", {"0.5.21": "absent", "0.5.22": "ok", "0.5.23": "ok"}),
        # cuda graph batch sizes: normal <=0.5.12, deprecated alias 0.5.16, removed by 0.5.20
        ("--cuda-graph-max-bs", {"0.5.12.post1": "ok", "0.5.16": "deprecated", "0.5.20": "absent",
                                 "0.5.23": "absent"}),
        ("--cuda-graph-bs", {"0.5.12.post1": "ok", "0.5.16": "deprecated", "0.5.20": "absent"}),
        ("--cuda-graph-max-bs-decode", {"0.5.12.post1": "absent", "0.5.16": "ok", "0.5.20": "ok"}),
        ("--disable-cuda-graph", {"0.5.12.post1": "ok", "0.5.23": "deprecated"}),
        # PD decode-side overrides: 0.4.9 .. 0.5.9 only
        ("--disaggregation-decode-tp", {"0.4.6.post5": "absent", "0.4.9.post6": "ok", "0.5.9": "ok",
                                        "0.5.12.post1": "absent", "0.5.23": "absent"}),
        ("--disaggregation-decode-dp", {"0.4.9.post6": "ok", "0.5.9": "ok", "0.5.12.post1": "absent"}),
        ("--disaggregation-prefill-pp", {"0.4.9.post6": "ok", "0.5.9": "ok", "0.5.12.post1": "absent"}),
        ("--enable-expert-distribution-metrics", {"0.5.16": "ok", "0.5.20": "absent"}),
        ("--enable-nan-detection", {"0.5.16": "absent", "0.5.23": "absent"}),
        ("--grpc-mode", {"0.5.23": "deprecated"}),
        ("--enable-two-batch-overlap", {"0.4.6.post5": "absent", "0.4.9.post6": "ok", "0.5.23": "ok"}),
        ("--disable-shared-experts-fusion", {"0.4.6.post5": "absent", "0.4.9.post6": "ok", "0.5.23": "ok"}),
        ("--eplb-algorithm", {"0.5.23": "ok"}),
        ("--moe-dense-tp-size", {"0.5.23": "ok"}),
        ("--enable-dp-lm-head", {"0.5.23": "ok"}),
    ],
)
def test_matrix_facts(flag, expected):
    matrix = load_matrix()
    assert {v: status(matrix, v, flag) for v in expected} == expected


def test_matrix_choices_facts():
    m = load_matrix()
    assert m["0.4.10.post2"]["choices"]["--moe-a2a-backend"] == ["deepep"]
    assert set(m["0.5.23"]["choices"]["--moe-a2a-backend"]) == {
        "none", "deepep", "mooncake", "nixl", "mori", "ascend_fuseep", "flashinfer", "megamoe",
        "deepep_v2", "pplx", "ascend_tp", "flashinfer_megamoe"}
    assert m["0.5.23"]["choices"]["--deepep-mode"] == ["auto", "low_latency", "normal"]
    assert m["0.5.23"]["choices"]["--disaggregation-mode"] == ["decode", "null", "prefill"]
    assert set(m["0.5.23"]["choices"]["--disaggregation-transfer-backend"]) == {
        "mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"}
    assert set(m["0.5.23"]["choices"]["--load-balance-method"]) == {
        "auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"}
    assert {"auto", "kimi_k2"} <= set(m["0.5.23"]["choices"]["--tool-call-parser"])
    assert {"auto", "kimi_k2", "kimi", "kimi_k3"} <= set(m["0.5.23"]["choices"]["--reasoning-parser"])
    aliases = {"--tensor-parallel-size", "--data-parallel-size", "--attention-data-parallel-size",
               "--expert-parallel-size", "--ep", "--nccl-init-addr", "--model"}
    assert aliases <= set(m["0.5.23"]["flags"])
