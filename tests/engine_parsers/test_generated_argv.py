"""Every engine command hpcserve generates for SGLang (and for KTransformers, which runs in it) is
accepted by SGLang 0.5.23's own parser, per rank, and every router command by sglang-router's own
parser, with the values the plan meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcserve.author import config, plan
from hpcserve.author.words import show

pytestmark = pytest.mark.engine_parser

ROOT = Path(__file__).resolve().parents[2]
# KTransformers' current way is SGLang with --kt-* flags: the same parser checks it.
EXAMPLES = [p for p in sorted((ROOT / "examples").glob("*.yaml"))
            if config.load(p).deployment.engine.name in ("sglang", "ktransformers")] + [
    ROOT / "bench" / "synthetic-1024.yaml"]


def _argvs(p) -> list[tuple[str, int, list[str], dict]]:
    out = []
    for inst in p.instances:
        for rank in range(inst.nodes):
            vals = {"NODE_RANK": str(rank), "NODE_IP": f"10.0.{inst.component}.{inst.node_offset + rank + 1}",
                    "LEADER_IP": f"10.0.{inst.component}.{inst.node_offset + 1}",
                    "IB_DEVICES": "mlx5_0,mlx5_1", "NODE_IFACE": "ib0"}
            out.append((inst.name, rank, [show(w, vals) for w in inst.argv], vals))
    return out


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_rank_parses_with_sglangs_own_parser(sglang_parser, example):
    p = plan.build(config.load(example))
    assert p.version == sglang_parser.version
    cases = _argvs(p)
    results = sglang_parser([argv for _, _, argv, _ in cases])
    for (name, rank, argv, vals), res in zip(cases, results):
        assert res["ok"] and res["server_ok"], (name, rank, res, argv)
        assert not res.get("warnings"), (name, res["warnings"])  # no deprecated spelling
        v = res["values"]
        inst = next(i for i in p.instances if i.name == name)
        assert v["tp_size"] == inst.size("tp")
        assert v["host"] == vals["NODE_IP"]
        assert v["port"] == inst.port
        if inst.nodes > 1:
            assert (v["nnodes"], v["node_rank"]) == (inst.nodes, rank)
            assert v["dist_init_addr"] == f"{vals['LEADER_IP']}:{inst.port_of('dist_init')}"
        if inst.role in ("prefill", "decode"):
            assert v["disaggregation_mode"] == inst.role
        if inst.size("attn_dp"):
            assert v["attn_dp_size"] == inst.size("attn_dp")


def test_kimi_4p12d_values_match_the_seed(sglang_parser):
    p = plan.build(config.load(ROOT / "examples" / "kimi-k2-instruct-4p12d.yaml"))
    (pre, dec) = sglang_parser([_argvs(p)[0][2], _argvs(p)[4][2]])
    assert pre["values"]["moe_a2a_backend"] == dec["values"]["moe_a2a_backend"] == "deepep"
    assert (pre["values"]["tp_size"], dec["values"]["tp_size"]) == (32, 96)
    assert (pre["values"]["attn_dp_size"], dec["values"]["attn_dp_size"]) == (32, 96)
    assert dec["values"]["disaggregation_mode"] == "decode"


def test_prefetch_checkpoints_reaches_sglangs_parser(sglang_parser):
    """The fast-load setting of the TP 16 example (its weights on Lustre), as SGLang reads it;
    every release hpcserve accepts has the flag (0.5.12.post1 added it)."""
    p = plan.build(config.load(ROOT / "examples" / "kimi-k2-instruct-tp16.yaml"))
    (res,) = sglang_parser([_argvs(p)[0][2]], keys=["weight_loader_prefetch_checkpoints"])
    assert res["ok"] and res["values"]["weight_loader_prefetch_checkpoints"] is True, res


def test_ktransformers_cpu_side_reaches_sglangs_parser(sglang_parser):
    """The CPU plan of the KTransformers example, as SGLang reads it: the node's 112 physical
    cores minus 8 GPUs, one thread pool per NUMA node."""
    p = plan.build(config.load(ROOT / "examples" / "kimi-k2-thinking-ktransformers.yaml"))
    (res,) = sglang_parser([_argvs(p)[0][2]])
    assert res["ok"], res
    v = res["values"]
    assert (v["kt_cpuinfer"], v["kt_threadpool_count"]) == (104, 2)
    assert (v["kt_method"], v["kt_num_gpu_experts"]) == ("AMXINT4", 200)
    assert v["kt_weight_path"] == "/lustre/models/Kimi-K2-Thinking-CPU-weight"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_router_command_parses_with_sglang_routers_own_parser(example):
    from sglang_router.launch_router import parse_router_args

    p = plan.build(config.load(example))
    vals = {f"{i.role.upper()}_{i.index}_IP": f"10.1.0.{n + 1}" for n, i in enumerate(p.instances)}
    vals["ROUTER_IP"] = "10.1.0.99"  # its node's address, as endpoints.env says it
    args = parse_router_args([show(w, vals) for w in p.router.argv])
    assert args.port == p.router.port and args.prometheus_port == p.router.prometheus_port
    assert args.host == args.prometheus_host == "10.1.0.99"  # that address alone, not 0.0.0.0
    if p.pd:
        prefill = [i for i in p.instances if i.role == "prefill"]
        assert args.pd_disaggregation
        assert [tuple(x) for x in args.prefill_urls] == [
            (f"http://{vals['PREFILL_%d_IP' % i.index]}:{i.port}", i.port_of("bootstrap")) for i in prefill]
        assert args.decode_urls == [f"http://{vals['DECODE_%d_IP' % i.index]}:{i.port}"
                                    for i in p.instances if i.role == "decode"]
    else:
        assert args.worker_urls == [f"http://{vals['WORKER_%d_IP' % i.index]}:{i.port}"
                                    for i in p.instances]
